"""A stand-in ``deepspeed`` package for tests: its accelerator choice without DeepSpeed installed."""

from __future__ import annotations

import functools
import os
import textwrap
from pathlib import Path

FAKE_DEEPSPEED = {
    "deepspeed/__init__.py": "__version__ = '9.9.9'\n",
    "deepspeed/accelerator/__init__.py": textwrap.dedent("""
        import os

        class FakeAccelerator:
            def __init__(self, name, comm):
                self._name, self._comm = name, comm
            def device_name(self):
                if os.environ.get("FAKE_DS_CRASH"):
                    raise RuntimeError("no driver found")
                return self._name
            def communication_backend_name(self):
                return self._comm

        COMM = {"cpu": "gloo", "cuda": "nccl", "xpu": "ccl", "hpu": "hccl"}

        def get_accelerator():
            name = os.environ.get("DS_ACCELERATOR") or "cuda"  # like old DeepSpeed: cuda unless told
            return FakeAccelerator(name, COMM.get(name))
    """),
}


def install_fake_deepspeed(folder: Path, monkeypatch) -> Path:
    """Write the stand-in under ``folder`` and put it first on the path of this process and its children."""
    for relative, text in FAKE_DEEPSPEED.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    monkeypatch.syspath_prepend(str(folder))
    # what DeepSpeed supports is read once per process: the stand-in gets its own cache, and the real
    # one's (filled or not) comes back after the test
    from accel.backends import deepspeed_agreement

    monkeypatch.setattr(deepspeed_agreement, "deepspeed_accelerator_types",
                        functools.lru_cache(maxsize=None)(deepspeed_agreement.deepspeed_accelerator_types.__wrapped__))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")])))
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    return folder
