"""Small helpers shared by the conformance suites (not a test module: pytest does not collect it).

The suites folder is a plain folder, so pytest puts it on ``sys.path`` and the suites import this
module as ``_suite_utils``; ranks of multi-process tests inherit that path.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from accel.backends.base import UnsupportedFeatureError


def contract_call(feature: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[bool, Any]:
    """Call one Backend method the way the contract allows: an answer, or UnsupportedFeatureError.

    Returns ``(True, value)`` for an answer and ``(False, error)`` for a stated lack of support
    (whose reason must not be empty); any other exception fails the test naming ``feature``.
    """
    try:
        return True, call(*args, **kwargs)
    except UnsupportedFeatureError as exc:
        assert isinstance(exc.reason, str) and exc.reason.strip(), f"{feature}: UnsupportedFeatureError without a reason"
        assert exc.feature, f"{feature}: UnsupportedFeatureError without the feature's name"
        return False, exc
    except Exception as exc:
        raise AssertionError(
            f"{feature} raised {type(exc).__name__}: {exc} -- the Backend contract allows an answer or "
            f"UnsupportedFeatureError with a reason, nothing else"
        ) from exc


def per_rank(value: Any) -> list[Any]:
    """Every rank's ``value``, in rank order (a one-element list on one process)."""
    from accel.utils.operations import gather_object

    return list(gather_object([value]))


def expected_device(backend: Any, rank: int) -> torch.device:
    """The device a rank runs on: its own device, or the one shared device where ranks share it."""
    count = backend.device_count()
    return backend.device(rank % count if count else None)


def to_host_list(tensor: torch.Tensor) -> list:
    """Python numbers of a tensor on any device (bf16 goes through float32: NumPy has no bf16)."""
    tensor = tensor.detach().to("cpu")
    if tensor.dtype in (torch.bfloat16, torch.float16):
        tensor = tensor.float()
    return tensor.tolist()


def run_in_ranks(config: Any, backend: Any, world_size: int, fn: Callable[..., None], **kwargs: Any) -> None:
    """Run the module-level function ``fn`` in the harness's ``world_size`` ranks of ``backend``, as a
    multi-process test's body runs (its ``device``, ``rank`` and ``world_size`` parameters are the
    rank's own; ``kwargs`` must pickle). For a fixture that makes what a test at another world size
    needs; skips as a test of that world size would, and fails with the failing rank's traceback."""
    import inspect
    import pickle

    import pytest

    from accel_harness import markers
    from accel_harness.distributed import RANK_LOCAL_ARGS, Task
    from accel_harness.plugin import _context, _visible_devices_env
    from accel_harness.rank_runs import pool_start_method

    reason = markers.evaluate([], backend, world_size=world_size)
    if reason is not None:
        pytest.skip(markers.format_skip(reason))
    local = {name: None for name in RANK_LOCAL_ARGS if name in inspect.signature(fn).parameters}
    task = Task(fn.__module__, inspect.getfile(fn), fn.__qualname__, pickle.dumps({**local, **kwargs}))
    ctx = _context(config)
    pool = ctx.pool_manager().get(backend.name, world_size, pool_start_method(ctx, backend),
                                  env=_visible_devices_env(backend, world_size))
    result = pool.run(task)
    if result.status == "skipped":
        pytest.skip(result.message)
    if result.status == "xfailed":
        pytest.xfail(result.message)
    if result.status != "passed":
        failing = next((o for o in result.outcomes if o.rank == result.rank), None)
        detail = failing.traceback if failing is not None and failing.traceback else \
            "\n".join(f"--- rank {r} ---\n{text}" for r, text in sorted(result.stacks.items()))
        pytest.fail(f"{fn.__name__} in {world_size} {backend.name} ranks: {result.status}: {result.message}\n{detail}",
                    pytrace=False)
