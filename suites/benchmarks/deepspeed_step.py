"""ZeRO-2 training steps per second: accel's DeepSpeed strategy vs the same loop on ``deepspeed.initialize``.

Both loops run in the same 2 ranks (gloo on CPU), on the same model, data, optimizer and DeepSpeed
config, in alternating timed rounds (A B, then B A, ...), so host drift hits both alike. The figure is
the median over rounds of the per-round ratio accel steps/s ÷ hand-written steps/s (target ≥ 0.98).

    python suites/benchmarks/deepspeed_step.py [--world-size 2] [--steps 40] [--rounds 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time

FEATURES, HIDDEN, BATCH = 64, 256, 32


def _free_port() -> int:
    from accel.facts.network import free_port

    return free_port("127.0.0.1")


def _model():
    import torch

    torch.manual_seed(0)
    layers = [torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU()]
    for _ in range(3):
        layers += [torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(HIDDEN, 1))


def _config() -> dict:
    return {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
            "zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True, "steps_per_print": 10**9}


def _rank(rank: int, world: int, port: int, opts: dict, queue) -> None:
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"})
    try:
        os.sched_setaffinity(0, {rank % os.cpu_count()})
    except (AttributeError, OSError):
        pass
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    import deepspeed

    from accel import Accelerator
    from accel.utils import DeepSpeedPlugin

    g = torch.Generator().manual_seed(rank)
    xs = torch.randn(opts["steps"], BATCH, FEATURES, generator=g)
    ys = xs.sum(dim=2, keepdim=True)

    # the hand-written loop: deepspeed.initialize, engine.backward, engine.step
    raw_model = _model()
    raw, _, _, _ = deepspeed.initialize(model=raw_model, optimizer=torch.optim.AdamW(raw_model.parameters(), lr=1e-3),
                                        config=_config())

    # the same loop through accel, written as for Accelerate
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=_config()))
    model = _model()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs.reshape(-1, FEATURES), ys.reshape(-1, 1)),
                                         batch_size=BATCH)
    model, optimizer, _ = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3), loader)

    def raw_round() -> float:
        torch.distributed.barrier()
        start = time.perf_counter()
        for x, y in zip(xs, ys):
            loss = F.mse_loss(raw(x), y)
            raw.backward(loss)
            raw.step()
        torch.distributed.barrier()
        return time.perf_counter() - start

    def accel_round() -> float:
        torch.distributed.barrier()
        start = time.perf_counter()
        for x, y in zip(xs, ys):
            loss = F.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        torch.distributed.barrier()
        return time.perf_counter() - start

    raw_round(), accel_round()  # warm-up: first-step allocations, DeepSpeed's lazy buffers
    times: dict[str, list[float]] = {"deepspeed": [], "accel": []}
    for r in range(opts["rounds"]):
        order = (("deepspeed", raw_round), ("accel", accel_round))
        for name, fn in (order if r % 2 == 0 else order[::-1]):
            times[name].append(fn())
    if rank == 0:
        queue.put(times)


def run(world: int, steps: int, rounds: int) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, world, port, {"steps": steps, "rounds": rounds}, queue)) for r in range(world)]
    for p in procs:
        p.start()
    times = queue.get(timeout=900)
    for p in procs:
        p.join(timeout=120)
    ratios = [t_raw / t_acc for t_raw, t_acc in zip(times["deepspeed"], times["accel"])]
    return {
        "world_size": world, "steps_per_round": steps, "rounds": rounds,
        "deepspeed_steps_per_s": steps / statistics.median(times["deepspeed"]),
        "accel_steps_per_s": steps / statistics.median(times["accel"]),
        "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
        "raw_round_seconds": times,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--json", help="write the result here")
    args = parser.parse_args(argv)
    result = run(args.world_size, args.steps, args.rounds)
    print(f"ZeRO-2, {args.world_size} CPU ranks: deepspeed.initialize {result['deepspeed_steps_per_s']:.1f} steps/s, "
          f"accel {result['accel_steps_per_s']:.1f} steps/s; accel/hand-written = {result['ratio_median']:.3f} "
          f"(rounds {result['ratio_min']:.3f}-{result['ratio_max']:.3f}; target >= 0.98)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
