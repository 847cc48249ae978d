"""A device profile's hooks are first run in a short-lived child process, so that one cannot end accel's.

A profile is code: loading it imports every module its hooks name (or executes its ``.py`` device
spec) and the backend calls those hooks in accel's own process. A hook that calls ``os.abort()``,
``sys.exit(3)`` or never returns would end or freeze ``accel qualify`` with no word of why. So before
accel imports anything a profile names, :func:`check_hooks` runs one child process (with the
parent's ``sys.path``, importing nothing of accel) that imports and resolves every hook, then calls
them the way a run first does: ``is_available()``, ``device_count()`` and, only when those find a
device, the device hooks on device 0 (``seed(0)``, ``get_rng_state``, ``set_rng_state`` with the state
just read, ``synchronize``, the memory statistics, ``empty_cache``). A child that is killed by a signal,
exits, or prints nothing for :data:`TIMEOUT_ENV` seconds (default 60) while a hook runs becomes a
:class:`HookCheckError` naming the hook and what happened. A hook that merely raises is not an error
here (the run reports it where the hook is used), except while its module is imported.

A profile that checked clean is not checked again in this process or in its children (ranks, pytest
under ``accel qualify``): its path and the hash of its bytes go into :data:`CHECKED_ENV`; nothing is
written to disk, so nothing outlives the run.
"""

from __future__ import annotations

import hashlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping

__all__ = ["CHECKED_ENV", "DEFAULT_TIMEOUT", "HookCheckError", "TIMEOUT_ENV", "check_hooks", "hook_timeout"]

#: seconds a hook may run in the check without any output before it counts as hung
TIMEOUT_ENV = "ACCEL_PROFILE_HOOK_TIMEOUT"
DEFAULT_TIMEOUT = 60.0
#: set by accel for its own child processes: the profile (path and content hash) already checked
CHECKED_ENV = "ACCEL_PROFILE_HOOKS_CHECKED"

_CHILD = Path(__file__).with_name("_hook_check_child.py")
_TAIL = 1500  # characters of the child's output kept for an error message


class HookCheckError(Exception):
    """A hook (or the device spec, ``hook`` None) ended, killed or froze the check process."""

    def __init__(self, message: str, hook: str | None = None):
        self.hook = hook
        super().__init__(message)


