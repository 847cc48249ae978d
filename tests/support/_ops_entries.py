"""OpInfo entries that misbehave on their second call (the sweep calls the host first, then the
device), to prove that the operator sweep survives crashes and hangs and names every failure."""

from __future__ import annotations

import os
import signal
import time

import torch
from torch.testing import make_tensor
from torch.testing._internal.opinfo.core import OpInfo, SampleInput

_calls = {"count": 0}


def _second_call(misbehave):
    def op(x):
        _calls["count"] += 1
        if _calls["count"] % 2 == 0:
            return misbehave(x)
        return x * 2

    return op


def _crash(x):
    os.kill(os.getpid(), signal.SIGSEGV)


def _hang(x):
    time.sleep(3600)


def _raise(x):
    raise RuntimeError("device says no")


def _no_dtype(x):
    raise NotImplementedError("\"demo_kernel\" not implemented for 'Float'")


def _samples(op, device, dtype, requires_grad, **kwargs):
    for size in ((3,), (2, 2)):
        yield SampleInput(make_tensor(size, device=device, dtype=dtype, low=-1, high=1))


def _entry(name, misbehave):
    return OpInfo(name, op=_second_call(misbehave), dtypes=(torch.float32,), sample_inputs_func=_samples,
                  supports_out=False, supports_autograd=False)


entries = [
    _entry("accel_test.good", lambda x: x * 2),
    _entry("accel_test.wrong", lambda x: x * 2 + 1),
    _entry("accel_test.crash", _crash),
    _entry("accel_test.hang", _hang),
    _entry("accel_test.raises", _raise),
    _entry("accel_test.no_dtype", _no_dtype),
]
