"""The checks `accel test` runs in every launched rank.

Each check is a function; a failure in one does not stop the others, and every collective is bounded
by the process group's timeout, so a stuck rank ends the run instead of hanging it. At the end the
ranks' results are gathered and the main process writes them as JSON for `accel test` to print.

    accel launch [flags] -m accel.test_utils.scripts.smoke --out results.json [--timeout 30]

``ACCEL_TEST_EXPECTED_WORLD_SIZE`` (set by `accel test` from the flags it was given) is the world
size that was *asked for*; the first check compares it with what the launcher actually started.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from typing import Any, Callable

import torch

CHECKS: list[tuple[str, Callable[["Context"], str | None]]] = []


class SkipCheck(Exception):
    """The check does not apply here (the message says why)."""


def check(name: str):
    def register(fn: Callable[["Context"], str | None]):
        CHECKS.append((name, fn))
        return fn

    return register


class Context:
    def __init__(self, state: Any, expected: int | None):
        self.state = state
        self.expected = expected
        self.backend = state.hardware_backend
        self.device = state.device
        self.rank = state.process_index
        self.world = state.num_processes


def _all(value: Any) -> list[Any]:
    from accel.utils.operations import gather_object

    return gather_object([value])


@check("launch: world size")
def _world_size(ctx: Context) -> str:
    ranks = _all(ctx.rank)
    if sorted(ranks) != list(range(ctx.world)):
        raise AssertionError(f"rank indices {sorted(ranks)} are not 0..{ctx.world - 1}")
    if ctx.expected is not None and ctx.world != ctx.expected:
        raise AssertionError(f"asked for {ctx.expected} processes, the launcher started {ctx.world}")
    return f"{ctx.world} process(es), ranks {sorted(ranks)}"


@check("state")
def _state(ctx: Context) -> str:
    from accel.utils.dataclasses import DistributedType

    if ctx.device.type != ctx.backend.device_type:
        raise AssertionError(f"device {ctx.device} is not a {ctx.backend.device_type} device")
    expected_type = DistributedType(ctx.backend.distributed_type) if ctx.world > 1 else DistributedType.NO
    if ctx.state.distributed_type != expected_type:
        raise AssertionError(f"distributed_type {ctx.state.distributed_type}, expected {expected_type}")
    mains = _all(ctx.state.is_main_process)
    if mains.count(True) != 1 or not mains[0]:
        raise AssertionError(f"is_main_process per rank: {mains}")
    return f"{ctx.state.distributed_type} on {ctx.device}, collectives {ctx.state.backend or 'none'}"


@check("process control")
def _process_control(ctx: Context) -> str:
    ctx.state.wait_for_everyone()
    with ctx.state.split_between_processes(list(range(10))) as share:
        pass
    union = [x for part in _all(share) for x in part]
    if union != list(range(10)):
        raise AssertionError(f"split_between_processes shares join to {union}")
    ran = []
    ctx.state.on_main_process(lambda: ran.append(1))()
    if sum(_all(len(ran))) != 1:
        raise AssertionError("on_main_process did not run exactly once")
    return "barrier, split_between_processes, on_main_process"


@check("RNG synchronisation")
def _rng(ctx: Context) -> str:
    from accel.utils import set_seed, synchronize_rng_states

    set_seed(1234 + ctx.rank)
    types = ["torch"] + ([ctx.backend.device_type] if ctx.device.type != "cpu" else [])
    synchronize_rng_states(types)
    draws = _all(float(torch.rand(1)))
    device_draws = _all(float(torch.rand(1, device=ctx.device)))
    if len(set(draws)) != 1 or len(set(device_draws)) != 1:
        raise AssertionError(f"draws differ across ranks after synchronisation: {draws} / {device_draws}")
    return f"synchronised {', '.join(types)}"


@check("data-loader sharding")
def _data(ctx: Context) -> str:
    from torch.utils.data import DataLoader

    from accel.data_loader import prepare_data_loader

    loader = prepare_data_loader(DataLoader(list(range(11)), batch_size=2), ctx.device, put_on_device=True)
    seen = []
    for batch in loader:
        if batch.device.type != ctx.device.type:
            raise AssertionError(f"batch on {batch.device}, expected {ctx.device}")
        seen.extend(batch.tolist())
    everything = sorted(x for part in _all(seen) for x in part)
    if sorted(set(everything)) != list(range(11)):
        raise AssertionError(f"shards cover {sorted(set(everything))}, expected 0..10")
    return f"{len(seen)} samples on this rank, {len(everything)} in all (evened out)"


@check("collectives")
def _collectives(ctx: Context) -> str:
    from accel.utils.operations import broadcast, gather, pad_across_processes, reduce

    n, r, dev = ctx.world, ctx.rank, ctx.device
    gathered = gather(torch.tensor([float(r)], device=dev))
    if gathered.tolist() != [float(i) for i in range(n)]:
        raise AssertionError(f"gather gave {gathered.tolist()}")
    summed = reduce(torch.tensor([float(r + 1)], device=dev), reduction="sum")
    if summed.item() != n * (n + 1) / 2:
        raise AssertionError(f"reduce(sum) gave {summed.item()}")
    sent = broadcast(torch.tensor([float(r)], device=dev), from_process=n - 1)
    if sent.item() != n - 1:
        raise AssertionError(f"broadcast from the last rank gave {sent.item()}")
    padded = pad_across_processes(torch.ones(r + 1, device=dev))
    if padded.shape[0] != n:
        raise AssertionError(f"pad_across_processes gave length {padded.shape[0]}, expected {n}")
    return "gather, reduce, broadcast, pad_across_processes"


def _tiny_problem(device: torch.device):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-1.0], [2.0], [0.5]])
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    return x, y, model


@check("training equivalence")
def _training(ctx: Context) -> str:
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    from accel import Accelerator

    x, y, model = _tiny_problem(ctx.device)
    reference = torch.nn.Linear(4, 1)
    reference.load_state_dict(model.state_dict())
    reference.to(ctx.device)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(4):
        xb, yb = x[step * 8:(step + 1) * 8].to(ctx.device), y[step * 8:(step + 1) * 8].to(ctx.device)
        ref_opt.zero_grad()
        F.mse_loss(reference(xb), yb).backward()
        ref_opt.step()

    if 8 % ctx.world:
        raise SkipCheck(f"the global batch of 8 does not split over {ctx.world} processes")
    accelerator = Accelerator()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(x, y), batch_size=8 // ctx.world)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    for xb, yb in loader:
        opt.zero_grad()
        accelerator.backward(F.mse_loss(model(xb), yb))
        opt.step()
    trained = accelerator.unwrap_model(model)
    diff = max((a - b).abs().max().item() for a, b in zip(trained.parameters(), reference.parameters()))
    if diff > 1e-4:
        raise AssertionError(f"weights after 4 steps differ from one process by {diff:.2e}")
    return f"{ctx.world}-process DDP matches one process (max diff {diff:.1e})"


@check("mixed precision")
def _mixed_precision(ctx: Context) -> str:
    ran, skipped = [], []
    for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        cap = ctx.backend.amp_capability(dtype)
        if not cap:
            skipped.append(f"{name}: {cap.reason}")
            continue
        layer = torch.nn.Linear(4, 4).to(ctx.device)
        with ctx.backend.autocast(dtype):
            out = layer(torch.ones(2, 4, device=ctx.device))
        if out.dtype != dtype:
            raise AssertionError(f"{name} autocast ran the Linear in {out.dtype}")
        if name == "fp16" and ctx.backend.grad_scaler_capability:
            ctx.backend.grad_scaler()
        ran.append(name)
    if not ran:
        raise SkipCheck("; ".join(skipped))
    return f"{', '.join(ran)} autocast really runs" + (f" (skipped {'; '.join(skipped)})" if skipped else "")


@check("checkpoint round trip")
def _checkpoint(ctx: Context) -> str:
    from accel import Accelerator
    from accel.utils.operations import broadcast_object_list

    accelerator = Accelerator()
    model = accelerator.prepare(torch.nn.Linear(4, 2))
    opt = accelerator.prepare(torch.optim.Adam(model.parameters(), lr=0.01))
    accelerator.backward(model(torch.ones(3, 4, device=ctx.device)).sum())
    opt.step()
    folder = [tempfile.mkdtemp(prefix="accel-test-") if ctx.state.is_main_process else None]
    folder = broadcast_object_list(folder)[0]
    path = accelerator.save_state(os.path.join(folder, "ckpt"))
    saved = [p.detach().clone() for p in accelerator.unwrap_model(model).parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    accelerator.load_state(path)
    restored = list(accelerator.unwrap_model(model).parameters())
    if not all(torch.equal(a, b) for a, b in zip(saved, restored)):
        raise AssertionError("weights after load_state differ from the saved ones")
    accelerator.wait_for_everyone()
    if ctx.state.is_main_process:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
    return "save_state / load_state restore the weights exactly"


def run_checks(expected: int | None, timeout: float) -> tuple[Any, list[dict[str, Any]]]:
    from accel.state import PartialState

    state = PartialState(timeout=timedelta(seconds=timeout))
    ctx = Context(state, expected)
    results = []
    for name, fn in CHECKS:
        start = time.perf_counter()
        try:
            detail, status = fn(ctx) or "", "pass"
        except SkipCheck as exc:
            detail, status = str(exc), "skip"
        except Exception as exc:
            tail = traceback.format_exc().strip().splitlines()[-3:]
            detail, status = f"{type(exc).__name__}: {exc}", "fail"
            detail += "" if str(exc) in tail[-1] else f" ({tail[-1]})"
        results.append({"check": name, "status": status, "detail": detail, "seconds": time.perf_counter() - start})
    return state, results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="accel test's smoke checks (run under accel launch)")
    parser.add_argument("--out", required=True, help="JSON file the main process writes the results to")
    parser.add_argument("--timeout", type=float, default=30.0, help="collective timeout in seconds")
    args = parser.parse_args(argv)
    expected_text = os.environ.get("ACCEL_TEST_EXPECTED_WORLD_SIZE")
    expected = int(expected_text) if expected_text else None

    state, results = run_checks(expected, args.timeout)
    per_rank = _all(results)
    failed = any(r["status"] == "fail" for rank in per_rank for r in rank)
    if state.is_main_process:
        payload = {
            "backend": state.hardware_backend.name,
            "device": str(state.device),
            "world_size": state.num_processes,
            "expected_world_size": expected,
            "collectives": state.backend,
            "ranks": per_rank,
        }
        tmp = args.out + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(payload, fh, indent=1)
        os.replace(tmp, args.out)
    state.wait_for_everyone()  # nobody tears the group down while a peer still uses it
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
