"""Multi-process benchmarks: running a rank function in the harness's pooled process group and
agreeing on the slowest rank's times (part of :mod:`timing`).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence


def rank_max(values: Sequence[float], device: Any = None) -> list[float]:
    """Element-wise maximum of ``values`` over all ranks of the default process group."""
    import torch
    import torch.distributed as dist

    tensor = torch.tensor(list(values), dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [float(v) for v in tensor.cpu().tolist()]


def run_in_ranks(config: Any, backend: Any, world_size: int, fn: Callable[..., Any], **kwargs: Any) -> list[Any]:
    """Run ``fn`` in ``world_size`` ranks of the harness's pooled process group; return each rank's result.

    ``fn`` is a module-level function taking ``backend``, ``rank``, ``world_size`` and ``out`` (the
    ranks' own values are filled in) plus ``kwargs`` (picklable). What it returns is pickled to
    ``out`` by the rank and read back here. Skips (with the harness's reason codes) when the
    backend cannot run ``world_size`` processes.
    """
    import inspect
    import pickle
    import tempfile

    import pytest

    from accel_harness import markers
    from accel_harness.distributed import Task
    from accel_harness.plugin import _context, _visible_devices_env
    from accel_harness.rank_runs import pool_start_method

    reason = markers.evaluate([], backend, world_size=world_size)
    if reason is not None:
        pytest.skip(markers.format_skip(reason))
    ctx = _context(config)
    with tempfile.TemporaryDirectory(prefix="accel-bench-ranks-") as out:
        payload = pickle.dumps({"backend": None, "rank": None, "world_size": None,
                                "out": out, "_target": (fn.__module__, fn.__qualname__, inspect.getfile(fn)), **kwargs})
        task = Task(__name__, inspect.getfile(run_in_ranks), _rank_entry.__qualname__, payload)
        pool = ctx.pool_manager().get(backend.name, world_size, pool_start_method(ctx, backend),
                                      env=_visible_devices_env(backend, world_size))
        result = pool.run(task)
        if result.status == "skipped":
            pytest.skip(result.message)
        if result.status != "passed":
            detail = ""
            if result.status == "failed":
                failing = next((o for o in result.outcomes if o.rank == result.rank), None)
                detail = "\n\n" + (failing.traceback if failing else "")
            elif result.stacks:
                detail = "\n" + "\n".join(f"--- rank {r} ---\n{text}" for r, text in sorted(result.stacks.items()))
            pytest.fail(f"{result.status} in {world_size} {backend.name} ranks: {result.message}{detail}", pytrace=False)
        values = []
        for rank in range(world_size):
            with open(os.path.join(out, f"rank{rank}.pkl"), "rb") as fh:
                values.append(pickle.load(fh))
        return values


def _rank_entry(backend: Any, rank: int, world_size: int, out: str, _target: tuple[str, str, str], **kwargs: Any) -> None:
    """Runs inside each rank: resolve the benchmark's rank function, call it, pickle its result."""
    import importlib
    import importlib.util
    import pickle
    import sys

    module_name, qualname, path = _target
    module = sys.modules.get(module_name)
    if module is None:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            spec = importlib.util.spec_from_file_location(module_name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
    target: Any = module
    for part in qualname.split("."):
        target = getattr(target, part)
    value = target(backend=backend, rank=rank, world_size=world_size, **kwargs)
    tmp = os.path.join(out, f".rank{rank}.pkl.tmp")
    with open(tmp, "wb") as fh:
        pickle.dump(value, fh)
    os.replace(tmp, os.path.join(out, f"rank{rank}.pkl"))
