"""The bootstrap every rank of `accel launch` runs: ``python -u -m accel.launch.bootstrap [--module] TARGET ARGS``.

It runs the script (or module) as ``__main__`` the way python would and, when it raises, records the
moment it failed (:func:`accel.launch.heartbeat.record_failure`, before anything a peer could notice)
and the exception in torch elastic's per-rank error file. It arms the kernel to kill the rank when
the launcher dies, starts the rank's heartbeat, and ends the rank without the interpreter's C++
teardown, which can abort a rank that already succeeded.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from accel.launch import heartbeat
from accel.launch.lifetime import die_with_parent

__all__ = ["BOOTSTRAP_FILE", "LAUNCHER_PID_ENV", "RUNPY_FILE", "worker_main"]

#: the launcher's pid, so a rank started after the launcher died exits at once
LAUNCHER_PID_ENV = "ACCEL_LAUNCHER_PID"
#: this file and runpy's: their frames are dropped from the tracebacks `accel launch` prints
BOOTSTRAP_FILE = os.path.abspath(__file__)
RUNPY_FILE = os.path.join(os.path.dirname(os.__file__), "runpy.py")


def _trim(tb: Any) -> Any:
    """Drop the bootstrap's and runpy's frames from the front of a traceback."""
    def bootstrap(filename: str) -> bool:
        return filename == "<frozen runpy>" or os.path.abspath(filename) in (BOOTSTRAP_FILE, RUNPY_FILE)

    while tb is not None and bootstrap(tb.tb_frame.f_code.co_filename) and tb.tb_next is not None:
        tb = tb.tb_next
    return tb


def _record_error(exc: BaseException) -> None:
    """Write ``exc`` to torch elastic's error file for this rank (TORCHELASTIC_ERROR_FILE), whole or not at all.

    The agent reads a failed rank's file as soon as it sees the failure, and fails the whole launch on a file
    it cannot parse: a rank that fails while a peer dies would otherwise be read half-written. The error is
    written to a file beside it, which then takes the error file's name."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    partial = f"{path}.{os.getpid()}.partial"
    try:
        from torch.distributed.elastic.multiprocessing.errors import get_error_handler

        os.environ["TORCHELASTIC_ERROR_FILE"] = partial  # where torch's handler writes
        try:
            get_error_handler().record_exception(exc)
        finally:
            os.environ["TORCHELASTIC_ERROR_FILE"] = path
        os.replace(partial, path)
    except Exception as record_exc:  # the report must not hide the real error
        print(f"accel launch: could not record the error: {record_exc}", file=sys.stderr)


def worker_main(argv: list[str]) -> None:
    """Run ``[--module] TARGET ARGS...`` as ``__main__`` the way python would, recording failures."""
    import runpy
    import traceback

    module = bool(argv) and argv[0] == "--module"
    if module:
        argv = argv[1:]
    if not argv:
        sys.exit("accel.launch.bootstrap: nothing to run (this module is the bootstrap of `accel launch`)")
    target, rest = argv[0], argv[1:]
    sys.argv = [target, *rest]
    _die_with_launcher()
    heartbeat.start()
    try:
        if module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path[0] = os.path.dirname(os.path.abspath(target))  # as `python script.py` does
            runpy.run_path(target, run_name="__main__")
    except SystemExit as exc:
        status = _exit_status(exc.code)
        if status:
            heartbeat.record_failure()
        _finish(status)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        heartbeat.record_failure()  # first: the moment of failure, before anything a peer could notice
        _record_error(exc)
        traceback.print_exception(type(exc), exc, _trim(exc.__traceback__))
        _finish(1)
    _finish(0)


def _die_with_launcher() -> None:
    """Tie this rank's life to the launcher's (:func:`accel.launch.lifetime.die_with_parent`); a rank whose
    launcher is already gone exits at once."""
    expected = os.environ.get(LAUNCHER_PID_ENV)
    if expected and expected.isdigit():
        die_with_parent(int(expected))


def _exit_status(code: Any) -> int:
    """``sys.exit``'s argument as a process status, as the interpreter would turn it into one."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _finish(status: int) -> None:
    """End the rank: close the process group, run the script's atexit handlers, flush, and leave
    without the interpreter's C++ teardown. With torch 2.13, gloo's threads can still be joinable
    when static destructors run, which aborts a rank that already succeeded ("terminate called
    without an active exception", SIGABRT) and fails the whole launch."""
    import atexit

    _close_process_group()
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(status)


def _close_process_group() -> None:
    """Destroy a process group the script left open.

    A process that exits with a live gloo group can abort in torch's C++ teardown ("terminate called
    without an active exception", SIGABRT) long after the script succeeded; scripts written for
    Accelerate rarely destroy their group. Only looked at when the script imported torch.distributed.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return
    try:
        if dist.is_available() and dist.is_initialized():
            import gc

            # objects such as a DDP reducer keep the C++ group alive past destroy_process_group;
            # free them first so the group's threads are joined now, not in interpreter teardown
            gc.collect()
            dist.destroy_process_group()
    except Exception as exc:
        print(f"accel launch: could not destroy the process group at exit: {type(exc).__name__}: {exc}", file=sys.stderr)


if __name__ == "__main__":
    worker_main(sys.argv[1:])
