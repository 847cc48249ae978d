"""The support matrix: software, features, operators and models per cell, each entry from the records."""

from __future__ import annotations

import csv
import io

from _report_data import XSS_SCRIPT, run_file

from accel.commands.cli import main
from accel_harness.records import make_record
from accel_reports.analyse.analysis import build_report
from accel_reports.load.loaders import load_results
from accel_reports.load.model_records import MODEL_TEST
from accel_reports.render.report import write_report


def _records():
    def record(nodeid, outcome, **kw):
        return make_record(run_id="r1", nodeid=nodeid, backend="cpu", outcome=outcome, duration=0.1, world_size=1, **kw)

    return [
        record("suites/test_fsdp.py::test_a[cpu-ws1]", "passed"),
        record("suites/test_fsdp.py::test_b[cpu-ws1]", "failed", text=f"AssertionError: wrong {XSS_SCRIPT}"),
        record("suites/test_deepspeed.py::test_c[cpu-ws1]", "passed"),
        record("suites/test_memory.py::test_d[cpu-ws1]", "skipped", text="[needs-devices] two devices"),
        record(f"{MODEL_TEST}[cpu-ws1-llama]", "passed"),
    ]


def _rows(text: str) -> dict[tuple[str, str], dict]:
    return {(row["section"], row["item"]): row for row in csv.DictReader(io.StringIO(text))}


def test_each_entry_comes_from_the_records_and_says_not_run_where_nothing_ran(tmp_path):
    run_file(tmp_path / "in", "run", "cpu", _records())
    report = build_report(load_results([tmp_path / "in"]), title=f"matrix {XSS_SCRIPT}")
    written = write_report(report, tmp_path / "out", support_matrix=True)
    rows = _rows(written["support-matrix.csv"].read_text())
    assert rows[("features", "FSDP")]["status"] == "partly" and rows[("features", "FSDP")]["detail"] == "1 of 2 failed"
    assert rows[("features", "DeepSpeed")]["status"] == "supported"
    assert rows[("features", "memory")]["status"] == "not run"
    assert rows[("operators", "operators")]["status"] == "not run"  # no sweep in this run
    assert rows[("models", "llama (1 process)")]["status"] == "passed"
    assert rows[("software", "torch")]["status"] == "2.8.0"
    md = written["support-matrix.md"].read_text()
    assert "## cpu · torch 2.8.0 · accel 0.2.0" in md and "| FSDP | partly | 1 of 2 failed | report.html#areas |" in md
    html = written["support-matrix.html"].read_text()
    assert XSS_SCRIPT not in html and XSS_SCRIPT not in md and 'href="report.html#models"' in html


def test_the_matrix_is_written_only_when_asked(tmp_path, capsys):
    run_file(tmp_path / "in", "run", "cpu", _records())
    main(["report", str(tmp_path / "in"), "-o", str(tmp_path / "plain"), "--fail-on", "none"])
    assert not (tmp_path / "plain" / "support-matrix.md").exists()
    main(["report", str(tmp_path / "in"), "-o", str(tmp_path / "out"), "--fail-on", "none", "--support_matrix"])
    out = capsys.readouterr().out
    for name in ("support-matrix.md", "support-matrix.html", "support-matrix.csv"):
        assert (tmp_path / "out" / name).is_file() and f"Support matrix: " in out and name in out


def test_a_run_of_two_backends_gives_each_cell_its_own_devices(tmp_path):
    from accel_harness.records import RunHeader, RecordWriter

    header = RunHeader(run_id="r2", start_time="2026-01-01T00:00:00+00:00", accel_version="0.2.0", torch_version="2.8.0",
                       backends=["cpu", "emu"], device_models={"cpu": ["Host CPU"], "emu": ["Emulated"]},
                       runtime_versions={"cpu": None, "emu": "emu-runtime 1.0"})
    (tmp_path / "in").mkdir()
    with RecordWriter(tmp_path / "in" / "run.jsonl", header) as writer:
        for backend in ("cpu", "emu"):
            writer.write(make_record(run_id="r2", nodeid=f"suites/test_fsdp.py::test_a[{backend}-ws1]", backend=backend,
                                     outcome="passed", duration=0.1, world_size=1))
    written = write_report(build_report(load_results([tmp_path / "in"])), tmp_path / "out", support_matrix=True)
    rows = list(csv.DictReader(io.StringIO(written["support-matrix.csv"].read_text())))
    facts = {(r["cell"].split(" ")[0], r["item"]): r["status"] for r in rows if r["section"] == "software"}
    assert "Host CPU" in facts[("cpu", "devices")] and "Emulated" not in facts[("cpu", "devices")]
    assert facts[("emu", "runtime")] == "emu-runtime 1.0" and ("cpu", "runtime") not in facts
