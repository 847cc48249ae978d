"""Backend names: the built-in backends, in the order ``accel.backends.builtin`` registers them.

The registry registers exactly these (a test checks the two agree); the pytest plugin reads the tuple
at start-up without importing torch.
"""

from __future__ import annotations

__all__ = ["BUILTIN_BACKENDS", "HOST_BACKEND"]

#: built-in backends in registration order; the host cpu is last, the fallback when no accelerator answers
BUILTIN_BACKENDS: tuple[str, ...] = ("cuda", "xpu", "hpu", "mps", "npu", "mlu", "musa", "sdaa", "neuron", "xla", "cpu")

#: the backend that is always present (the host)
HOST_BACKEND = "cpu"
