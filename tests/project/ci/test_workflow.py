"""The nightly workflow validates against the matrix; mutated workflows are caught."""

from __future__ import annotations

import yaml

import pytest

from _ci_data import REPO, SMALL_MATRIX, write

from ci import validate_workflow as vw
from ci.matrix import load_matrix
from ci.plan import OUTPUT_NAME

WORKFLOW = REPO / ".github" / "workflows" / "nightly.yml"


def mutate(tmp_path, old: str, new: str) -> vw.Validation:
    text = WORKFLOW.read_text()
    assert old in text, old
    path = tmp_path / "nightly.yml"
    path.write_text(text.replace(old, new, 1))
    return vw.validate_workflow(path)


def messages(result: vw.Validation) -> str:
    return "\n".join(str(p) for p in result.problems)


def test_project_workflow_is_consistent_with_the_matrix():
    result = vw.validate_workflow(WORKFLOW)
    assert result.ok, messages(result)
    assert (result.plan_job, result.cells_job) == ("plan", "cells")
    assert set(result.matrix_keys) >= {"id", "runner", "python", "setup_python", "timeout_minutes"}


def test_workflow_shape_as_github_reads_it():
    data = yaml.safe_load(WORKFLOW.read_text())
    triggers = data[True]  # PyYAML reads the key `on` as the boolean true
    assert triggers["schedule"][0]["cron"].count(" ") == 4 and "workflow_dispatch" in triggers
    jobs = data["jobs"]
    assert jobs["cells"]["strategy"]["fail-fast"] is False
    assert jobs["cells"]["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.%s) }}" % OUTPUT_NAME
    assert jobs["cells"]["runs-on"] == "${{ matrix.runner }}"
    assert jobs["report"]["if"].startswith("always()") and jobs["report"]["needs"] == ["plan", "cells"]
    uploads = [s for s in jobs["cells"]["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact")]
    assert uploads and uploads[0]["with"]["name"] == "cell-${{ matrix.id }}" and uploads[0]["if"] == "always()"
    gate = next(s for s in jobs["report"]["steps"] if s.get("name") == "Gate")["run"]
    assert "1) " in gate and "3) " in gate and "0) " in gate and "4) " in gate
    report_run = " ".join(str(s.get("run", "")) for s in jobs["report"]["steps"])
    assert "ci.collect" in report_run and "GITHUB_STEP_SUMMARY" in report_run and "gh run download" in report_run


def test_the_report_job_keeps_a_run_history_across_nightlies():
    from ci import collect

    steps = yaml.safe_load(WORKFLOW.read_text())["jobs"]["report"]["steps"]
    uses = [str(s.get("uses", "")) for s in steps]
    restore = steps[uses.index("actions/cache/restore@v4")]
    save = steps[uses.index("actions/cache/save@v4")]
    report = next(s for s in steps if s.get("id") == "collect")
    # restored before the report, saved after it (even when the gate fails), under one path and key
    assert uses.index("actions/cache/restore@v4") < steps.index(report) < uses.index("actions/cache/save@v4")
    assert restore["with"]["path"] == save["with"]["path"] == "history" and save["if"] == "always()"
    assert restore["with"]["key"] == save["with"]["key"] and restore["with"]["restore-keys"].startswith("accel-history-")
    assert "--history history/nightly.db" in report["run"]
    # and the option exists where the workflow uses it
    assert collect.build_parser().parse_args(["cells", "-o", "r", "--history", "h.db"]).history == "h.db"


def test_every_matrix_key_the_cells_job_uses_exists_in_every_cell():
    import re

    cells_job = yaml.safe_load(WORKFLOW.read_text())["jobs"]["cells"]
    used = set(re.findall(r"matrix\.(\w+)", yaml.safe_dump(cells_job)))
    assert used >= {"id", "runner", "python", "setup_python", "timeout_minutes"}
    for cell in load_matrix().cells(include_disabled=True):
        assert used <= set(cell.github()), cell.id


def test_unknown_matrix_key_is_caught(tmp_path):
    result = mutate(tmp_path, "python-version: ${{ matrix.python }}", "python-version: ${{ matrix.nope }}")
    assert not result.ok and "uses matrix.nope, but not every cell" in messages(result)
    line = WORKFLOW.read_text().splitlines().index("          python-version: ${{ matrix.python }}") + 1
    assert result.problems[0].line == line
    result = mutate(tmp_path, "if: matrix.setup_python", "if: matrix.setup_pyton")  # bare `if:` expressions too
    assert "matrix.setup_pyton" in messages(result)


def test_missing_needs_job_is_caught(tmp_path):
    result = mutate(tmp_path, "needs: [plan, cells]", "needs: [plan, celss]")
    assert "job 'report' needs 'celss', which is not a job here" in messages(result)
    result = mutate(tmp_path, "    needs: plan\n", "    needs: [planner]\n")
    text = messages(result)
    assert "job 'cells' needs 'planner'" in text and "reads needs.plan but does not list 'plan'" in text


def test_plan_output_name_must_match(tmp_path):
    result = mutate(tmp_path, "matrix: ${{ steps.plan.outputs.matrix }}", "matrix: ${{ steps.plan.outputs.cells }}")
    assert "writes the outputs matrix, count, ids, not 'cells'" in messages(result)
    result = mutate(tmp_path, "fromJSON(needs.plan.outputs.matrix)", "fromJSON(needs.plan.outputs.jobs)")
    assert "reads needs.plan.outputs.jobs, which job 'plan' does not declare" in messages(result)


def test_plan_step_must_read_the_validated_matrix(tmp_path):
    result = mutate(tmp_path, '--torch "$TORCH" --format github', '--torch "$TORCH" --format json')
    assert "with --format github" in messages(result)
    other = write(tmp_path, SMALL_MATRIX, "other.yaml")
    result = vw.validate_workflow(WORKFLOW, other)
    assert "not the matrix file being checked" in messages(result)


def test_triggers_cycles_and_missing_cell_runner(tmp_path):
    result = mutate(tmp_path, "  workflow_dispatch:\n", "  push:\n")
    assert "no `workflow_dispatch` trigger" in messages(result)
    result = mutate(tmp_path, "    needs: plan\n", "    needs: [plan, report]\n")
    assert "cycle" in messages(result)
    result = mutate(tmp_path, 'python3 -m ci.run_cell --cell "$CELL"', 'python3 -m ci.other --cell "$CELL"')
    assert "no step runs `python -m ci.run_cell`" in messages(result)


def test_unparsable_workflow_names_the_line(tmp_path):
    path = tmp_path / "nightly.yml"
    path.write_text("on:\n  schedule:\n    - cron: '1 2 * * *'\njobs:\n  plan: [unclosed\n")
    with pytest.raises(vw.WorkflowError) as info:
        vw.validate_workflow(path)
    assert f"workflow file {path}" in str(info.value) and "YAML syntax error" in str(info.value) and info.value.line >= 5


def test_command_line(tmp_path, capsys):
    assert vw.main([]) == 0 and "is consistent with" in capsys.readouterr().out
    text = WORKFLOW.read_text().replace("${{ matrix.id }}", "${{ matrix.name }}")
    path = tmp_path / "nightly.yml"
    path.write_text(text)
    assert vw.main(["--workflow", str(path)]) == 1
    assert "matrix.name" in capsys.readouterr().err


def test_the_baseline_keeps_the_operator_sweep_rows():
    """The next nightly diffs operator rows against this one: the artifact holds what ci.collect reads."""
    steps = yaml.safe_load(WORKFLOW.read_text())["jobs"]["report"]["steps"]
    baseline = next(s for s in steps if s.get("with", {}).get("name") == "nightly-baseline")
    paths = baseline["with"]["path"].split()
    assert {"cells/*/results/", "cells/*/ops/results/", "cells/*/bench/"} <= set(paths)


def test_the_nightly_runs_the_tests_that_ci_leaves_out_as_slow():
    """ci/test.sh skips the tests marked slow (tests/conftest.py): a nightly job must run them, and fail on a failure."""
    jobs = yaml.safe_load(WORKFLOW.read_text())["jobs"]
    runs = [(name, step) for name, job in jobs.items() for step in job.get("steps", [])
            if "pytest tests -m slow" in str(step.get("run", ""))]
    assert len(runs) == 1, runs
    name, step = runs[0]
    assert str(step.get("env", {}).get("RUN_SLOW")) == "1"
    assert "continue-on-error" not in step and "continue-on-error" not in jobs[name]
    assert "set +e" not in step["run"] and "|| true" not in step["run"]
