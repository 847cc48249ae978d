"""Only ``accel/backends/`` may touch a device module; everything else asks the backend.

The patterns are assembled from pieces so that this file does not match itself; it is also
excluded by path, so either safeguard alone is enough.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path
from typing import Iterable

REPO_ROOT = Path(__file__).resolve().parents[2]
SCANNED_DIRS = ("accel", "accel_harness", "accel_reports", "ci", "suites", "tests")
EXEMPT_DIR = Path("accel", "backends")

_DEVICES = "(cuda|xpu|mps|hpu|npu)"
# attribute access or import of a device module: torch.<device>
_ATTRIBUTE = "torch" + r"\." + _DEVICES + r"\b"
# the Intel Gaudi bridge package
_GAUDI = "habana" + "_frameworks"
# `from torch import <device>` (possibly among other names)
_FROM_IMPORT = r"^\s*from\s+torch\s+import\s+[^#\n]*\b" + _DEVICES + r"\b"

DEVICE_MODULE_PATTERN = re.compile("|".join([_ATTRIBUTE, _GAUDI, _FROM_IMPORT]))


def find_device_module_references(root: Path, dirs: Iterable[str] = SCANNED_DIRS,
                                  exclude: Iterable[Path] = ()) -> list[str]:
    """``path:line: text`` for each line under ``root/dirs`` that names a device module.

    Files under ``root/accel/backends`` and the paths in ``exclude`` are skipped.
    """
    root = root.resolve()
    exempt = root / EXEMPT_DIR
    skipped = {Path(p).resolve() for p in exclude}
    hits: list[str] = []
    for top in dirs:
        base = root / top
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*.py")):
            resolved = path.resolve()
            if resolved in skipped or resolved.is_relative_to(exempt):
                continue
            if any(part in {".venv", "__pycache__", ".git"} for part in path.relative_to(root).parts):
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            for lineno, (line, code) in enumerate(zip(text.splitlines(), _code_only(text).splitlines()), start=1):
                if DEVICE_MODULE_PATTERN.search(code):
                    hits.append(f"{path.relative_to(root).as_posix()}:{lineno}: {line.strip()}")
    return hits


def _code_only(text: str) -> str:
    """``text`` with string literals and comments blanked (same lines): quoted error messages are data."""
    lines = text.splitlines(keepends=True)
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):
        return text
    blank = [list(line) for line in lines]
    for tok in tokens:
        if tok.type not in (tokenize.STRING, tokenize.COMMENT) and not getattr(tokenize, "FSTRING_MIDDLE", None) == tok.type:
            continue
        (srow, scol), (erow, ecol) = tok.start, tok.end
        for row in range(srow, erow + 1):
            chars = blank[row - 1]
            start = scol if row == srow else 0
            end = ecol if row == erow else len(chars)
            for i in range(start, min(end, len(chars))):
                if chars[i] != "\n":
                    chars[i] = " "
    return "".join("".join(chars) for chars in blank)


def test_no_device_module_outside_backends():
    scanned = [d for d in SCANNED_DIRS if (REPO_ROOT / d).is_dir()]
    assert "accel" in scanned and "tests" in scanned  # the scan looks where it should
    hits = find_device_module_references(REPO_ROOT, scanned, exclude=[Path(__file__)])
    assert not hits, (
        "only accel/backends/ may reference device modules; ask the active backend instead:\n  "
        + "\n  ".join(hits)
    )


def test_backends_themselves_do_reference_device_modules():
    """Sanity check of the pattern against the one place that is allowed to match."""
    backends_dir = REPO_ROOT / EXEMPT_DIR
    matched = [p.name for p in sorted(backends_dir.glob("*.py"))
               if DEVICE_MODULE_PATTERN.search(p.read_text(encoding="utf-8"))]
    assert matched, "the pattern matches nothing even in accel/backends: it is broken"


def test_this_file_would_not_match_itself():
    own = Path(__file__).read_text(encoding="utf-8")
    assert not DEVICE_MODULE_PATTERN.search(own)


def test_checker_catches_violations(tmp_path):
    device = "cu" + "da"
    gaudi = "habana" + "_frame" + "works"
    (tmp_path / "accel_harness").mkdir()
    (tmp_path / "accel_harness" / "bad.py").write_text(
        "import torch\n"
        f"if torch.{device}.is_available():\n"
        "    pass\n"
        f"import {gaudi}.torch.core\n"
    )
    (tmp_path / "accel_harness" / "imports.py").write_text(f"from torch import nn, {device}\n")
    (tmp_path / "accel_reports").mkdir()
    (tmp_path / "accel_reports" / "nested").mkdir()
    (tmp_path / "accel_reports" / "nested" / "deep.py").write_text("x = 1\n" * 4 + "y = torch.x" + "pu.device_count()\n")
    (tmp_path / "accel_reports" / "clean.py").write_text(
        "import torch\n"
        f"v = torch.version.{device}\n"  # a version string, not the device module
        f"w = torch.{device}rt\n"  # a different name
        f"backend_name = '{device}'\n"
        f"message = \"module 'torch.{device}' has no attribute 'x'\"  # quoted upstream error text is data\n"
        f"# from torch import nn  # {device} mentioned in a comment only after the import list\n"
    )
    allowed = tmp_path / "accel" / "backends"
    allowed.mkdir(parents=True)
    (allowed / "cuda_like.py").write_text(f"import torch\nm = torch.{device}\n")
    excluded = tmp_path / "tests" / "test_excluded.py"
    excluded.parent.mkdir()
    excluded.write_text(f"import torch\nm = torch.mp" + "s\n")
    (tmp_path / "notscanned").mkdir()
    (tmp_path / "notscanned" / "x.py").write_text(f"import torch\nm = torch.{device}\n")

    hits = find_device_module_references(tmp_path, exclude=[excluded])
    locations = [h.split(": ", 1)[0] for h in hits]
    assert locations == [
        "accel_harness/bad.py:2",
        "accel_harness/bad.py:4",
        "accel_harness/imports.py:1",
        "accel_reports/nested/deep.py:5",
    ], hits
    assert hits[0].endswith(f"if torch.{device}.is_available():")
    # without the exclusion the excluded file is reported too
    assert "tests/test_excluded.py:2" in [
        h.split(": ", 1)[0] for h in find_device_module_references(tmp_path)
    ]
