"""The emu tests run in a process that has loaded emu, and in fresh processes for other settings
(forked from a server that has imported torch: :mod:`fresh_python`)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

accel_emu = pytest.importorskip("accel_emu", reason="accel-emu is not installed (pip install -e plugins/accel-emu)")

import torch  # noqa: E402

accel_emu.load()

from fresh_python import SERVER  # noqa: E402

#: generous: the extension is already built, but a loaded 2-core machine starts python slowly
SUBPROCESS_TIMEOUT = 300


def _child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without emu's settings (the build folder stays), with ``env`` added."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCEL_EMU_", "EMU_VISIBLE"))}
    if "ACCEL_EMU_BUILD_DIR" in os.environ:
        full_env["ACCEL_EMU_BUILD_DIR"] = os.environ["ACCEL_EMU_BUILD_DIR"]
    full_env.update(env or {})
    return full_env


SERVER.start(_child_env())  # imports torch in the background while the first tests run


def run_pythons(code: str, args: list[list[str]], env: dict[str, str] | None = None,
                timeout: float = SUBPROCESS_TIMEOUT) -> list[subprocess.CompletedProcess]:
    """Run ``code`` as ``python -c code ARGS`` once per entry of ``args``, all at once, each with
    ``env`` added; returns the completed processes in that order.

    The processes are forked from a server that has imported torch (:mod:`fresh_python`)."""
    code = textwrap.dedent(code)
    full_env = _child_env(env)
    if SERVER.usable(full_env):
        return SERVER.run([(code, list(a), full_env) for a in args], timeout)
    procs = [subprocess.Popen([sys.executable, "-c", code, *a], env=full_env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for a in args]
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = SUBPROCESS_TIMEOUT) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with ``env`` added; returns the completed process."""
    (result,) = run_pythons(code, [[]], env, timeout)
    return result


@pytest.fixture
def emu() -> object:
    """The ``torch.emu`` module, with both devices' peaks reset and caches emptied."""
    torch.emu.synchronize(0)
    torch.emu.synchronize(1)
    torch.emu.empty_cache()
    for i in range(torch.emu.device_count()):
        torch.emu.reset_peak_memory_stats(i)
    return torch.emu
