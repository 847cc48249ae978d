"""Work around an exit-time abort in torch's autograd engine for devices with worker threads.

torch stashes a Python object (the caller's ``contextvars`` context) in each backward pass's
thread-local state. A device's autograd worker thread holds the finished pass until just after it
wakes the caller, and then drops it, which needs the GIL. If the caller's interpreter has begun to
finalize by then, the worker is terminated while unwinding a destructor and the whole process aborts
("terminate called without an active exception", exit code 134) after its work is done.

:func:`settle` runs at exit while Python is still whole: a one-element backward on each emu device
whose worker thread exists, run straight on the engine (without the stash), queues behind the
previous pass's release and returns once the worker is past it.
"""

from __future__ import annotations

import os

#: how torch names the autograd worker thread of device index N
_THREAD_PREFIX = "pt_autograd_"


def worker_devices() -> list[int]:
    """Device indices whose autograd worker thread runs in this process (Linux; empty elsewhere)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return []
    found = set()
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as fh:
                name = fh.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        if name.startswith(_THREAD_PREFIX) and name[len(_THREAD_PREFIX):].isdigit():
            found.add(int(name[len(_THREAD_PREFIX):]))
    return sorted(found)


def settle() -> None:
    """Let every emu autograd worker release its last backward pass before the interpreter finalizes."""
    devices = worker_devices()
    if not devices:
        return
    import torch
    from torch.autograd.variable import Variable

    from . import DEVICE_TYPE

    count = torch.emu.device_count()  # type: ignore[attr-defined]
    for index in devices:
        if index >= count:
            continue
        device = torch.device(DEVICE_TYPE, index)
        with torch.enable_grad():
            leaf = torch.zeros(1, device=device, requires_grad=True)
            root = (leaf * 1).sum()
        # the engine itself: torch.autograd.backward would stash a Python object again
        Variable._execution_engine.run_backward((root,), (torch.ones((), device=device),), False, False, (), True, True)
