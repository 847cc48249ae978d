"""Training steps per CPU-second for a small MLP: hand-written torch loop vs accel vs Accelerate.

One step is ``zero_grad``, forward, backward, ``optimizer.step`` and ``scheduler.step`` (no
gradient accumulation). All variants live in ONE process group of ``--world-size`` ranks
(1 = single process, 2 = DDP over gloo), one torch thread per rank, each with its own copy of the
same model, data and optimizer. They run in alternating blocks of ``--steps`` timed steps (the
order rotates every block), so whatever the host does meanwhile hits every variant alike; short
blocks, many of them, keep the variants' conditions close. Each variant draws its batches from
its own loader, epoch after epoch (``--epoch-steps`` batches each), so a block may span an epoch
boundary as in real training. Each block is compared with the hand-written block of the same
round: the median of those per-block ratios is the figure, with the ratio of the totals and the
medians of the raw rates beside it.

    python suites/benchmarks/train_step.py [--world-size 1] [--steps 50] [--blocks 60] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing as mp
import os
import statistics
import sys
import time

FEATURES, HIDDEN, BATCH = 32, 128, 32


def _data(batches: int):
    import torch

    g = torch.Generator().manual_seed(0)
    n = BATCH * batches
    x = torch.randn(n, FEATURES, generator=g)
    y = x.sum(dim=1, keepdim=True)
    return torch.utils.data.TensorDataset(x, y)


def _model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN),
                               torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 1))


def _schedule(opt):
    import torch

    return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)  # a real scheduler step; the rate stays put


def build_variant(variant: str, batches: int, world: int):
    """A ``(step, loader)`` pair: ``step(x, y)`` is one full training step of ``variant``."""
    import torch
    import torch.nn.functional as F

    model, dataset = _model(), _data(batches * world)
    if variant == "torch":
        sampler = None
        if world > 1:
            from torch.nn.parallel import DistributedDataParallel

            model = DistributedDataParallel(model)
            sampler = torch.utils.data.distributed.DistributedSampler(dataset, shuffle=False)
        loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        sched = _schedule(opt)

        def step(x, y):
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            sched.step()

        return step, loader

    if variant == "accel":
        from accel import Accelerator
    else:
        from accelerate import Accelerator
    accelerator = Accelerator(cpu=True)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    sched = _schedule(opt)
    model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)

    def step(x, y):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        accelerator.backward(loss)
        opt.step()
        sched.step()

    return step, loader


def _epochs(loader):
    """The loader's batches, one epoch after another, without end."""
    while True:
        yield from loader


