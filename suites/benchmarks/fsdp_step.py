"""FSDP2 through accel vs a hand-written ``fully_shard`` loop (steps/s), and FSDP2 vs DDP parameter+optimizer memory.

One run starts ``--world-size`` ranks (gloo, one torch thread each) once. Inside them:

* **speed**: each round builds a fresh model of ``Block`` layers per variant, every block and the root
  sharded with ``fully_shard`` (accel: ``FullyShardedDataParallelPlugin(fsdp_version=2,
  transformer_cls_names_to_wrap=["Block"])`` through ``Accelerator.prepare``, optimizer created
  before prepare; hand-written: the same calls by hand, optimizer after), then runs their AdamW steps
  alternately one by one on the same pre-made batches (which variant goes first flips every step and
  every round), so both see the same host load. Warm-up steps are not timed. Per variant a round
  sums wall time (slowest rank) and CPU time (all ranks; steadier on a shared host). Reported: median
  over rounds of steps/s and steps per CPU-second per variant, and accel / hand-written for each.
* **memory**: the bytes each rank holds for parameters and optimizer state after one AdamW step
  (local shards of DTensors counted, nothing else), for a model whose parameters dominate (wide
  Linear blocks, tiny batch), under FSDP2 and under DDP. Reported: the ratio FSDP2 / DDP per rank
  (about 1/world_size expected).

    python suites/benchmarks/fsdp_step.py [--world-size 2] [--rounds 7] [--steps 40] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time

WIDTH, DEPTH, BATCH = 256, 4, 16
MEM_WIDTH, MEM_DEPTH = 512, 8


def _model(width: int, depth: int):
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(width, width)

        def forward(self, x):
            return torch.relu(self.fc(x))

    torch.manual_seed(0)
    return torch.nn.Sequential(*[Block() for _ in range(depth)], torch.nn.Linear(width, 1))


def _batches(rank: int, count: int, width: int):
    import torch

    g = torch.Generator().manual_seed(rank)
    return [(torch.randn(BATCH, width, generator=g), torch.randn(BATCH, 1, generator=g)) for _ in range(count)]


def _hand_model(mesh):
    import torch
    from torch.distributed.fsdp import fully_shard

    model = _model(WIDTH, DEPTH)
    for block in list(model)[:-1]:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def _accel_model(accelerator):
    import torch

    model = _model(WIDTH, DEPTH)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # before prepare: accel switches it to the shards
    return accelerator.prepare(model, optimizer)


def _round(accelerator, mesh, batches, warmup: int, accel_first: bool) -> dict[str, list[float]]:
    """Fresh models of both variants, then their steps alternate one by one (paired under the same load).

    Returns per variant [wall seconds (slowest rank), CPU seconds (all ranks)] summed over the timed steps.
    """
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    hand_model, hand_opt = _hand_model(mesh)
    accel_model, accel_opt = _accel_model(accelerator)

    def hand_step(x, y):
        F.mse_loss(hand_model(x), y).backward()
        hand_opt.step()
        hand_opt.zero_grad()

    def accel_step(x, y):
        accelerator.backward(F.mse_loss(accel_model(x), y))
        accel_opt.step()
        accel_opt.zero_grad()

    steps = {"accel": accel_step, "hand": hand_step}
    order = ("accel", "hand") if accel_first else ("hand", "accel")
    totals = {v: torch.zeros(2, dtype=torch.float64) for v in order}
    for i, (x, y) in enumerate(batches):
        for variant in (order if i % 2 == 0 else order[::-1]):
            dist.barrier()
            wall, cpu = time.perf_counter(), time.process_time()
            steps[variant](x, y)
            if i >= warmup:
                totals[variant] += torch.tensor([time.perf_counter() - wall, time.process_time() - cpu], dtype=torch.float64)
    out = {}
    for variant, total in totals.items():
        wall, cpu = total[:1].clone(), total[1:].clone()
        dist.all_reduce(wall, op=dist.ReduceOp.MAX)  # a step is done when the slowest rank is
        dist.all_reduce(cpu, op=dist.ReduceOp.SUM)  # CPU seconds of all ranks: steady on a loaded host
        out[variant] = [float(wall), float(cpu)]
    accelerator.free_memory()
    return out


def _state_bytes(model, optimizer) -> int:
    import torch
    from torch.distributed.tensor import DTensor

    def local(t):
        return t.to_local() if isinstance(t, DTensor) else t

    total = sum(local(p).numel() * p.element_size() for p in model.parameters())
    for state in optimizer.state.values():
        total += sum(local(v).numel() * v.element_size() for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
    return total


def _memory(mesh, rank: int) -> dict:
    import torch
    import torch.nn.functional as F
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    x, y = _batches(rank, 1, MEM_WIDTH)[0]
    out = {}
    for variant in ("ddp", "fsdp2"):
        model = _model(MEM_WIDTH, MEM_DEPTH)
        if variant == "fsdp2":
            for block in list(model)[:-1]:
                fully_shard(block, mesh=mesh)
            fully_shard(model, mesh=mesh)
            wrapped = model
        else:
            wrapped = DistributedDataParallel(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        F.mse_loss(wrapped(x[:2]), y[:2]).backward()
        optimizer.step()
        optimizer.zero_grad()
        out[variant] = _state_bytes(model, optimizer)
        del wrapped, model, optimizer
    return out


def _rank(rank: int, world: int, store: str, args: dict, queue) -> None:
    try:
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                          MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1")
        os.environ.pop("ACCEL_DEVICE", None)
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
        from torch.distributed.device_mesh import init_device_mesh

        from accel import Accelerator
        from accel.utils import FullyShardedDataParallelPlugin

        accelerator = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(
            fsdp_version=2, auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Block"]))
        mesh = init_device_mesh("cpu", (world,))
        batches = _batches(rank, args["warmup"] + args["steps"], WIDTH)
        times: dict[str, list[list[float]]] = {"accel": [], "hand": []}
        for r in range(args["rounds"]):
            for variant, pair in _round(accelerator, mesh, batches, args["warmup"], accel_first=r % 2 == 0).items():
                times[variant].append(pair)
        memory = _memory(mesh, rank)
        dist.destroy_process_group()
        queue.put((rank, "ok", {"times": times, "memory": memory}))
    except BaseException:
        import traceback

        queue.put((rank, "error", traceback.format_exc()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args(argv)
    settings = {"rounds": args.rounds, "steps": args.steps, "warmup": args.warmup}
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=_rank, args=(r, args.world_size, os.path.join(tmp, "store"), settings, queue))
                 for r in range(args.world_size)]
        for p in procs:
            p.start()
        results = {}
        for _ in procs:
            rank, status, payload = queue.get(timeout=1800)
            if status != "ok":
                print(f"rank {rank} failed:\n{payload}", file=sys.stderr)
                for p in procs:
                    p.kill()
                return 1
            results[rank] = payload
        for p in procs:
            p.join()
    times = results[0]["times"]  # every rank holds the same (reduced over ranks) times
    summary = {"world_size": args.world_size, "rounds": args.rounds, "steps": args.steps}
    print(f"FSDP2 over {args.world_size} ranks (median of {args.rounds} interleaved rounds x {args.steps} steps):")
    for index, clock in ((0, "wall"), (1, "cpu")):
        rate = {v: args.steps / statistics.median(t[index] for t in ts) for v, ts in times.items()}
        per_round = [h[index] / a[index] for a, h in zip(times["accel"], times["hand"])]
        summary[f"steps_per_{clock}_s"] = rate
        summary[f"accel_over_hand_{clock}"] = rate["accel"] / rate["hand"]
        summary[f"accel_over_hand_{clock}_per_round"] = per_round
        unit = "steps/s (wall)" if clock == "wall" else "steps per CPU-second (all ranks)"
        print(f"  {unit}: hand-written fully_shard {rate['hand']:.2f}   accel {rate['accel']:.2f}   accel/hand "
              f"{rate['accel'] / rate['hand']:.3f} (per round {min(per_round):.3f}..{max(per_round):.3f})")
    memory = {r: results[r]["memory"] for r in sorted(results)}
    summary["memory_bytes"] = memory
    summary["fsdp2_over_ddp_memory"] = {r: m["fsdp2"] / m["ddp"] for r, m in memory.items()}
    for r, m in memory.items():
        print(f"  rank {r}: parameters+optimizer state  DDP {m['ddp'] / 2**20:.2f} MiB   FSDP2 {m['fsdp2'] / 2**20:.2f} MiB   "
              f"ratio {m['fsdp2'] / m['ddp']:.3f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(summary, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
