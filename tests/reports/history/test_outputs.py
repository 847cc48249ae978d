"""Output paths that cannot be made or written: `accel report -o` and `--history` say so in one
line and exit 2, before anything is imported or rendered (accel_reports.history.outputs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from accel_reports.history.outputs import OutputPathError, writable_folder

from _report_data import rec, run_file


def _report(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "accel.commands.cli", "report", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "CI": ""})


def _unwritable(tmp_path: Path, kind: str) -> Path:
    """A folder path that cannot be made: under a file, in a read-only folder, on a read-only file system."""
    if kind == "under-a-file":
        (tmp_path / "afile").write_text("a file, not a folder")
        return tmp_path / "afile" / "out"
    if kind == "read-only-folder":
        if os.geteuid() == 0:
            pytest.skip("root writes into read-only folders; the read-only file system case covers root")
        (tmp_path / "ro").mkdir()
        (tmp_path / "ro").chmod(0o555)
        return tmp_path / "ro" / "out"
    if not Path("/sys/fs").is_dir():
        pytest.skip("no /sys/fs (not Linux): no read-only file system to write into")
    return Path("/sys/fs/accel-report-test-out")


KINDS = ["under-a-file", "read-only-folder", "read-only-file-system"]


@pytest.mark.parametrize("kind", KINDS)
def test_an_unwritable_output_folder_is_one_line_and_exit_2(tmp_path, kind):
    run_file(tmp_path / "r", "run-1", "cpu", [rec("run-1", "test_a", "cpu", "passed")])
    out = _unwritable(tmp_path, kind)
    db = tmp_path / "history.db"
    proc = _report(str(tmp_path / "r"), "--history", str(db), "-o", str(out))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"accel report: error: -o {out}:"), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not db.exists()  # checked before the history was touched


@pytest.mark.parametrize("kind", KINDS)
def test_a_history_whose_folder_cannot_be_made_is_one_line_and_exit_2(tmp_path, kind):
    run_file(tmp_path / "r", "run-1", "cpu", [rec("run-1", "test_a", "cpu", "passed")])
    db = _unwritable(tmp_path, kind) / "history.db"
    proc = _report(str(tmp_path / "r"), "--history", str(db), "-o", str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"accel report: error: --history {db}:"), proc.stderr
    assert "folder" in lines[0] and "Traceback" not in proc.stderr


def test_writable_folder_makes_the_folder_and_leaves_nothing_behind(tmp_path):
    folder = writable_folder(tmp_path / "a" / "b", label="--output")
    assert folder.is_dir() and list(folder.iterdir()) == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputPathError, match=r"^--output .*file: is a file, not a folder"):
        writable_folder(tmp_path / "file", label="--output")


def test_accel_reports_has_no_import_cycle():
    """The project's cycle lister finds none among accel_reports' modules (every import counts,
    inside functions too)."""
    tool = Path(__file__).resolve().parents[4] / "shared" / "tools" / "import_cycles.py"
    if not tool.is_file():
        pytest.skip(f"the shared cycle lister is not beside the repository ({tool})")
    proc = subprocess.run([sys.executable, str(tool), "accel_reports"], cwd=Path(__file__).resolve().parents[3],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "0 import cycle(s)" in proc.stdout, proc.stdout
