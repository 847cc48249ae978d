"""accel qualify's options reach its suite stage: parallel by default, --flake-runs, both flag spellings."""

from __future__ import annotations

import pytest

from accel.commands import qualify
from accel.commands.cli import main


def _suite_command(monkeypatch, tmp_path, *args: str) -> list[str]:
    """The pytest command the suite stage would run (the stage itself stubbed out)."""
    seen: list[list[str]] = []

    def fake_step(title, command, log, *rest, **kwargs):
        if title == "conformance suites":
            seen.append(command)
        return 0

    monkeypatch.setattr(qualify, "_step", fake_step)
    monkeypatch.setattr(qualify, "_print_vendor_lines", lambda *a, **k: None)
    main(["qualify", "--backend", "cpu", "-o", str(tmp_path / "q"), "--no-bench", "--ops", "none", *args])
    assert len(seen) == 1
    return seen[0]


def test_the_suites_run_on_two_workers_by_default_where_there_are_two_cores(monkeypatch, tmp_path):
    monkeypatch.setattr(qualify, "default_workers", lambda: 2)
    command = _suite_command(monkeypatch, tmp_path)
    assert command[command.index("-n") + 1] == "2"


def test_n_zero_runs_one_process(monkeypatch, tmp_path):
    assert "-n" not in _suite_command(monkeypatch, tmp_path, "-n", "0")


@pytest.mark.parametrize("flag", ["--flake-runs", "--flake_runs"])
def test_flake_runs_reach_the_suites(monkeypatch, tmp_path, flag):
    command = _suite_command(monkeypatch, tmp_path, flag, "3")
    assert command[command.index("--flake-runs") + 1] == "3"


def test_a_negative_count_is_refused(capsys, tmp_path):
    assert main(["qualify", "-o", str(tmp_path / "q"), "--flake-runs", "-1"]) == 2
    assert "--flake-runs and -n take a number of 0 or more" in capsys.readouterr().err
    assert not (tmp_path / "q").exists()


def test_default_workers_follow_the_usable_cores(monkeypatch):
    monkeypatch.setattr(qualify.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert qualify.default_workers() == 0
    monkeypatch.setattr(qualify.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert qualify.default_workers() == 2


def _steps(monkeypatch, tmp_path, *args: str) -> dict[str, dict]:
    """Every stage's command and environment of an `accel qualify` whose stages are not run."""
    seen: dict[str, dict] = {}

    def fake_step(title, command, log, *rest, env=None, **kwargs):
        seen[title] = {"command": command, "env": env}
        return 0

    monkeypatch.setattr(qualify, "_step", fake_step)
    main(["qualify", "--backend", "cpu", "-o", str(tmp_path / "q"), *args])
    return seen


def _value(command: list[str], flag: str) -> str | None:
    """The value after ``flag`` past the interpreter's own ``-m MODULE``."""
    rest = command[3:]
    return rest[rest.index(flag) + 1] if flag in rest else None


@pytest.mark.parametrize(("args", "marks", "slow"), [
    ((), "cpu", None), (("--models", "quick"), "cpu", None),
    (("--models", "none"), "(cpu) and not models", None), (("--models", "full"), "cpu", "1"),
])
def test_the_models_option_selects_the_model_suite(monkeypatch, tmp_path, args, marks, slow):
    monkeypatch.delenv("RUN_SLOW", raising=False)
    suites = _steps(monkeypatch, tmp_path, "--no-bench", "--ops", "none", *args)["conformance suites"]
    assert _value(suites["command"], "-m") == marks
    assert suites["env"].get("RUN_SLOW") == slow


@pytest.mark.parametrize(("args", "keyword"), [
    ((), "not test_quick_operator_sweep"),
    (("-k", "fsdp or ddp"), "(fsdp or ddp) and not test_quick_operator_sweep"),
    (("--ops", "none"), None),
    (("--ops", "none", "-k", "fsdp"), "(fsdp)"),
])
def test_the_suites_leave_the_sweep_to_the_operator_stage(monkeypatch, tmp_path, args, keyword):
    seen = _steps(monkeypatch, tmp_path, "--no-bench", *args)
    assert _value(seen["conformance suites"]["command"], "-k") == keyword
    assert ("operators (cpu)" in seen) == ("none" not in args)


@pytest.mark.parametrize(("args", "chosen"), [((), "core"), (("--thorough",), "all")])
def test_the_benchmarks_are_the_standard_set_unless_thorough(monkeypatch, tmp_path, args, chosen):
    seen = _steps(monkeypatch, tmp_path, "--ops", "none", *args)
    assert _value(seen["benchmarks (cpu)"]["command"], "--set") == chosen