def _block(step_fn, batches, steps: int) -> tuple[float, float, int]:
    """``steps`` steps on the next batches, timed. Returns (cpu seconds, wall seconds, steps)."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(steps):
        x, y = next(batches)
        step_fn(x, y)
    return time.process_time() - cpu0, time.perf_counter() - wall0, steps


def run_blocks(variants: list[str], steps: int, blocks: int, world: int,
               epoch_steps: int) -> list[tuple[int, str, float, float, int]]:
    """Build every variant, warm each up with one untimed epoch, then time ``blocks`` rounds of all of them."""
    built = {}
    for v in variants:
        step, loader = build_variant(v, epoch_steps, world)
        built[v] = (step, _epochs(loader))
    for v in variants:
        _block(built[v][0], built[v][1], epoch_steps)
    rows = []
    for b in range(blocks):
        shift = b % len(variants)
        for v in variants[shift:] + variants[:shift]:
            rows.append((b, v, *_block(built[v][0], built[v][1], steps)))
    return rows


def _rank(variants: list[str], rank: int, world: int, port: int, steps: int, blocks: int, epoch_steps: int,
          queue) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    if world == 1:
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
            os.environ.pop(key)
    import torch

    torch.set_num_threads(1)
    try:
        if world > 1:
            import torch.distributed as dist

            dist.init_process_group("gloo")  # shared by every variant (accel and Accelerate adopt it)
        queue.put((rank, run_blocks(variants, steps, blocks, world, epoch_steps)))
    except Exception as exc:  # report instead of hanging the parent
        import traceback

        queue.put((rank, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(variants: list[str], world: int, steps: int, blocks: int, epoch_steps: int) -> dict[str, list[dict]]:
    """Per variant, one record per block: steps, CPU seconds (mean over ranks), wall seconds (slowest rank)."""
    ctx = mp.get_context("spawn")  # a clean interpreter: no singletons from this one
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(variants, r, world, port, steps, blocks, epoch_steps, queue))
             for r in range(world)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=1800) for _ in procs]
    for p in procs:
        p.join()
    bad = [r for r in results if isinstance(r[1], str)]
    if bad:
        raise RuntimeError(f"rank {bad[0][0]} failed: {bad[0][1]}")
    per_rank = [r[1] for r in sorted(results)]
    out: dict[str, list[dict]] = {v: [] for v in variants}
    for i, (block, variant, _, _, n) in enumerate(per_rank[0]):
        cpu = statistics.mean(rows[i][2] for rows in per_rank)
        wall = max(rows[i][3] for rows in per_rank)
        out[variant].append({"block": block, "steps": n, "cpu_s": cpu, "wall_s": wall,
                             "steps_per_cpu_s": n / cpu, "steps_per_s": n / wall})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--steps", type=int, default=50, help="timed steps per rank in one block")
    parser.add_argument("--blocks", type=int, default=60, help="rounds of alternating blocks")
    parser.add_argument("--epoch-steps", type=int, default=400, help="batches per rank in one epoch of the data")
    parser.add_argument("--no-accelerate", action="store_true", help="leave Accelerate out even if installed")
    parser.add_argument("--json", help="write raw samples and medians here")
    args = parser.parse_args(argv)
    if min(args.world_size, args.steps, args.blocks, args.epoch_steps) < 1:
        parser.error("--world-size, --steps, --blocks and --epoch-steps must be positive")

    variants = ["torch", "accel"]
    if not args.no_accelerate and importlib.util.find_spec("accelerate"):
        variants.append("accelerate")
    samples = measure(variants, args.world_size, args.steps, args.blocks, args.epoch_steps)

    raw = {s["block"]: s for s in samples["torch"]}
    print(f"MLP {FEATURES}-{HIDDEN}-{HIDDEN}-1, batch {BATCH}, world size {args.world_size}, {args.blocks} alternating "
          f"blocks of {args.steps} steps in one process group (1 torch thread per rank); medians over blocks")
    print(f"{'variant':<12}{'steps/CPU-s':>14}{'steps/s (wall)':>16}{'vs torch':>10}{'of totals':>11}{'quartiles':>16}")
    raw_total = sum(s["steps"] for s in samples["torch"]) / sum(s["cpu_s"] for s in samples["torch"])
    summary = {}
    for v in variants:
        ratios = [s["steps_per_cpu_s"] / raw[s["block"]]["steps_per_cpu_s"] for s in samples[v]]
        med = statistics.median(s["steps_per_cpu_s"] for s in samples[v])
        wall = statistics.median(s["steps_per_s"] for s in samples[v])
        ratio = statistics.median(ratios)
        total = sum(s["steps"] for s in samples[v]) / sum(s["cpu_s"] for s in samples[v]) / raw_total
        q1, _, q3 = statistics.quantiles(ratios) if len(ratios) > 1 else (ratio, ratio, ratio)
        summary[v] = {"steps_per_cpu_s": med, "steps_per_s": wall, "ratio_vs_torch": ratio, "ratio_of_totals": total,
                      "block_ratios": ratios, "samples": samples[v]}
        print(f"{v:<12}{med:>14.1f}{wall:>16.1f}{ratio:>10.3f}{total:>11.3f}{q1:>9.3f}..{q3:<6.3f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"world_size": args.world_size, "steps": args.steps, "blocks": args.blocks,
                       "epoch_steps": args.epoch_steps, "results": summary}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
