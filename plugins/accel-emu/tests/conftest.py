"""The emu tests run in a process that has loaded emu (and subprocesses for other settings)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

accel_emu = pytest.importorskip("accel_emu", reason="accel-emu is not installed (pip install -e plugins/accel-emu)")

import torch  # noqa: E402

accel_emu.load()

#: generous: the extension is already built, but a loaded 2-core machine starts python slowly
SUBPROCESS_TIMEOUT = 300


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = SUBPROCESS_TIMEOUT) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with ``env`` added; returns the completed process."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCEL_EMU_", "EMU_VISIBLE"))}
    if "ACCEL_EMU_BUILD_DIR" in os.environ:
        full_env["ACCEL_EMU_BUILD_DIR"] = os.environ["ACCEL_EMU_BUILD_DIR"]
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def emu() -> object:
    """The ``torch.emu`` module, with both devices' peaks reset and caches emptied."""
    torch.emu.synchronize(0)
    torch.emu.synchronize(1)
    torch.emu.empty_cache()
    for i in range(torch.emu.device_count()):
        torch.emu.reset_peak_memory_stats(i)
    return torch.emu
