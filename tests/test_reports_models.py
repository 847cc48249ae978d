"""The report's validated-models table: model × mode per cell, built only from the model suite's records."""

from __future__ import annotations

from _report_data import XSS_SCRIPT, run_file

from accel_harness.records import make_record
from accel_reports.analysis import build_report
from accel_reports.loaders import load_results
from accel_reports.models_view import MODEL_TEST, OPT_IN_NOTE, models_view
from accel_reports.render import render_html, render_markdown

GATE = "llama at world size 2 on cpu: failed: steps-to-target: 42.4 steps vs 1.05 x reference 22.0 = 23.0"


def _record(run_id: str, backend: str, model: str, ws: int, outcome: str, **kw):
    return make_record(run_id=run_id, nodeid=f"{MODEL_TEST}[{backend}-ws{ws}-{model}]", backend=backend,
                       outcome=outcome, duration=1.0, world_size=ws, **kw)


def _report(tmp_path):
    records = [
        _record("r1", "cpu", "llama", 1, "passed"),
        _record("r1", "cpu", "llama", 2, "failed", message=GATE + "\nrun evals [...]"),
        _record("r1", "cpu", "gpt2", 1, "skipped", text="[opt-in] test runs only when asked: set RUN_SLOW=1 to run it"),
        _record("r1", "cpu", "t5", 2, "xfailed", message=f"t5 is not tuned yet {XSS_SCRIPT}"),
        make_record(run_id="r1", nodeid="suites/test_training.py::test_step[cpu-ws1]", backend="cpu", outcome="passed",
                    duration=0.1, world_size=1),
    ]
    run_file(tmp_path, "run", "cpu", records)
    return build_report(load_results([tmp_path]))


def test_each_model_and_mode_gets_its_records_status_and_reason(tmp_path):
    view = models_view(_report(tmp_path).tests)
    (cell,) = view["cells"]
    assert cell["modes"] == ["1 process", "DDP × 2"] and cell["passed"] == 1 and cell["failed"] == 1
    rows = {row["model"]: row["cells"] for row in cell["rows"]}
    assert sorted(rows) == ["gpt2", "llama", "t5"]  # only the model suite's tests, not test_step
    assert rows["llama"][0]["status"] == "passed"
    assert rows["llama"][1] == {"status": "failed", "css": "bad", "reason": GATE}  # the first line: the gate's verdict
    assert rows["gpt2"][0]["reason"] == OPT_IN_NOTE
    assert rows["gpt2"][1] == {"status": "not run", "css": "mute", "reason": "no record"}
    assert rows["t5"][1]["status"] == "expected failure"


def test_the_table_is_in_both_renderings_and_escaped(tmp_path):
    report = _report(tmp_path)
    md, html = render_markdown(report), render_html(report)
    assert "## Validated models" in md and "| llama | passed | failed: llama at world size 2" in md
    assert 'id="models"' in html and 'href="#models"' in html and "steps-to-target: 42.4 steps" in html
    assert XSS_SCRIPT not in html and XSS_SCRIPT not in md


def test_no_model_records_no_section(tmp_path):
    records = [make_record(run_id="r1", nodeid="suites/test_training.py::test_step[cpu-ws1]", backend="cpu",
                           outcome="passed", duration=0.1, world_size=1)]
    run_file(tmp_path, "run", "cpu", records)
    report = build_report(load_results([tmp_path]))
    assert models_view(report.tests) is None
    assert "Validated models" not in render_markdown(report) and 'id="models"' not in render_html(report)
