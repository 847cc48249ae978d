"""The report's validated-models table: model × mode per cell, built only from the model suite's records."""

from __future__ import annotations

from _report_data import XSS_SCRIPT, run_file

from accel_harness.records import make_record
from accel_reports.analyse.analysis import build_report
from accel_reports.load.loaders import load_results
from accel_reports.load.model_records import MODEL_TEST
from accel_reports.render.models_view import OPT_IN_NOTE, models_view
from accel_reports.render.report import render_html, render_markdown

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


# ---------------------------------------------------------------------------- modes and figures
TWO_RANKS = "suites/test_models.py::test_model_trains_to_target_at_two_ranks"


def _figures(losses, steps_to_target=22.5, **kw):
    return {"model": "cnn", "mode": kw.pop("mode", "bf16"), "steps": 48, "steps_to_target": steps_to_target,
            "seconds_to_target": 0.75, "samples_per_second": 1234.5, "peak_memory_bytes": 300 * 2 ** 20,
            "final_accuracy": 1.0, "loss_every": 1, "losses": losses, **kw}


def _mode_report(tmp_path, reference_losses=(1.4, 0.9, 0.4)):
    run = _figures([1.4, 1.0, 0.5], reference={**_figures(list(reference_losses), 21.0), "samples_per_second": 2000.0})
    records = [
        make_record(run_id="r1", nodeid=f"{MODEL_TEST}[cpu-ws1-cnn-bf16]", backend="cpu", outcome="passed", duration=1.0,
                    world_size=1, extra={"model_run": run}),
        make_record(run_id="r1", nodeid=f"{TWO_RANKS}[cpu-ws2-cnn-zero3]", backend="cpu", outcome="failed", duration=1.0,
                    world_size=2, text="AssertionError: " + GATE,
                    extra={"model_run": _figures([2.0, float("nan")], None, mode="zero3")}),
        make_record(run_id="r1", nodeid=f"{MODEL_TEST}[cpu-ws1-cnn-fp8]", backend="cpu", outcome="skipped", duration=0.0,
                    world_size=1, text="[unsupported-dtype] test needs fp8, which cpu does not support: no"),
        _record("r1", "cpu", "cnn", 1, "passed"),  # a record from before modes: the one-process mode, no figures
    ]
    run_file(tmp_path, "run", "cpu", records)
    return build_report(load_results([tmp_path]))


def test_modes_are_columns_in_the_tables_order_and_old_ids_read_as_one_process(tmp_path):
    (cell,) = models_view(_mode_report(tmp_path).tests)["cells"]
    assert cell["modes"] == ["1 process", "ZeRO-3 × 2", "bf16", "fp8"]
    (row,) = cell["rows"]
    assert [c["status"] for c in row["cells"]] == ["passed", "failed", "passed", "not run"]
    assert row["cells"][3]["reason"].startswith("[unsupported-dtype] test needs fp8")


def test_the_figures_table_has_time_throughput_memory_and_a_curve_per_recorded_run(tmp_path):
    (cell,) = models_view(_mode_report(tmp_path).tests)["cells"]
    figures = {f["mode"]: f for f in cell["figures"]}
    assert sorted(figures) == ["ZeRO-3 × 2", "bf16"]  # only records that carry figures
    bf16 = figures["bf16"]
    assert bf16["steps_text"] == "22.5 / 21.0" and bf16["seconds_text"] == "0.75 s"
    assert bf16["throughput_text"] == "1,234" and bf16["ref_throughput_text"] == "2,000"
    assert bf16["memory_text"] == "300 MiB" and bf16["accuracy_text"] == "1.000 / 1.000"
    svg = str(bf16["curve"])
    assert svg.startswith("<svg") and svg.count("<path") == 2 and 'class="ref"' in svg and 'class="cur"' in svg
    zero3 = figures["ZeRO-3 × 2"]
    assert zero3["steps_text"].startswith("not reached") and str(zero3["curve"]).count("<path") == 1  # nan: a gap


def test_the_figures_render_in_html_with_the_curve_and_in_markdown_without(tmp_path):
    report = _mode_report(tmp_path)
    html, md = render_html(report), render_markdown(report)
    assert 'class="sortable small model-figures"' in html and 'class="loss-curve"' in html
    assert "| cnn | bf16 | passed | 22.5 / 21.0 | 0.75 s | 1,234 (2,000) | 300 MiB |" in md
    assert "<svg" not in md


def test_figures_with_wrong_types_are_dropped_not_rendered(tmp_path):
    run = _figures(["1.0", True, 0.5, None], steps_to_target=XSS_SCRIPT, samples_per_second=float("inf"), loss_every=0)
    run["reference"] = "not a mapping"
    records = [make_record(run_id="r1", nodeid=f"{MODEL_TEST}[cpu-ws1-cnn-bf16]", backend="cpu", outcome="passed",
                           duration=1.0, world_size=1, extra={"model_run": run})]
    run_file(tmp_path, "run", "cpu", records)
    (cell,) = models_view(build_report(load_results([tmp_path])).tests)["cells"]
    (fig,) = cell["figures"]
    assert fig["steps_text"] == "not reached / –" and fig["throughput_text"] == "–"
    assert XSS_SCRIPT not in render_html(build_report(load_results([tmp_path])))
