"""Training steps per CPU-second for a small MLP: hand-written torch loop vs accel vs Accelerate.

One step is ``zero_grad``, forward, backward, ``optimizer.step`` and ``scheduler.step`` (no
gradient accumulation). All variants live in ONE process group of ``--world-size`` ranks
(1 = single process, 2 = DDP over gloo), one torch thread per rank, each with its own copy of the
same model, data and optimizer. They run in alternating blocks of ``--steps`` timed steps, every
order of the variants in turn, so whatever the host does meanwhile hits every variant alike and
no variant always follows the same other one; short blocks, many of them, keep the variants'
conditions close. Each variant draws its batches from its own loader, epoch after epoch
(``--epoch-steps`` batches each), so a block may span an epoch boundary as in real training.
The rounds are spread over ``--builds`` fresh builds of every variant, made in a rotated order:
two builds of one and the same loop differ by a few tenths of a percent (where their memory
landed), and one build per variant would credit that luck to the variant. ``--self-check`` adds
a second hand-written loop ("torch-again"): its ratio is what the benchmark reads for no
difference at all, the resolution to judge the others by. ``--floor`` adds the hand-written loop
behind the thinnest wrappers an Accelerate-shaped API needs ("pass-through"): a loader with one
batch of look-ahead (the last batch must be known as the last), optimizer and scheduler wrappers
that only delegate, and a backward function. Its ratio is the cost of wrapping the loop's objects
at all, the floor for any library with that API.

Each block is compared with the hand-written block of the same round. The figure is the median
of those per-block ratios with a distribution-free 95 % confidence interval of that median (from
order statistics), the quartiles of the ratios and the ratio of the totals beside it. The host's
load average before and after and the share of a core the timed steps got are printed with it,
and a verdict says whether the interval lies at or above ``--goal`` (default 0.99), below it, or
straddles it (the noise is too large to tell: run more ``--blocks``).

    python suites/benchmarks/train_step.py [--world-size 1] [--steps 10] [--blocks 600] [--builds 6] [--self-check]
                                           [--floor] [--goal 0.99] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import math
import multiprocessing as mp
import os
import statistics
import sys
import time

FEATURES, HIDDEN, BATCH = 32, 128, 32
STEPS, BLOCKS = 10, 600  # defaults: steps per block, rounds (6,000 timed steps per variant)
BUILDS = 6  # default: fresh builds of every variant the rounds are spread over
SELF_CHECK = "torch-again"  # the hand-written loop once more, built and timed as a variant of its own
PASS_THROUGH = "pass-through"  # the hand-written loop behind wrappers that only delegate


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


class _Delegate:
    """An optimizer's or scheduler's wrapper that only delegates (the pass-through variant)."""

    def __init__(self, inner):
        self.inner = inner

    def zero_grad(self):
        self.inner.zero_grad()

    def step(self):
        self.inner.step()


class _LookAheadLoader:
    """A loader's wrapper that holds one batch back, so the last batch is known as the last."""

    def __init__(self, loader):
        self.loader = loader

    def __iter__(self):
        batches = iter(self.loader)
        try:
            current = next(batches)
        except StopIteration:
            return
        for upcoming in batches:
            yield current
            current = upcoming
        yield current


def _backward(loss):
    loss.backward()


