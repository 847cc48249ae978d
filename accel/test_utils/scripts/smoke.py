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
    from accel.backends import is_host_device
    from accel.utils import set_seed, synchronize_rng_states

    set_seed(1234 + ctx.rank)
    types = ["torch"] + ([] if is_host_device(ctx.device) else [ctx.backend.device_type])
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


#: dtype autocast runs the Linear layers in, per precision label
_DTYPES = {"no": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
#: how far weights trained under each precision may drift from the fp32 reference, as a multiple of
#: the dtype's unit roundoff (half its machine epsilon) times (1 + the largest reference weight). The
#: inputs of every matmul are rounded to the dtype, so each step's update carries a relative error of
#: a few roundoffs; over STEPS steps this stays within the bound below with a wide margin, while a
#: wrong loss scale or an unsynchronised gradient moves the weights by a sizeable part of the update.
_ROUNDOFFS = {"no": 1000.0, "bf16": 4.0, "fp16": 4.0}
STEPS = 16
GLOBAL_BATCH = 8
LR = 0.05


def _unit_roundoff(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).eps) / 2


def _tiny_problem():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(STEPS * GLOBAL_BATCH, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-1.0], [2.0], [0.5]]) + 0.1 * torch.randn(STEPS * GLOBAL_BATCH, 1, generator=g)
    torch.manual_seed(0)
    # a container around the layer, so a hook on the layer sees what autocast computes (the prepared
    # model's own outputs are converted back to fp32, as Accelerate's are)
    model = torch.nn.Sequential(torch.nn.Linear(4, 1))
    return x, y, model


def train_under_launch_precision(ctx: Context) -> dict[str, Any]:
    """Train a small regression with ``Accelerator()`` (precision, process group and data sharding as the
    launch set them up) and the same run in fp32 in one process, stepping the reference only where the
    accelerated run really stepped (GradScaler skips a step when fp16 gradients overflow, as it must).

    Returns the reported precision, the dtype the forward pass really ran in, the losses per step
    (mean over ranks), the skipped steps and the largest weight difference from the reference.
    """
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    from accel import Accelerator
    from accel.utils.operations import reduce

    if GLOBAL_BATCH % ctx.world:
        raise SkipCheck(f"the global batch of {GLOBAL_BATCH} does not split over {ctx.world} processes")
    x, y, model = _tiny_problem()
    reference = torch.nn.Sequential(torch.nn.Linear(4, 1))
    reference.load_state_dict(model.state_dict())

    accelerator = Accelerator()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    loader = DataLoader(TensorDataset(x, y), batch_size=GLOBAL_BATCH // ctx.world)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    seen: list[torch.dtype] = []
    hook = accelerator.unwrap_model(model)[0].register_forward_hook(lambda mod, inp, out: seen.append(out.dtype))
    losses, skipped = [], []
    for step, (xb, yb) in enumerate(loader):
        opt.zero_grad()
        with accelerator.autocast():
            loss = F.mse_loss(model(xb).float(), yb)
        accelerator.backward(loss)
        opt.step()
        skipped.append(bool(accelerator.optimizer_step_was_skipped))
        losses.append(float(reduce(loss.detach().float().reshape(1), reduction="mean").item()))
    hook.remove()

    ref_opt = torch.optim.SGD(reference.parameters(), lr=LR)
    for step in range(len(skipped)):
        if skipped[step]:
            continue
        xb, yb = x[step * GLOBAL_BATCH:(step + 1) * GLOBAL_BATCH], y[step * GLOBAL_BATCH:(step + 1) * GLOBAL_BATCH]
        ref_opt.zero_grad()
        F.mse_loss(reference(xb), yb).backward()
        ref_opt.step()
    trained = accelerator.unwrap_model(model)
    diff = max((a.detach().cpu().float() - b.detach()).abs().max().item() for a, b in zip(trained.parameters(), reference.parameters()))
    scale = max(b.detach().abs().max().item() for b in reference.parameters())
    return {
        "reported": accelerator.mixed_precision,
        "ran_in": seen[0] if seen else None,
        "losses": losses,
        "skipped": skipped,
        "diff": diff,
        "scale": scale,
    }


def judge_training(result: dict[str, Any]) -> str:
    """The verdict on ``train_under_launch_precision``'s result: AssertionError naming what broke
    (precision not the one reported, loss not going down, too far from the fp32 reference)."""
    reported = result["reported"]
    expected = _DTYPES.get(reported)
    if expected is None:
        raise SkipCheck(f"no fp32 comparison defined for mixed precision {reported}")
    if result["ran_in"] != expected:
        raise AssertionError(f"the Accelerator reports mixed precision {reported!r}, but the forward pass ran in {result['ran_in']}")
    stepped = [loss for loss, skip in zip(result["losses"], result["skipped"]) if not skip]
    if len(stepped) < STEPS // 2:
        raise AssertionError(f"{sum(result['skipped'])} of {len(result['skipped'])} optimizer steps were skipped (overflowing gradients)")
    losses = result["losses"]
    if not losses[-1] < 0.5 * losses[0]:
        raise AssertionError(f"the loss did not go down under {reported}: {losses[0]:.4g} -> {losses[-1]:.4g}")
    roundoff = _unit_roundoff(expected)
    tolerance = _ROUNDOFFS[reported] * roundoff * (1 + result["scale"])
    if result["diff"] > tolerance:
        raise AssertionError(
            f"weights after {len(losses)} steps under {reported} differ from the fp32 one-process reference by "
            f"{result['diff']:.2e} (tolerance {tolerance:.2e} = {_ROUNDOFFS[reported]:g} x {reported} roundoff {roundoff:.1e} x (1 + {result['scale']:.2g}))"
        )
    skipped = sum(result["skipped"])
    return (f"{reported}: forward in {str(expected).replace('torch.', '')}, loss {losses[0]:.3g} -> {losses[-1]:.3g}, "
            f"max diff from fp32 {result['diff']:.1e} (tol {tolerance:.1e})" + (f", {skipped} overflow step(s) skipped" if skipped else ""))


@check("training equivalence")
def _training(ctx: Context) -> str:
    return judge_training(train_under_launch_precision(ctx))


@check("mixed precision")
def _mixed_precision(ctx: Context) -> str:
    """The precision the launch asked for is the one the Accelerator reports (or, where the backend
    cannot run it, a reported fallback the backend explains), and each supported autocast really runs."""
    import warnings

    from accel import Accelerator

    asked = os.environ.get("ACCEL_MIXED_PRECISION") or os.environ.get("ACCELERATE_MIXED_PRECISION") or "no"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reported = Accelerator().mixed_precision
    notes = []
    if reported != asked:
        cap = {"bf16": lambda: ctx.backend.amp_capability(torch.bfloat16), "fp16": lambda: ctx.backend.amp_capability(torch.float16),
               "fp8": lambda: ctx.backend.supports_fp8}.get(asked, lambda: None)()
        if cap is None or cap:
            raise AssertionError(f"the launch asked for mixed precision {asked!r} but the Accelerator reports {reported!r}")
        notes.append(f"asked {asked}, backend cannot ({cap.reason}); reports {reported}")
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
    detail = f"launch {asked}, Accelerator reports {reported}; " + (f"{', '.join(ran)} autocast really runs" if ran else "no autocast here")
    return detail + "".join(f" ({n})" for n in notes) + (f" (skipped {'; '.join(skipped)})" if skipped else "")


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
