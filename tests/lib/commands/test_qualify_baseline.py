"""`accel qualify --baseline`: a drop in collected tests beyond the threshold (default 5 %) fails the
run, and the console says when the two runs' fingerprints make the comparison not like for like."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from accel.commands.cli import main
from _synthetic_results import write_run

from _report_data import rec

CONTRACT = "suites/test_backend_contract.py"


def _baseline(folder: Path) -> Path:
    """An earlier cpu run: the test the current run selects plus three more, under a device profile."""
    names = ["test_identity_and_availability", "test_devices_and_synchronize", "test_memory_statistics",
             "test_empty_cache_and_pin_memory"]
    fingerprint = {"torch": "2.13.0+cpu", "accel": "0.1.0", "plugins": {},
                   "profile": {"name": "cpu", "version": "1", "sha256": "e" * 64}, "sha256": "f" * 64}
    return write_run(folder / "base.jsonl", run_id="base", backend="cpu", torch_version="2.13.0+cpu", accel_version="0.1.0",
                     records=[rec("base", n, "cpu", "passed", module=CONTRACT) for n in names],
                     header_extra={"fingerprint": fingerprint}, end_extra={"fingerprint_tests": {"count": 4, "sha256": "d" * 64}})


@pytest.fixture
def qualify(tmp_path, monkeypatch, capsys):
    """``accel qualify`` of one contract test against the baseline, through main() in this process (its
    children are processes of their own either way): a result with ``returncode``, ``stdout`` and ``stderr``."""
    for name in ("PYTEST_ADDOPTS", "ACCEL_DEVICE", "CI"):
        monkeypatch.delenv(name, raising=False)

    def run(name: str, *extra: str) -> SimpleNamespace:
        capsys.readouterr()
        code = main(["qualify", "--backend", "cpu", "--no-bench", "--ops", "none", "-n", "0",
                     "-k", "test_identity_and_availability and backend_contract", "-o", str(tmp_path / name),
                     "--baseline", str(tmp_path / "base"), *extra])
        out, err = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out, stderr=err)

    return run


def test_a_collection_drop_fails_qualify_unless_within_the_threshold(tmp_path, qualify):
    _baseline(tmp_path / "base")
    dropped = qualify("dropped")
    assert dropped.returncode == 1, dropped.stdout[-3000:] + dropped.stderr[-2000:]
    assert "FAILED: fewer tests were collected than in the baseline" in dropped.stdout
    assert "1 tests collected, 4 in the baseline (75.0% fewer)" in dropped.stdout
    # the current run has no profile and another selection: the console and the report say so
    assert "baseline: not like for like: cpu: different device profiles" in dropped.stdout
    assert "baseline: not like for like: cpu: different test selections" in dropped.stdout
    md = (tmp_path / "dropped" / "report" / "report.md").read_text()
    assert "Fewer tests collected" in md and "Baseline not like for like" in md
    allowed = qualify("allowed", "--collection-threshold", "80%")
    assert allowed.returncode == 0, allowed.stdout[-3000:]
    assert "fewer tests were collected" not in allowed.stdout


@pytest.mark.parametrize("args, message", [
    (["--collection-threshold", "0.1"], "--collection-threshold goes with --baseline"),
    (["--baseline", "{tmp}/missing"], "no such file or folder"),
    (["--baseline", "{tmp}", "--collection-threshold", "150%"], "expected a share from 0 to 1"),
])
def test_baseline_usage_errors(tmp_path, capsys, args, message):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    assert main(["qualify", "--backend", "cpu", "--no-bench", "--ops", "none", "-o", str(tmp_path / "out"), *args]) == 2
    assert message in capsys.readouterr().err