def build_variant(variant: str, batches: int, world: int):
    """A ``(step, loader)`` pair: ``step(x, y)`` is one full training step of ``variant``."""
    import torch
    import torch.nn.functional as F

    model, dataset = _model(), _data(batches * world)
    if variant in ("torch", SELF_CHECK, PASS_THROUGH):
        sampler = None
        if world > 1:
            from torch.nn.parallel import DistributedDataParallel

            model = DistributedDataParallel(model)
            sampler = torch.utils.data.distributed.DistributedSampler(dataset, shuffle=False)
        loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        sched = _schedule(opt)
        if variant == PASS_THROUGH:
            wrapped_opt, wrapped_sched, backward = _Delegate(opt), _Delegate(sched), _backward

            def wrapped_step(x, y):
                wrapped_opt.zero_grad()
                loss = F.mse_loss(model(x), y)
                backward(loss)
                wrapped_opt.step()
                wrapped_sched.step()

            return wrapped_step, _LookAheadLoader(loader)

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
               epoch_steps: int, builds: int = 1) -> list[tuple[int, str, float, float, int]]:
    """Time ``blocks`` rounds of every variant, spread over ``builds`` fresh builds of them.

    Two builds of the very same loop differ by a few tenths of a percent (where their tensors and
    objects landed in memory), so one build per variant would pass that luck off as the variant's
    speed. Each build makes every variant anew, in a rotated order, and warms each up with one untimed
    epoch; its share of the rounds then runs.
    """
    import gc

    orders = list(itertools.permutations(variants))
    rows = []
    for build in range(builds):
        first = build % len(variants)
        built = {}
        for v in variants[first:] + variants[:first]:
            step, loader = build_variant(v, epoch_steps, world)
            built[v] = (step, _epochs(loader))
        for v in variants:
            _block(built[v][0], built[v][1], epoch_steps)
        # every order of the variants in turn: each follows each other equally often, so what one variant
        # leaves in the caches (or takes out of them) does not favour the one that always comes next
        for b in range(blocks * build // builds, blocks * (build + 1) // builds):
            for v in orders[b % len(orders)]:
                rows.append((b, v, *_block(built[v][0], built[v][1], steps)))
        del built
        gc.collect()
    return rows


def _rank(variants: list[str], rank: int, world: int, port: int, steps: int, blocks: int, epoch_steps: int,
          builds: int, queue) -> None:
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
        queue.put((rank, run_blocks(variants, steps, blocks, world, epoch_steps, builds)))
    except Exception as exc:  # report instead of hanging the parent
        import traceback

        queue.put((rank, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def _free_port() -> int:
    from accel.facts.network import free_port

    return free_port("127.0.0.1")


def measure(variants: list[str], world: int, steps: int, blocks: int, epoch_steps: int,
            builds: int = 1) -> dict[str, list[dict]]:
    """Per variant, one record per block: steps, CPU seconds (mean over ranks), wall seconds (slowest rank)."""
    ctx = mp.get_context("spawn")  # a clean interpreter: no singletons from this one
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(variants, r, world, port, steps, blocks, epoch_steps, builds, queue))
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


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free confidence interval for the median of ``values`` (from order statistics).

    The median lies between the ``j``-th and ``k``-th smallest of ``n`` samples with probability
    about ``confidence`` (normal approximation to the binomial count of samples below it); no
    assumption about how the block ratios are distributed, so host hiccups do not bend it.
    """
    if not values:
        raise ValueError("median_interval needs at least one value")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie between 0 and 1, got {confidence}")
    ordered = sorted(values)
    n = len(ordered)
    half_width = statistics.NormalDist().inv_cdf(0.5 + confidence / 2) * math.sqrt(n) / 2
    # 1-based ranks floor(n/2 - h) and ceil(1 + n/2 + h), as 0-based indices
    low = max(0, math.floor(n / 2 - half_width) - 1)
    high = min(n - 1, math.ceil(1 + n / 2 + half_width) - 1)
    return ordered[low], ordered[high]


def summarize(samples: dict[str, list[dict]], reference: str = "torch") -> dict[str, dict]:
    """Per variant: median rates and the per-round ratio to ``reference`` (median, 95 % interval, quartiles)."""
    raw = {s["block"]: s for s in samples[reference]}
    raw_total = sum(s["steps"] for s in raw.values()) / sum(s["cpu_s"] for s in raw.values())
    out = {}
    for variant, rows in samples.items():
        ratios = [s["steps_per_cpu_s"] / raw[s["block"]]["steps_per_cpu_s"] for s in rows]
        ratio = statistics.median(ratios)
        q1, _, q3 = statistics.quantiles(ratios) if len(ratios) > 1 else (ratio, ratio, ratio)
        low, high = median_interval(ratios)
        out[variant] = {
            "steps_per_cpu_s": statistics.median(s["steps_per_cpu_s"] for s in rows),
            "steps_per_s": statistics.median(s["steps_per_s"] for s in rows),
            "ratio_vs_torch": ratio, "ratio_ci95": [low, high], "ratio_quartiles": [q1, q3],
            "ratio_of_totals": sum(s["steps"] for s in rows) / sum(s["cpu_s"] for s in rows) / raw_total,
            "block_ratios": ratios, "samples": rows,
        }
    return out


def verdict(ratio_ci: tuple[float, float] | list[float], goal: float) -> str:
    """Whether a 95 % interval of the ratio shows it at or above ``goal``, below it, or cannot tell."""
    low, high = ratio_ci
    if low >= goal:
        return f"at or above {goal:g}"
    if high < goal:
        return f"below {goal:g}"
    return f"not distinguishable from {goal:g} at this noise"


def host_load() -> dict[str, float]:
    """The host's load averages and CPU count, printed with the figures they were measured under."""
    one, five, _ = os.getloadavg()
    return {"load_1min": one, "load_5min": five, "cpus": os.cpu_count() or 1}


def main(argv: list[str] | None = None) -> int:
    """Command line: measure, print one row per variant with its ratio's spread and the host's load."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--steps", type=int, default=STEPS, help="timed steps per rank in one block")
    parser.add_argument("--blocks", type=int, default=BLOCKS, help="rounds of alternating blocks")
    parser.add_argument("--epoch-steps", type=int, default=400, help="batches per rank in one epoch of the data")
    parser.add_argument("--builds", type=int, default=BUILDS,
                        help="fresh builds of every variant the rounds are spread over (averages memory-layout luck)")
    parser.add_argument("--goal", type=float, default=0.99, help="the accel/torch ratio the verdict is judged against")
    parser.add_argument("--no-accelerate", action="store_true", help="leave Accelerate out even if installed")
    parser.add_argument("--self-check", action="store_true",
                        help=f"also time the hand-written loop as a variant ({SELF_CHECK!r}): the reading for no difference")
    parser.add_argument("--floor", action="store_true",
                        help=f"also time the hand-written loop behind wrappers that only delegate ({PASS_THROUGH!r}): "
                             "the cost of an Accelerate-shaped API itself")
    parser.add_argument("--json", help="write raw samples and medians here")
    args = parser.parse_args(argv)
    if min(args.world_size, args.steps, args.blocks, args.epoch_steps, args.builds) < 1:
        parser.error("--world-size, --steps, --blocks, --epoch-steps and --builds must be positive")
    if args.builds > args.blocks:
        parser.error(f"--builds ({args.builds}) cannot exceed --blocks ({args.blocks}): each build runs some rounds")
    if not 0 < args.goal:
        parser.error("--goal must be positive")

    variants = ["torch", "accel"]
    if not args.no_accelerate and importlib.util.find_spec("accelerate"):
        variants.append("accelerate")
    if args.self_check:
        variants.append(SELF_CHECK)
    if args.floor:
        variants.append(PASS_THROUGH)
    before = host_load()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    samples = measure(variants, args.world_size, args.steps, args.blocks, args.epoch_steps, args.builds)
    wall = time.perf_counter() - wall0
    after = host_load()
    summary = summarize(samples)
    # the ranks' share of a core while they ran: 1.0 = each rank had a core to itself
    busy = sum(s["cpu_s"] for rows in samples.values() for s in rows)
    timed_wall = sum(s["wall_s"] for rows in samples.values() for s in rows)
    cpu_share = busy / timed_wall if timed_wall else float("nan")

    print(f"MLP {FEATURES}-{HIDDEN}-{HIDDEN}-1, batch {BATCH}, world size {args.world_size}, {args.blocks} alternating "
          f"blocks of {args.steps} steps over {args.builds} builds, in one process group (1 torch thread per rank); "
          f"medians over blocks")
    print(f"host: {after['cpus']} CPUs, load average {before['load_1min']:.2f} before, {after['load_1min']:.2f} after "
          f"(5 min {after['load_5min']:.2f}); the timed steps got {cpu_share:.0%} of a core; {wall:.0f} s in all")
    print(f"{'variant':<12}{'steps/CPU-s':>12}{'steps/s':>10}{'vs torch':>10}{'95% CI':>16}{'quartiles':>16}"
          f"{'of totals':>11}")
    for v in variants:
        r = summary[v]
        low, high = r["ratio_ci95"]
        q1, q3 = r["ratio_quartiles"]
        print(f"{v:<12}{r['steps_per_cpu_s']:>12.1f}{r['steps_per_s']:>10.1f}{r['ratio_vs_torch']:>10.3f}"
              f"{low:>9.3f}..{high:<5.3f}{q1:>9.3f}..{q3:<5.3f}{r['ratio_of_totals']:>11.3f}")
    judged = verdict(summary["accel"]["ratio_ci95"], args.goal)
    print(f"accel vs torch: median ratio {summary['accel']['ratio_vs_torch']:.3f}, 95% CI "
          f"{summary['accel']['ratio_ci95'][0]:.3f}..{summary['accel']['ratio_ci95'][1]:.3f}: {judged}")
    if args.self_check:
        again = summary[SELF_CHECK]
        print(f"{SELF_CHECK} vs torch: median ratio {again['ratio_vs_torch']:.3f}, 95% CI {again['ratio_ci95'][0]:.3f}.."
              f"{again['ratio_ci95'][1]:.3f}: what this run reads for two identical loops")
    if args.floor:
        floor = summary[PASS_THROUGH]
        print(f"{PASS_THROUGH} vs torch: median ratio {floor['ratio_vs_torch']:.3f}, 95% CI {floor['ratio_ci95'][0]:.3f}.."
              f"{floor['ratio_ci95'][1]:.3f}: the cost of wrapping the loop's objects at all")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"world_size": args.world_size, "steps": args.steps, "blocks": args.blocks, "builds": args.builds,
                       "epoch_steps": args.epoch_steps, "goal": args.goal, "verdict": judged,
                       "host": {"before": before, "after": after, "cpu_share": cpu_share, "wall_s": wall,
                                "driver_cpu_s": time.process_time() - cpu0},
                       "results": summary}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