def hook_timeout() -> float:
    """The check's silence limit in seconds: :data:`TIMEOUT_ENV`, else :data:`DEFAULT_TIMEOUT`."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise HookCheckError(f"{TIMEOUT_ENV} must be a number of seconds above 0, got {raw!r}")
    return value


def _token(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha256(str(path.resolve()).encode() + b"\0" + data).hexdigest()[:32]


def check_hooks(path: Path, hooks: Mapping[str, str] | None = None, spec_file: bool = False) -> None:
    """Run ``hooks`` (``name -> "module:function"``), or the device spec at ``path``, in a child first.

    Raises :class:`HookCheckError` when a hook aborts, exits or hangs there; returns quietly otherwise,
    also for names that cannot be imported (the caller's own import words that error)."""
    path = Path(path)
    if not spec_file and not hooks:
        return  # nothing the profile names runs code
    try:
        token = _token(path)
    except OSError:
        token = None
    if token is not None and token in os.environ.get(CHECKED_ENV, "").split(os.pathsep):
        return
    timeout = hook_timeout()
    steps, tail, status, timed_out = _run_child(
        {"sys_path": list(sys.path), "hooks": dict(hooks or {}), "spec_file": str(path) if spec_file else None}, timeout)
    _judge(steps, tail, status, timed_out, timeout, dict(hooks or {}), spec_file)
    if token is not None:
        seen = [t for t in os.environ.get(CHECKED_ENV, "").split(os.pathsep) if t]
        os.environ[CHECKED_ENV] = os.pathsep.join([*seen[-7:], token])


def _run_child(payload: dict[str, Any], timeout: float) -> tuple[list[dict[str, Any]], str, int | None, bool]:
    """Run the child; its reports, the tail of its output, its exit status and whether it was stopped."""
    read_fd, write_fd = os.pipe()
    payload["fd"] = write_fd
    code = "import sys; p = sys.argv[2]; exec(compile(open(p, encoding='utf-8').read(), p, 'exec'))"
    try:
        child = subprocess.Popen([sys.executable, "-c", code, json.dumps(payload), str(_CHILD)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 pass_fds=(write_fd,), start_new_session=True)
    finally:
        os.close(write_fd)
    steps: list[dict[str, Any]] = []
    tail, pending, timed_out = "", b"", False
    selector = selectors.DefaultSelector()
    report = os.fdopen(read_fd, "rb", buffering=0)
    assert child.stdout is not None
    selector.register(report, selectors.EVENT_READ, "report")
    selector.register(child.stdout, selectors.EVENT_READ, "output")
    # until the child's first report it is only starting Python: not a hook's time, so a tiny limit still works
    deadline = time.monotonic() + max(timeout, DEFAULT_TIMEOUT)
    try:
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            report_done = (report.fileno() not in {k.fd for k in selector.get_map().values()}
                           or any(step.get("end") for step in steps))
            if report_done and child.poll() is not None:
                left = 0  # the child is gone: take what output is there, not what a leftover grandchild may hold
            events = selector.select(timeout=min(left, 0.25) if report_done else left)
            if not events and report_done and child.poll() is not None:
                break
            for key, _ in events:
                chunk = os.read(key.fileobj.fileno(), 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                if key.data == "report" or steps:  # output is progress (a first build prints a line now and then)
                    deadline = time.monotonic() + timeout
                if key.data == "report":
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    steps.extend(json.loads(line) for line in lines if line.strip())
                else:
                    text = chunk.decode("utf-8", errors="replace")
                    sys.stderr.write(text)
                    tail = (tail + text)[-_TAIL:]
        if timed_out:
            _kill(child)
        status = child.wait()
        _kill_group(child.pid)  # whatever a hook started in the check goes with it
    except BaseException:
        _kill(child)
        raise
    finally:
        selector.close()
        report.close()
        child.stdout.close()
        if child.stdin is not None:
            child.stdin.close()
    return steps, tail, status, timed_out


def _kill(child: subprocess.Popen) -> None:
    if not _kill_group(child.pid):
        child.kill()
    child.wait()


def _kill_group(pid: int) -> bool:
    """Kill the check's process group (the child leads its own session, so its own children go too)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        return False
    return True


def _judge(steps: list[dict[str, Any]], tail: str, status: int | None, timed_out: bool, timeout: float,
           hooks: dict[str, str], spec_file: bool) -> None:
    """Raise for the step the child was in when it died, exited or hung; or for a hook whose import raised."""
    for step in steps:
        if "raised" in step and step.get("phase") == "import":
            name = step["raised"]
            raise HookCheckError(f"importing {hooks.get(name, name)!r} raised {step['error']} (in the hook check, a child process)", name)
    if not timed_out and status == 0 and any(s.get("end") for s in steps):
        return
    open_steps = [s for s in steps if "step" in s]
    finished = {s.get("done") or s.get("raised") or s.get("unresolved") for s in steps}
    current = next((s for s in reversed(open_steps) if s["step"] not in finished), open_steps[-1] if open_steps else None)
    name = current["step"] if current else None
    if name == "spec" or (name is None and spec_file):
        who, hook = "executing the device spec", None
    elif name is None:
        who, hook = "starting the check process", None
    else:
        target = hooks.get(name) or "the device spec's function"
        doing = "importing" if current.get("what") == "import" else "calling"
        who, hook = f"{doing} {target!r}", name
    if timed_out:
        what = (f"gave no sign of progress for {timeout:g} s and was stopped "
                f"(a slower hook needs {TIMEOUT_ENV}=SECONDS)")
    elif status is not None and status < 0:
        try:
            signame = signal.Signals(-status).name
        except ValueError:
            signame = f"signal {-status}"
        what = f"killed it with {signame}"
    else:
        what = f"ended it with exit status {status}"
    last = tail.strip().splitlines()[-1:] if tail.strip() else []
    message = (f"{who} in the hook check (a child process accel runs before it loads a profile's code) {what}; "
               "a profile is code: see 'Trust model' in docs/profile.md")
    if last:
        message += f"; last output: {last[0][:200]}"
    raise HookCheckError(message, hook)
