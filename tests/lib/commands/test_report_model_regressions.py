"""`accel report --history`: a model that learned in the last stored run and does not now fails the regressions gate."""

from __future__ import annotations

import pytest

from accel.commands import report as report_command
from accel.commands.cli import main
from tests.reports.history.test_model_trends import _last_night, _night, _tonight


@pytest.fixture(autouse=True)
def _not_under_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)


def test_a_model_regression_exits_3_names_it_and_draws_three_curves(tmp_path, capsys):
    db = tmp_path / "history.db"
    last, tonight = _night(tmp_path / "a", 1, _last_night()), _night(tmp_path / "b", 2, _tonight())
    # last night into the history (its own failure is mixtral's: an untracked failure, exit 1)
    assert main(["report", str(last), "-o", str(tmp_path / "r1"), "--history", str(db)]) == report_command.EXIT_NEW_FAILURES
    capsys.readouterr()
    code = main(["report", str(tonight), "-o", str(tmp_path / "r2"), "--history", str(db), "--fail-on", "regressions"])
    assert code == report_command.EXIT_REGRESSIONS
    err = capsys.readouterr()
    assert "3 model regressions" in err.out
    assert "model regression: llama in mode bf16 on cpu" in err.err and "fails now" in err.err
    html = (tmp_path / "r2" / "report.html").read_text()
    assert "Regressions against the last stored run: 3" in html
    assert html.count('class="prev"') == 3  # last time's curve beside this run's and the reference's
    markdown = (tmp_path / "r2" / "report.md").read_text()
    assert "| bert | fp8 |" in markdown


def test_without_a_history_there_is_no_model_regression(tmp_path, capsys):
    tonight = _night(tmp_path / "b", 2, _tonight())
    code = main(["report", str(tonight), "-o", str(tmp_path / "r"), "--fail-on", "regressions"])
    assert code == report_command.EXIT_OK
    assert "model regression" not in capsys.readouterr().out
