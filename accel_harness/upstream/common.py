"""What every step of an upstream run shares: its error, running a command, naming a distribution."""

from __future__ import annotations

import os
import re
import subprocess
from typing import Mapping, Sequence

class UpstreamError(RuntimeError):
    """An upstream suite cannot be fetched, found or run (the message says which and why)."""


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _run(cmd: Sequence[str], *, cwd: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None,
         timeout: float | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), cwd=cwd, env=dict(env) if env is not None else None, capture_output=True,
                          text=True, timeout=timeout, check=False)


def _tail(text: str, lines: int = 3) -> str:
    kept = [line for line in (text or "").strip().splitlines() if line.strip()]
    return " | ".join(kept[-lines:])
