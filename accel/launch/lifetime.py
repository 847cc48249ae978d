"""A child process that must not outlive its parent: the kernel's parent-death signal (Linux ``prctl``).

One set-up for every process accel starts and owns: the ranks of `accel launch` (armed by their
bootstrap) and the harness's rank pools. Elsewhere (macOS, Windows) nothing is armed and the callers
fall back on their own means (the harness's ranks see their pipe close).
"""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["PR_SET_CHILD_SUBREAPER", "PR_SET_PDEATHSIG", "die_with_parent", "prctl"]

#: Linux prctl options (include/uapi/linux/prctl.h)
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def prctl(option: int, value: int) -> bool:
    """``prctl(option, value)`` on Linux; False where it is missing or refused."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent(parent_pid: int | None = None) -> bool:
    """Make the kernel kill this process (SIGKILL) when its parent dies, whatever killed the parent
    (SIGKILL included), so no child is left running without an owner; True when the signal is armed.

    With ``parent_pid``, a process whose parent is no longer that one -- it died before the signal was
    armed, and the process was handed to another -- exits at once with status 1.
    """
    if not prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL)):
        return False
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)
    return True
