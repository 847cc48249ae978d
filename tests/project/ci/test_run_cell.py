"""python -m ci.run_cell: arguments, the commands it would run (--dry-run), reuse, failures. No installs."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from _ci_data import REPO, SMALL_MATRIX, write

from ci import run_cell
from ci.matrix import load_matrix


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch, tmp_path):
    for name in (run_cell.PIP_ARGS_ENV, "ACCEL_CI_PROFILE", run_cell.VENV_CACHE_ENV, "GITHUB_ACTIONS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = run_cell.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def commands(out: str) -> dict[str, list[str]]:
    """``step: command`` lines of a dry run, split into words."""
    found = {}
    for line in out.splitlines():
        if line.startswith("#") or ": " not in line:
            continue
        name, command = line.split(": ", 1)
        found[name] = shlex.split(command)
    return found


def dry_run(capsys, tmp_path, *extra: str, cell: str = "cpu-torch2.13.0-py3.11", matrix: str | None = None):
    path = matrix or str(write(tmp_path, SMALL_MATRIX))
    code, out, err = run(capsys, "--cell", cell, "--matrix", path, "--out", str(tmp_path / "out"),
                         "--venv-cache", str(tmp_path / "venvs"), "--python", sys.executable, "--dry-run", *extra)
    assert code == 0, err
    return out, commands(out)


def test_unknown_cell_lists_the_known_ones(tmp_path, capsys):
    code, out, err = run(capsys, "--cell", "cpu-torch2.13-py3.11", "--matrix", str(write(tmp_path, SMALL_MATRIX)),
                         "--out", str(tmp_path / "out"), "--dry-run")
    assert code == 2 and out == ""
    assert "unknown cell 'cpu-torch2.13-py3.11' (did you mean 'cpu-torch2.13.0-py3.11'?)" in err
    listed = err.split("cells in ", 1)[1].split(": ", 1)[1].strip().split(", ")  # the known ids, disabled ones too
    assert listed == [c.id for c in load_matrix(tmp_path / "matrix.yaml").cells(include_disabled=True)] and len(listed) == 10
    assert not (tmp_path / "out").exists()


def test_required_arguments_and_bad_choices(capsys):
    with pytest.raises(SystemExit) as info:
        run_cell.main(["--out", "x"])
    assert info.value.code == 2 and "--cell" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run_cell.main(["--cell", "x", "--out", "y", "--bench", "fast"])
    assert "invalid choice: 'fast'" in capsys.readouterr().err


def test_dry_run_installs_torch_pinned_first_then_accel_under_a_constraint(tmp_path, capsys):
    out, steps = dry_run(capsys, tmp_path)
    assert list(steps) == ["venv", "install-torch", "check-torch", "install-accel", "check-accel", "suites", "bench"]
    venv = tmp_path / "venvs" / "cpu-torch2.13.0-py3.11"
    vpy = str(run_cell.venv_python(venv))
    assert steps["venv"] == [sys.executable, "-m", "venv", str(venv)]
    torch = steps["install-torch"]
    assert torch[:4] == [vpy, "-m", "pip", "install"] and torch[-1] == "torch==2.13.0"
    assert torch[torch.index("--index-url") + 1] == "https://download.pytorch.org/whl/cpu"
    accel = steps["install-accel"]
    assert accel[:4] == [vpy, "-m", "pip", "install"] and accel[-2:] == ["--editable", f"{REPO}[test]"]
    assert accel[accel.index("--constraint") + 1] == str(venv / run_cell.CONSTRAINTS)
    assert not any(word.startswith("torch") for word in accel)  # accel's install never names a torch
    assert "must match 2.13.0" in " ".join(steps["check-torch"])
    assert not (tmp_path / "out").exists() and not venv.exists()  # a dry run creates nothing


def test_dry_run_suites_and_bench_commands(tmp_path, capsys):
    _, steps = dry_run(capsys, tmp_path)
    out_dir = tmp_path / "out" / "cpu-torch2.13.0-py3.11"
    suites = steps["suites"]
    assert suites[1:4] == ["-m", "pytest", str(REPO / "suites")]
    pairs = {suites[i]: suites[i + 1] for i in range(len(suites) - 1) if suites[i].startswith("-")}
    assert pairs["-m"] == "cpu" and pairs["--backend"] == "cpu" and pairs["--world-sizes"] == "1,2,4"
    assert pairs["--ignore"] == str(REPO / "suites" / "benchmarks") and pairs["-n"] == "2"
    assert pairs["--results-dir"] == str(out_dir / "results") and pairs["--junitxml"] == str(out_dir / "junit.xml")
    bench = steps["bench"]
    assert bench[1:5] == ["-m", "accel.commands.cli", "bench", "--backend"] and bench[5] == "cpu"
    assert bench[bench.index("--results-dir") + 1] == str(out_dir / "bench") and bench[-1] == "--quick"


def test_world_size_exclusion_full_bench_and_bench_override(tmp_path, capsys):
    _, steps = dry_run(capsys, tmp_path, cell="cpu-torch2.14.1-py3.12")
    assert steps["suites"][steps["suites"].index("--world-sizes") + 1] == "1,2"
    _, steps = dry_run(capsys, tmp_path, cell="cuda-torch2.13.0-py3.11")
    assert "--quick" not in steps["bench"] and "-n" not in steps["suites"]
    assert steps["install-torch"][-3:] == ["--index-url", "https://download.pytorch.org/whl/cu130", "torch==2.13.0"]
    _, steps = dry_run(capsys, tmp_path, "--bench", "off")
    assert "bench" not in steps


def test_preinstalled_cell_sees_system_packages_and_installs_no_torch(tmp_path, capsys):
    _, steps = dry_run(capsys, tmp_path, cell="hpu-torch2.13.0-py3.11")
    assert "install-torch" not in steps and "--system-site-packages" in steps["venv"]
    assert "must match 2.13.0" in " ".join(steps["check-torch"])


def test_profile_and_pip_args_from_flag_and_environment(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(run_cell.PIP_ARGS_ENV, "--find-links /opt/wheels")
    out, steps = dry_run(capsys, tmp_path, "--profile", "local", "--pip-args=--retries 1 --timeout 30")
    torch = steps["install-torch"]
    assert "--index-url" not in torch and torch[-1] == "torch==2.13.0"
    assert torch[-7:-1] == ["--find-links", "/opt/wheels", "--retries", "1", "--timeout", "30"]
    assert steps["install-accel"][7:13] == ["--find-links", "/opt/wheels", "--retries", "1", "--timeout", "30"]
    assert "cpu-torch2.13.0-py3.11-local" in steps["venv"][-1]  # a profile gets its own environment
    assert "(profile local)" in out
    monkeypatch.setenv("ACCEL_CI_PROFILE", "local")
    _, steps = dry_run(capsys, tmp_path)
    assert "--index-url" not in steps["install-torch"]


def test_bad_pip_args_and_unknown_profile_are_usage_errors(tmp_path, capsys):
    path = str(write(tmp_path, SMALL_MATRIX))
    code, _, err = run(capsys, "--cell", "cpu-torch2.13.0-py3.11", "--matrix", path, "--out", str(tmp_path), "--pip-args", "'unclosed", "--dry-run")
    assert code == 2 and "cannot split the pip arguments" in err
    code, _, err = run(capsys, "--cell", "cpu-torch2.13.0-py3.11", "--matrix", path, "--out", str(tmp_path), "--profile", "lokal", "--dry-run")
    assert code == 2 and "unknown install profile 'lokal' (did you mean 'local'?)" in err


def test_reuse_venv_skips_venv_and_torch_only_when_the_stamp_matches(tmp_path, capsys):
    matrix = load_matrix(write(tmp_path, SMALL_MATRIX))
    runner = run_cell.CellRunner(cell=matrix.cell("cpu-torch2.13.0-py3.11"), out_root=tmp_path / "out",
                                 venv_cache=tmp_path / "venvs", repo=REPO)
    vpy = Path(runner.vpy)
    vpy.parent.mkdir(parents=True)
    vpy.write_text("")
    (runner.venv / run_cell.STAMP).write_text(json.dumps({**runner.stamp("3.11.7"), "torch": "2.13.0+cpu", "built": "x"}))
    out, steps = dry_run(capsys, tmp_path, "--reuse-venv", matrix=str(matrix.path))
    assert "--reuse-venv: reuse (built x with torch 2.13.0+cpu)" in out
    assert "venv" not in steps and "install-torch" not in steps and "install-accel" in steps and "check-torch" in steps
    out, steps = dry_run(capsys, tmp_path, "--reuse-venv", "--pip-args=--no-cache-dir", matrix=str(matrix.path))
    assert "rebuild: it was built with another pip args" in out and "install-torch" in steps
    out, steps = dry_run(capsys, tmp_path, matrix=str(matrix.path))  # without --reuse-venv: always rebuilt
    assert "venv" in steps and "install-torch" in steps


def test_environment_failure_exits_3_and_records_why(tmp_path, capsys):
    out_root = tmp_path / "out"
    code, out, err = run(capsys, "--cell", "cpu-torch2.13.0-py3.11", "--matrix", str(write(tmp_path, SMALL_MATRIX)),
                         "--out", str(out_root), "--venv-cache", str(tmp_path / "venvs"), "--python", str(tmp_path / "no-python"))
    assert code == run_cell.EXIT_ENVIRONMENT
    assert "python interpreter" in err and "not found" in err
    record = json.loads((out_root / "cpu-torch2.13.0-py3.11" / "cell.json").read_text())
    assert record["status"] == "environment-failed" and "not found" in record["error"]
    assert record["id"] == "cpu-torch2.13.0-py3.11" and record["torch"]["requested"] == "2.13.0"
    assert record["runner"] == ["ubuntu-latest"] and record["steps"] == [] and "suites" not in record
    assert record["start_time"] <= record["end_time"]


def test_wrong_python_version_is_an_environment_failure(tmp_path, capsys):
    code, _, err = run(capsys, "--cell", "cpu-torch2.13.0-py3.12" if sys.version_info[:2] != (3, 12) else "cpu-torch2.13.0-py3.11",
                       "--matrix", str(write(tmp_path, SMALL_MATRIX)), "--out", str(tmp_path / "out"),
                       "--venv-cache", str(tmp_path / "venvs"), "--python", sys.executable)
    assert code == 3 and f"is python {sys.version_info[0]}.{sys.version_info[1]}, the cell needs" in err


def test_out_folder_that_is_not_a_cells_is_refused(tmp_path, capsys):
    precious = tmp_path / "out" / "cpu-torch2.13.0-py3.11"
    precious.mkdir(parents=True)
    (precious / "thesis.tex").write_text("keep me")
    code, _, err = run(capsys, "--cell", "cpu-torch2.13.0-py3.11", "--matrix", str(write(tmp_path, SMALL_MATRIX)),
                       "--out", str(tmp_path / "out"), "--venv-cache", str(tmp_path / "venvs"), "--python", sys.executable)
    assert code == 2 and "is not a cell's output" in err
    assert (precious / "thesis.tex").read_text() == "keep me"


def test_torch_version_check_fails_clearly(tmp_path):
    matrix = load_matrix(write(tmp_path, SMALL_MATRIX))
    runner = run_cell.CellRunner(cell=matrix.cell("cpu-torch2.13.0-py3.11"), out_root=tmp_path, venv_cache=tmp_path, repo=REPO)
    runner.check_torch({"version": "2.13.0+cpu"}, "after installing torch")  # the local label is fine
    with pytest.raises(run_cell.EnvironmentFailure, match=r"asks for torch 2.13.0, but pip installed torch 2.14.1 \(/x\)"):
        runner.check_torch({"version": "2.14.1", "file": "/x"}, "after installing accel")
    hpu = run_cell.CellRunner(cell=matrix.cell("hpu-torch2.13.0-py3.11"), out_root=tmp_path, venv_cache=tmp_path, repo=REPO)
    with pytest.raises(run_cell.EnvironmentFailure, match="the runner image has torch 2.6.0"):
        hpu.check_torch({"version": "2.6.0"}, "after installing torch")


def test_child_environment_puts_the_venv_first_and_drops_leaks(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.setenv("PYTEST_ADDOPTS", "-n 8")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    matrix = load_matrix(write(tmp_path, SMALL_MATRIX))
    runner = run_cell.CellRunner(cell=matrix.cell("cpu-torch2.13.0-py3.11"), out_root=tmp_path, venv_cache=tmp_path / "v", repo=REPO)
    env = runner.child_env(suites=True)
    assert env["PATH"].split(":")[0] == str(Path(runner.vpy).parent) and env["VIRTUAL_ENV"] == str(runner.venv)
    assert "PYTHONPATH" not in env and "PYTEST_ADDOPTS" not in env and env["OMP_NUM_THREADS"] == "1"
    assert "OMP_NUM_THREADS" not in runner.child_env()  # benchmarks keep torch's own thread choice


def test_count_outcomes_reads_harness_records(tmp_path):
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(o) for o in [
        {"type": "header", "run_id": "r"}, {"type": "test", "outcome": "passed"}, {"type": "test", "outcome": "passed"},
        {"type": "test", "outcome": "failed"}, {"type": "test", "outcome": "skipped"}, {"type": "run_end"}]) + "\nnot json\n")
    assert run_cell.count_outcomes(tmp_path) == {"passed": 2, "failed": 1, "skipped": 1}
    assert run_cell.count_outcomes(tmp_path / "absent") == {}


def test_dry_run_installs_the_cells_plugin_after_accel_under_the_same_constraint(tmp_path, capsys):
    _, steps = dry_run(capsys, tmp_path, cell="emu-torch2.13.0-py3.11", matrix=str(REPO / "ci" / "matrix.yaml"))
    names = list(steps)
    assert names.index("install-accel") < names.index("install-plugin-accel-emu") < names.index("check-accel")
    plugin = steps["install-plugin-accel-emu"]
    venv = tmp_path / "venvs" / "emu-torch2.13.0-py3.11"
    assert plugin[-1] == str(REPO / "plugins" / "accel-emu")
    assert plugin[plugin.index("--constraint") + 1] == str(venv / run_cell.CONSTRAINTS)
    assert steps["suites"][steps["suites"].index("--backend") + 1] == "emu"


# ---------------------------------------------------------------------------- the operator sweep
OPS_MATRIX = SMALL_MATRIX.replace("    workers: 2\n", "    workers: 2\n    ops: full\n", 1)


def test_dry_run_sweeps_operators_after_the_suites_and_before_the_benchmarks(tmp_path, capsys):
    _, steps = dry_run(capsys, tmp_path, matrix=str(write(tmp_path, OPS_MATRIX, "ops.yaml")))
    names = list(steps)
    assert names[-3:] == ["suites", "ops", "bench"]
    vpy = str(run_cell.venv_python(tmp_path / "venvs" / "cpu-torch2.13.0-py3.11"))
    out_dir = tmp_path / "out" / "cpu-torch2.13.0-py3.11"
    assert steps["ops"] == [vpy, "-m", "accel.commands.cli", "ops", "--backend", "cpu",
                            "-o", str(out_dir / "ops"), "-n", "2"]  # full: no --quick; the cell's 2 workers


def test_ops_override_quick_known_issues_and_cpu_count(tmp_path, capsys, monkeypatch):
    _, steps = dry_run(capsys, tmp_path, "--ops", "quick")  # the matrix says nothing: off, overridden
    assert "--quick" in steps["ops"] and list(steps).index("ops") == list(steps).index("suites") + 1
    _, steps = dry_run(capsys, tmp_path, "--ops", "off", matrix=str(write(tmp_path, OPS_MATRIX, "ops.yaml")))
    assert "ops" not in steps and "bench" in steps
    _, steps = dry_run(capsys, tmp_path)
    assert "ops" not in steps
    monkeypatch.setattr(run_cell.os, "cpu_count", lambda: 12)
    known = SMALL_MATRIX + "known_issues: ci/upstream_known_issues.yaml\n"
    _, steps = dry_run(capsys, tmp_path, "--ops", "full", cell="cuda-torch2.13.0-py3.11", matrix=str(write(tmp_path, known, "known.yaml")))
    ops = steps["ops"]
    assert ops[ops.index("-n") + 1] == "12"  # no workers in the matrix: one per CPU
    assert ops[ops.index("--known-issues") + 1] == str(REPO / "ci" / "upstream_known_issues.yaml")
    assert steps["suites"][steps["suites"].index("--known-issues") + 1] == ops[ops.index("--known-issues") + 1]
    assert "--quick" not in ops
    with pytest.raises(SystemExit):
        run_cell.main(["--cell", "x", "--out", "y", "--ops", "fast"])
    assert "invalid choice: 'fast'" in capsys.readouterr().err


def test_project_matrix_sweeps_every_operator_on_emu_and_cpu(tmp_path, capsys):
    for cell in ("emu-torch2.13.0-py3.11", "cpu-torch2.14.1-py3.12"):
        _, steps = dry_run(capsys, tmp_path, cell=cell, matrix=str(REPO / "ci" / "matrix.yaml"))
        assert steps["ops"][3:6] == ["ops", "--backend", cell.split("-")[0]] and "--quick" not in steps["ops"]
    _, steps = dry_run(capsys, tmp_path, cell="cuda-torch2.13.0-py3.11", matrix=str(REPO / "ci" / "matrix.yaml"))
    assert "ops" not in steps


class FakeProcess:
    """subprocess.Popen for one step: writes what the command would leave behind, exits as told."""

    exits: dict[str, int] = {}
    commands: list[list[str]] = []

    def __init__(self, command, cwd=None, env=None, **_):
        self.command = command
        FakeProcess.commands.append(command)
        self.step = "ops" if "ops" in command else "bench" if "bench" in command else "suites"
        if self.step == "suites":
            write_records(Path(command[command.index("--results-dir") + 1]) / "run.jsonl", [("passed", None)] * 2)
        if self.step == "ops":
            results = Path(command[command.index("-o") + 1]) / "results"
            write_records(results / "ops-cpu.jsonl", [("passed", None)] * 3 + [("failed", None), ("failed", "emu-sparse"),
                                                                            ("skipped", None)])
        self.stdout = iter([f"{self.step} output\n"])

    def wait(self):
        return FakeProcess.exits.get(self.step, 0)


def write_records(path: Path, outcomes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [{"type": "header", "run_id": "r"}]
    lines += [{"type": "test", "nodeid": f"t{i}", "outcome": o, "known_issue": k} for i, (o, k) in enumerate(outcomes)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


@pytest.mark.parametrize("ops_exit, verdict", [(0, "passed"), (1, "failed"), (2, "not-run"), (-9, "crashed")])
def test_a_sweep_with_failed_rows_is_a_test_failure_not_a_broken_cell(tmp_path, capsys, monkeypatch, ops_exit, verdict):
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setattr(run_cell.subprocess, "Popen", FakeProcess)
    monkeypatch.setattr(FakeProcess, "exits", {"suites": 1, "ops": ops_exit})
    monkeypatch.setattr(FakeProcess, "commands", [])
    monkeypatch.setattr(run_cell.CellRunner, "build_environment",
                        lambda self, record: {"version": "2.13.0+cpu", "python": "3.11.7", "accel": "0.1.0"})
    matrix = load_matrix(write(tmp_path, OPS_MATRIX))
    runner = run_cell.CellRunner(cell=matrix.cell("cpu-torch2.13.0-py3.11"), out_root=tmp_path / "out",
                                 venv_cache=tmp_path / "venvs", repo=REPO)
    assert runner.run() == run_cell.EXIT_OK  # failed rows, like failed suites, are data for the report
    out = capsys.readouterr().out
    record = json.loads((runner.cell_dir / "cell.json").read_text())
    assert record["status"] == "ok" and [s["name"] for s in record["steps"]] == ["suites", "ops", "bench"]
    ops = record["ops"]
    assert ops["mode"] == "full" and ops["exit_code"] == ops_exit and ops["verdict"] == verdict
    assert ops["rows"] == 6 and ops["counts"] == {"passed": 3, "failed": 1, "known": 1, "skipped": 1}
    assert ops["results"] == "ops/results" and isinstance(ops["duration_s"], float)
    assert record["suites"]["counts"] == {"passed": 2}  # the sweep's records are not the suites'
    step = record["steps"][1]
    assert step["exit_code"] == ops_exit and step["log"] == "logs/ops.log"
    assert (runner.cell_dir / "logs" / "ops.log").read_text().startswith("$ ") and "ops output" in out
    # only a sweep that did not run to the end is flagged, as a suite run that did not is
    assert ("the operator sweep did not run to the end" in out) is (ops_exit not in (0, 1))
    assert "the suites did not run to the end" not in out
    assert f"ops full: 6 rows, 1 failed, exit {ops_exit}" in out


def test_ops_off_is_recorded_and_runs_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(run_cell.subprocess, "Popen", FakeProcess)
    monkeypatch.setattr(FakeProcess, "commands", [])
    monkeypatch.setattr(run_cell.CellRunner, "build_environment",
                        lambda self, record: {"version": "2.13.0+cpu", "python": "3.11.7"})
    matrix = load_matrix(write(tmp_path, OPS_MATRIX))
    runner = run_cell.CellRunner(cell=matrix.cell("cpu-torch2.13.0-py3.11"), out_root=tmp_path / "out",
                                 venv_cache=tmp_path / "venvs", repo=REPO, ops="off", bench="off")
    assert runner.run() == run_cell.EXIT_OK
    record = json.loads((runner.cell_dir / "cell.json").read_text())
    assert record["ops"] == {"mode": "off"} and [s["name"] for s in record["steps"]] == ["suites"]
    assert not (runner.cell_dir / "ops").exists() and len(FakeProcess.commands) == 1


def test_count_outcomes_can_split_known_failures(tmp_path):
    write_records(tmp_path / "ops.jsonl", [("failed", None), ("failed", "issue-1"), ("passed", "issue-2")])
    assert run_cell.count_outcomes(tmp_path) == {"failed": 2, "passed": 1}  # the suites' counts, as before
    assert run_cell.count_outcomes(tmp_path, split_known=True) == {"failed": 1, "known": 1, "passed": 1}
