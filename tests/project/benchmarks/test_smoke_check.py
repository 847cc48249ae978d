"""suites/benchmarks/smoke_check.py: the config both commands get, the command lines, the run loop."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from accel.launch.config_file import load_config

SCRIPT = Path(__file__).resolve().parents[3] / "suites" / "benchmarks" / "smoke_check.py"


@pytest.fixture(scope="module")
def smoke_check():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        spec = importlib.util.spec_from_file_location("smoke_check_under_test", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return module


@pytest.mark.parametrize(("processes", "kind"), [(1, "NO"), (2, "MULTI_CPU")])
def test_the_config_is_one_accel_reads_as_cpu_processes(smoke_check, tmp_path, processes, kind):
    path = tmp_path / "config.yaml"
    path.write_text(smoke_check.config_text(processes), encoding="utf-8")
    config = load_config(path)
    assert config.num_processes == processes and config.use_cpu is True and config.distributed_type == kind


def test_each_command_runs_test_with_the_config(smoke_check):
    assert smoke_check.command("accel", "c.yaml")[-3:] == ["test", "--config_file", "c.yaml"]
    assert smoke_check.command("accelerate", None)[-1] == "test"


def test_pairs_alternate_their_order_and_give_one_ratio_each(smoke_check, monkeypatch, tmp_path, capsys):
    calls = []

    def fake_timed(argv, cwd):
        calls.append(Path(argv[0]).name)
        return 1.0 if Path(argv[0]).name == "accel" else 4.0

    monkeypatch.setattr(smoke_check, "timed", fake_timed)
    out = tmp_path / "out.json"
    assert smoke_check.main(["--pairs", "3", "--json", str(out)]) == 0
    assert calls == ["accel", "accelerate", "accelerate", "accel", "accel", "accelerate"]
    result = json.loads(out.read_text())
    assert result["ratios"] == [0.25, 0.25, 0.25] and result["ratio"] == 0.25
    assert "ratio 0.25" in capsys.readouterr().out


def test_a_failing_command_is_an_error_with_its_output(smoke_check, tmp_path):
    with pytest.raises(RuntimeError, match="exited 3"):
        smoke_check.timed([sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"], str(tmp_path))


def test_the_floor_is_timed_in_each_pair_when_asked(smoke_check, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(smoke_check, "timed", lambda argv, cwd: 2.0 if Path(argv[0]).name == "accel" else 4.0)
    monkeypatch.setattr(smoke_check, "floor_seconds", lambda cwd: 1.5)
    out = tmp_path / "out.json"
    assert smoke_check.main(["--pairs", "2", "--floor", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["samples"]["floor"] == [1.5, 1.5] and result["ratio"] == 0.5
    assert "torch's floor 1.50 s" in capsys.readouterr().out
