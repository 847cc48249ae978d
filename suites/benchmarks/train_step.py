"""Training steps per CPU-second for a small MLP: hand-written torch loop vs accel vs Accelerate.

Every sample is a fresh process group of ``--world-size`` ranks (1 = single process, 2 = DDP over
gloo), one torch thread per rank, the same model, data and step count. Only the timed steps after
warm-up count. Variants alternate so drift hits all of them alike; the median over repeats is
reported, with the ratio to the hand-written loop.

    python suites/benchmarks/train_step.py [--world-size 1] [--steps 400] [--repeats 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time

FEATURES, HIDDEN, BATCH = 32, 128, 32


def _data(steps: int):
    import torch

    g = torch.Generator().manual_seed(0)
    n = BATCH * steps
    x = torch.randn(n, FEATURES, generator=g)
    y = x.sum(dim=1, keepdim=True)
    return torch.utils.data.TensorDataset(x, y)


def _model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN),
                               torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 1))


def _loop(step_fn, loader, warmup: int) -> tuple[float, float, int]:
    """Run all batches; time those after ``warmup``. Returns (cpu seconds, wall seconds, steps)."""
    it = iter(loader)
    for _ in range(warmup):
        step_fn(*next(it))
    cpu0, wall0 = time.process_time(), time.perf_counter()
    steps = 0
    for batch in it:
        step_fn(*batch)
        steps += 1
    return time.process_time() - cpu0, time.perf_counter() - wall0, steps


def run_variant(variant: str, steps: int, warmup: int, world: int) -> tuple[float, float, int]:
    import torch
    import torch.nn.functional as F

    model, dataset = _model(), _data(steps * world + warmup * world)
    if variant == "torch":
        sampler = None
        if world > 1:
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel

            dist.init_process_group("gloo")
            model = DistributedDataParallel(model)
            sampler = torch.utils.data.distributed.DistributedSampler(dataset, shuffle=False)
        loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)

        def step(x, y):
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()

        return _loop(step, loader, warmup)

    if variant == "accel":
        from accel import Accelerator
    else:
        from accelerate import Accelerator
    accelerator = Accelerator(cpu=True)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    model, opt, loader = accelerator.prepare(model, opt, loader)

    def step(x, y):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        accelerator.backward(loss)
        opt.step()

    return _loop(step, loader, warmup)


def _rank(variant: str, rank: int, world: int, store_dir: str, port: int, steps: int, warmup: int, queue) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    if world == 1:
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
            os.environ.pop(key)
    import torch

    torch.set_num_threads(1)
    try:
        queue.put((rank, run_variant(variant, steps, warmup, world)))
    except Exception as exc:  # report instead of hanging the parent
        queue.put((rank, f"{type(exc).__name__}: {exc}"))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sample(variant: str, world: int, steps: int, warmup: int) -> dict:
    ctx = mp.get_context("spawn")  # a clean interpreter per sample: no shared singletons
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        port = _free_port()
        procs = [ctx.Process(target=_rank, args=(variant, r, world, tmp, port, steps, warmup, queue)) for r in range(world)]
        for p in procs:
            p.start()
        results = [queue.get(timeout=600) for _ in procs]
        for p in procs:
            p.join()
    bad = [r for r in results if isinstance(r[1], str)]
    if bad:
        raise RuntimeError(f"{variant}: rank {bad[0][0]} failed: {bad[0][1]}")
    cpu = statistics.mean(r[1][0] for r in results)
    wall = max(r[1][1] for r in results)
    n = results[0][1][2]
    return {"steps": n, "cpu_s": cpu, "wall_s": wall, "steps_per_cpu_s": n / cpu, "steps_per_s": n / wall}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--steps", type=int, default=400, help="timed steps per rank")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="write raw samples and medians here")
    args = parser.parse_args(argv)

    variants = ["torch", "accel"] + (["accelerate"] if importlib.util.find_spec("accelerate") else [])
    samples: dict[str, list[dict]] = {v: [] for v in variants}
    for _ in range(args.repeats):
        for v in variants:
            samples[v].append(sample(v, args.world_size, args.steps, args.warmup))

    base = statistics.median(s["steps_per_cpu_s"] for s in samples["torch"])
    print(f"MLP {FEATURES}-{HIDDEN}-{HIDDEN}-1, batch {BATCH}, world size {args.world_size}, "
          f"{args.steps} timed steps, median of {args.repeats} (1 torch thread per rank)")
    print(f"{'variant':<12}{'steps/CPU-s':>14}{'steps/s (wall)':>16}{'vs torch':>10}{'min..max steps/CPU-s':>24}")
    summary = {}
    for v in variants:
        per_cpu = [s["steps_per_cpu_s"] for s in samples[v]]
        med = statistics.median(per_cpu)
        wall = statistics.median(s["steps_per_s"] for s in samples[v])
        summary[v] = {"steps_per_cpu_s": med, "steps_per_s": wall, "ratio_vs_torch": med / base, "samples": samples[v]}
        print(f"{v:<12}{med:>14.1f}{wall:>16.1f}{med / base:>10.3f}{min(per_cpu):>12.1f}..{max(per_cpu):<10.1f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"world_size": args.world_size, "results": summary}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
