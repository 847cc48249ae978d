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
