"""A small matrix file for the ci tests, and helpers to write variants of it."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # `ci` is a folder of the checkout, not an installed package
    sys.path.insert(0, str(REPO))

SMALL_MATRIX = """\
version: 1
defaults:
  python: ["3.11"]
  bench: quick
backends:
  cpu:
    runner: [ubuntu-latest]
    comm: gloo
    world_sizes: [1, 2, 4]
    python: ["3.11", "3.12"]
    workers: 2
  cuda:
    runner: [self-hosted, linux, gpu-nvidia]
    comm: nccl
    world_sizes: [1, 2]
    bench: full
  hpu:
    runner: [self-hosted, gaudi]
    comm: hccl
    world_sizes: [1, 2]
    setup_python: false
torch:
  "2.13.0":
    install:
      "*": {index_url: "https://download.pytorch.org/whl/cpu"}
      cuda: {index_url: "https://download.pytorch.org/whl/cu130"}
      hpu: preinstalled
  "2.14.1":
    install:
      "*": {index_url: "https://download.pytorch.org/whl/cpu"}
  nightly:
    enabled: false
    install:
      "*": {requirement: torch, pre: true, index_url: "https://download.pytorch.org/whl/nightly/cpu"}
exclude:
  - backend: hpu
    torch: ["2.14.1", nightly]
    reason: the image ships 2.13.0
  - backend: cpu
    python: "3.12"
    world_sizes: [4]
profiles:
  local:
    install: {requirement: "torch=={torch}"}
"""


def write(tmp_path: Path, text: str, name: str = "matrix.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def line_of(text: str, needle: str) -> int:
    """1-based line of the first line containing ``needle``."""
    for number, line in enumerate(text.splitlines(), 1):
        if needle in line:
            return number
    raise AssertionError(f"{needle!r} not in the text")
