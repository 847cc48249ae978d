"""Names several parts of accel share, in a torch-free module (the pytest plugin reads it at start-up).

``BUILTIN_BACKENDS``: accel's built-in backends in probe order, as ``accel.backends.builtin`` registers
them (a test checks the two agree).
"""

from __future__ import annotations

__all__ = ["BUILTIN_BACKENDS"]

BUILTIN_BACKENDS = ("cuda", "xpu", "hpu", "mps", "npu", "mlu", "musa", "sdaa", "neuron", "xla", "cpu")
