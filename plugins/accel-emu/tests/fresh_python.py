"""Fresh Python processes for the tests, forked from a server process that has imported torch.

A test that needs a process of its own (other settings, a crash, exit-time behaviour) would pay for
importing torch again in each one: seconds of CPU on a small host. Instead one server per pytest
process (so per xdist worker) imports torch and nothing of emu or accel, and forks a child per run.
The child takes the caller's environment, working folder and arguments, runs the code as
``python -c`` does (a new ``__main__``, ``<string>`` as its file name) and ends through the normal
interpreter exit (atexit handlers, thread joins, an uncaught exception's traceback and exit code 1),
so its exit status, output and crashes are a real process's own.

Settings torch reads while it is imported cannot differ from the server's: a run whose environment
changes one (see ``IMPORT_TIME_PREFIXES``) gets a new interpreter instead, as does every run when
the server cannot start (no ``fork``).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

#: environment variables Python, the loader, OpenMP or torch read at start-up or while torch is imported:
#: a run that changes one is not forked (TORCHINDUCTOR_*, which torch sets at run time, are read later)
IMPORT_TIME_PREFIXES = ("PYTHON", "LD_", "MALLOC", "OMP_", "MKL_", "KMP_", "GOMP_", "TORCH_", "PYTORCH_",
                        "TORCHDYNAMO_", "CUDA_")

_SERVER = r"""
import json, os, select, sys, types
import torch  # what every child starts with

def _die_with_parent():
    try:
        import ctypes, signal
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except Exception:
        pass

def _send(message):
    os.write(1, (json.dumps(message) + "\n").encode())

def _child(request):
    # stdin, stdout and stderr become the run's own; the server's pipes are not inherited further
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY | os.O_CREAT),
                            (2, request["stderr"], os.O_WRONLY | os.O_CREAT)):
        opened = os.open(path, flags, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = ["-c", *request["args"]]
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    return compile(request["code"], "<string>", "exec", dont_inherit=True), main.__dict__

def _serve():
    _die_with_parent()
    _send({"ready": os.getpid()})
    pending, buffer = {}, b""
    while True:
        while pending:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            _send({"id": pending.pop(pid), "returncode": os.waitstatus_to_exitcode(status)})
        readable, _, _ = select.select([0], [], [], 0.01 if pending else None)
        if not readable:
            continue
        chunk = os.read(0, 1 << 16)
        if not chunk:
            return None  # the tests' process closed the pipe: stop
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                return _child(request)
            pending[pid] = request["id"]
            _send({"id": request["id"], "pid": pid})

_work = _serve()
if _work is None:
    sys.exit(0)
del _die_with_parent, _send, _child, _serve
exec(*_work)
"""


@dataclass
class _Job:
    id: int
    args: list[str]
    stdout: str
    stderr: str
    pid: int | None = None
    returncode: int | None = None


class ForkServer:
    """One server process and the runs it forked; see the module docstring."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._failed = False
        self._env: dict[str, str] = {}
        self._folder = ""
        self._jobs: dict[int, _Job] = {}
        self._next = 0
        self._buffer = b""
        self._lock = threading.Lock()

    def start(self, env: dict[str, str]) -> None:
        """Start the server with ``env`` (its torch import sees these settings); returns at once."""
        if self._proc is not None or self._failed:
            return
        if not hasattr(os, "fork"):
            self._failed = True
            return
        self._env = dict(env)
        self._folder = tempfile.mkdtemp(prefix="emu-fresh-python-")
        self._proc = subprocess.Popen([sys.executable, "-c", _SERVER], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, env=self._env, cwd=self._folder)
        atexit.register(self.close)

    def close(self) -> None:
        """Stop the server (its running children finish on their own) and remove its folder."""
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.stdin.close()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.stdout.close()
        if self._folder:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = ""

    def usable(self, env: dict[str, str]) -> bool:
        """Whether a run with ``env`` can be forked (the server runs and no import-time setting differs)."""
        if self._failed or self._proc is None:
            return False
        names = set(env) | set(self._env)
        return not any(env.get(n) != self._env.get(n) for n in names if n.startswith(IMPORT_TIME_PREFIXES))

    def run(self, runs: list[tuple[str, list[str], dict[str, str]]], timeout: float) -> list[subprocess.CompletedProcess]:
        """Fork one child per ``(code, args, env)``, all at once; wait for all of them.

        Raises ``subprocess.TimeoutExpired`` (after killing those still running) when they take
        longer than ``timeout`` seconds together."""
        with self._lock:
            jobs = [self._submit(code, args, env) for code, args, env in runs]
            deadline = time.monotonic() + timeout
            try:
                while any(job.returncode is None for job in jobs):
                    self._read(deadline - time.monotonic())
                    if time.monotonic() > deadline and any(job.returncode is None for job in jobs):
                        raise subprocess.TimeoutExpired([sys.executable, "-c", runs[0][0]], timeout)
            except BaseException:
                for job in jobs:
                    if job.pid is not None and job.returncode is None:
                        try:
                            os.kill(job.pid, signal.SIGKILL)
                        except OSError:
                            pass
                raise
            return [self._result(job, code) for job, (code, _, _) in zip(jobs, runs)]

    def _submit(self, code: str, args: list[str], env: dict[str, str]) -> _Job:
        self._next += 1
        base = os.path.join(self._folder, str(self._next))
        job = _Job(self._next, args, base + ".out", base + ".err")
        self._jobs[job.id] = job
        request = {"id": job.id, "code": code, "args": args, "env": env, "cwd": os.getcwd(),
                   "stdout": job.stdout, "stderr": job.stderr}
        self._proc.stdin.write((json.dumps(request) + "\n").encode())
        self._proc.stdin.flush()
        return job

    def _read(self, timeout: float) -> None:
        """Read the server's messages that arrive within ``timeout`` seconds."""
        fd = self._proc.stdout.fileno()
        readable, _, _ = select.select([fd], [], [], max(timeout, 0.0))
        if not readable:
            return
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            raise RuntimeError(f"the fork server ended (exit code {self._proc.wait()})")
        self._buffer += chunk
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            message = json.loads(line)
            if "ready" in message:
                continue
            job = self._jobs[message["id"]]
            if "pid" in message:
                job.pid = message["pid"]
            else:
                job.returncode = message["returncode"]

    def _result(self, job: _Job, code: str) -> subprocess.CompletedProcess:
        del self._jobs[job.id]
        outputs = []
        for path in (job.stdout, job.stderr):
            with open(path, errors="replace") as fh:
                outputs.append(fh.read())
            os.unlink(path)
        return subprocess.CompletedProcess([sys.executable, "-c", code, *job.args], job.returncode, *outputs)


SERVER = ForkServer()
