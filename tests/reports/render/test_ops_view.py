"""`accel report` on operator sweeps (`accel ops`): the Operators section, and the per-test tables without the rows.

Every results file here is written by the test with RecordWriter, record by record as
accel_harness.ops.output writes a sweep's records; no sweep runs.
"""

from __future__ import annotations

import contextlib
import csv
import html
import io
import os
from dataclasses import asdict
from pathlib import Path

import pytest

from accel.commands.cli import main
from accel_harness.known_issues import KnownIssues
from accel_harness.ops.outcomes import RECORD_OUTCOME
from accel_harness.ops.output import headline_lines, nodeid_of
from accel_harness.ops.plan import Row
from accel_harness.ops.summary import headline, support_list
from accel_harness.records import RecordWriter, RunHeader, make_record
from accel_reports.analyse.analysis import build_report
from accel_reports.analyse.areas import area_of
from accel_reports.load.loaders import load_results
from accel_reports.load.ops_records import parse_operator_id
from accel_reports.analyse.operators import family_of
from accel_reports.render.report import render_html, render_markdown, write_report
from accel_reports.render.ops_view import operators_view

CENSUS = [{"operator": f"aten::k{i}", "kind": kind, "host_kernel": True}
          for i, kind in enumerate(["device-kernel"] * 6 + ["fallback"] * 3 + ["missing"] + ["composite-implicit"] * 4)]
TRACE = [{"operator": "aten::mm", "calls": 7, "kind": "device-kernel"},
         {"operator": "aten::native_layer_norm_backward", "calls": 2, "kind": "fallback"}]


def row(op: str, dtype: str = "float32", outcome: str = "passed", reason: str = "passed", message: str | None = None,
        kind: str = "op", variant: str = "function", direction: str = "forward", **fields) -> Row:
    """One row of a sweep."""
    return Row(kind=kind, op=op, variant=variant, dtype=dtype, direction=direction, outcome=outcome, reason_code=reason,
               samples=3, message=message, **fields)


def sweep_file(path: Path, rows: list[Row], *, run_id: str, backend: str = "emu", start: str = "2026-03-01T00:00:00+00:00",
               census: list | None = None, trace: list | None = None, claims: dict | None = None, ops: object = ...) -> dict:
    """A sweep's results file, written as accel_harness.ops.output writes it; returns the header's figures."""
    figures = headline(rows, census or [], trace or [])
    figures["profile_claims"] = claims or {}
    header = RunHeader(run_id=run_id, start_time=start, accel_version="0.1.0", torch_version="2.13.0", backends=[backend],
                       extra={"stage": "operators", "device": f"{backend}:0", "ops": figures if ops is ... else ops})
    with RecordWriter(path, header) as writer:
        for item in rows:
            outcome = RECORD_OUTCOME[item.outcome]
            text = None if outcome in ("passed", "skipped", "xpassed") else f"{item.reason_code}: {item.message or ''}"
            record = make_record(run_id=run_id, nodeid=nodeid_of(item), backend=backend, outcome=outcome, duration=item.seconds,
                                 text=text if outcome != "skipped" else None,
                                 message=item.message if outcome == "skipped" else None, known_issue=item.known_issue,
                                 extra={"area": "operators", **{k: v for k, v in asdict(item).items() if k != "message"}})
            if outcome == "skipped":
                record.reason_code = item.reason_code
            writer.write(record)
    return figures


def suite_file(path: Path, results: dict[str, str], *, run_id: str, backend: str = "emu") -> None:
    """A suite run's results file: test name -> outcome."""
    header = RunHeader(run_id=run_id, start_time="2026-03-01T00:00:00+00:00", accel_version="0.1.0", torch_version="2.13.0",
                       backends=[backend])
    with RecordWriter(path, header) as writer:
        for name, outcome in results.items():
            text = "AssertionError: loss went up" if outcome == "failed" else None
            writer.write(make_record(run_id=run_id, nodeid=f"suites/test_training.py::{name}[{backend}]", backend=backend,
                                     outcome=outcome, text=text))


def sample_rows() -> list[Row]:
    """A small sweep: every family, passes, mismatches (two messages with other numbers: one signature),
    a missing kernel, a known issue, torch's expected failure and skips."""
    mismatch = "sample {n}: output: {n} of 50 elements differ: max abs 0.0{n}, max rel 0.25 (atol=1e-05, rtol=0.016)"
    return [
        row("add"), row("add", "bfloat16"), row("add", "float32", variant="method"),
        row("addr", "bfloat16", "failed", "mismatch", mismatch.format(n=2), max_abs_err=0.02),
        row("addr"),
        row("nn.functional.layer_norm", "bfloat16", "failed", "mismatch", mismatch.format(n=5), max_abs_err=0.05),
        row("nn.functional.layer_norm"), row("nn.functional.relu"), row("nn.functional.relu", "bfloat16"),
        row("fft.fft"), row("fft.fft", "bfloat16", "skipped", "torch-dtype", "torch lists bfloat16 as unsupported"),
        row("linalg.svd", "float32", "failed", "missing-kernel", "sample 0: NotImplementedError: no svd kernel on emu"),
        row("special.erf", "float32", "known", "mismatch", "sample 1: output: 1 of 9 elements differ", known_issue="emu-erf"),
        row("div.floor_rounding"), row("div.floor_rounding", "bfloat16", "xfailed", "torch-xfail", "expected"),
        row("nn.Linear", kind="module", variant="train"), row("optim.AdamW", kind="optim", variant="step", direction="step"),
    ]


def _report(paths, baseline=None, known=None):
    return build_report(load_results(paths), load_results(baseline) if baseline else None, known)


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    old = os.environ.pop("CI", None)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["report", *argv])
    finally:
        if old is not None:
            os.environ["CI"] = old
    return code, out.getvalue(), err.getvalue()


def _section(page: str, start: str = '<section id="operators">') -> str:
    begin = page.index(start)
    return page[begin:page.index("</section>", begin)]


# ---------------------------------------------------------------------------- ids and families
def test_operator_ids_parse_back_what_the_sweep_writes_and_name_their_family():
    for item in sample_rows():
        parsed = parse_operator_id(nodeid_of(item))
        assert parsed == {"op": item.op, "kind": item.kind, "variant": item.variant, "dtype": item.dtype,
                          "direction": item.direction}
    assert parse_operator_id("suites/test_training.py::test_x[emu]") is None
    assert parse_operator_id("suites/test_ops.py::add[op-function-float32]") is None  # not a sweep row's id
    assert [family_of("op", name) for name in ("add", "div.floor_rounding", "nn.functional.relu", "fft.fft", "linalg.svd",
                                               "special.erf", "sparse.mm.reduce", "masked.sum", "torch.ops.aten.x")] == \
        ["core", "core", "nn.functional", "fft", "linalg", "special", "sparse", "masked", "core"]
    assert family_of("module", "nn.Linear") == "nn" and family_of("optim", "optim.AdamW") == "optim"
    assert area_of(nodeid_of(row("add"))) == "operators"


# ---------------------------------------------------------------------------- the section
def test_section_leads_with_the_sweeps_own_headline_and_its_census_and_fallbacks(tmp_path):
    claims = {"bfloat16": {"verdict": "claim-contradicted", "passed": 2, "compared": 5, "share": 0.4}}
    figures = sweep_file(tmp_path / "ops-emu.jsonl", sample_rows(), run_id="sweep-1", census=CENSUS, trace=TRACE, claims=claims)
    report = _report([tmp_path])
    md, page = render_markdown(report), render_html(report)
    lines = headline_lines({"headline": figures})  # what `accel ops` printed
    assert lines[0] == "bfloat16: 2 of 5 operators passed (40.0 %)"
    assert lines[1] == "float32: 6 of 8 operators passed (75.0 %)"
    assert lines[2].startswith("device kernels: 6 of 10 aten overloads that need a backend kernel (60.0 %")
    assert lines[3] == "a training step reached 2 overloads, 1 of them (2 of 9 calls) through the fallback"
    section = _section(page)
    for line in lines:
        assert f"- {line.replace('_', chr(92) + '_')}" in md
        assert f"<li>{html.escape(line, quote=False)}</li>" in section
    assert "The figures run sweep-1 recorded" in section
    assert "<code>aten::native_layer_norm_backward</code>" in section and "aten::mm" not in section
    assert "<tr><td>device-kernel</td><td class=\"num\">6</td></tr>" in section
    assert "<tr><td>bfloat16</td><td class=\"r-bad\">claim-contradicted</td>" in section
    assert "| bfloat16 | claim-contradicted | 2 | 5 |" in md
    assert "Dispatcher census: 14 aten overloads; device-kernel 6, composite-implicit 4, fallback 3, missing 1." in md
    assert '<a href="#operators">Operators</a>' in page


def test_families_by_dtype_count_operators_and_colour_each_cell_by_pass_rate(tmp_path):
    sweep_file(tmp_path / "ops.jsonl", sample_rows(), run_id="sweep-1")
    report = _report([tmp_path])
    view = operators_view(report)["cells"][0]
    assert view["dtypes"] == ["float32", "bfloat16"]  # the order tables show dtypes in; fft's skip adds none
    assert [f["family"] for f in view["families"]] == ["core", "nn.functional", "fft", "linalg", "special", "nn", "optim"]
    core = view["families"][0]
    assert core["operators"] == 3  # add, addr, div.floor_rounding
    assert core["cells"][0]["text"] == "3/3" and core["cells"][0]["css"] == "q4"
    # bfloat16: add passed; addr failed; div.floor_rounding is torch's expected failure (compared, not passed)
    assert core["cells"][1]["text"] == "1/3" and core["cells"][1]["css"] == "q1"
    assert "not passing: addr, div.floor_rounding" in core["cells"][1]["title"]
    fft = view["families"][2]
    assert fft["cells"][1] is None  # skipped only: nothing compared
    assert [c["text"] for c in view["total"]] == ["6/8", "2/5"]  # the headline's operators passed per dtype
    section = _section(render_html(report))
    assert 'title="core · bfloat16: 1 of 3 operators passed; not passing: addr, div.floor_rounding"><b>1/3</b>' in section
    assert '<td class="oc q0">–</td>' in section
    md = render_markdown(report)
    assert "| core | 3 | :green_square: 3/3 (100.0%) | :red_square: 1/3 (33.3%) |" in md
    assert "| **every OpInfo operator** | | :orange_square: **6/8** (75.0%) | :red_square: **2/5** (40.0%) |" in md


def test_failures_are_grouped_by_reason_code_and_message_signature(tmp_path):
    sweep_file(tmp_path / "ops.jsonl", sample_rows(), run_id="sweep-1")
    known = KnownIssues.from_data([{"id": "emu-erf", "ops": ["special.erf"], "title": "erf on emu"}])
    report = _report([tmp_path], known=known)
    groups = operators_view(report)["cells"][0]["failures"]
    assert [(g["reason"], g["rows"], g["untracked"]) for g in groups] == [("mismatch", 2, 2), ("mismatch", 1, 0),
                                                                       ("missing-kernel", 1, 1)]
    first = groups[0]  # two messages that differ only in their numbers: one signature
    assert first["operators"] == ["addr (bfloat16)", "nn.functional.layer_norm (bfloat16)"]
    assert first["signature"].startswith("sample <N>: output: <N> of <N> elements differ")
    assert first["max_abs_err"] == 0.05
    assert groups[1]["known_issues"] == ["emu-erf"] and groups[2]["known_issues"] == []
    md = render_markdown(report)
    assert "| mismatch | 2 | 2 | addr (bfloat16), nn.functional.layer\\_norm (bfloat16) | sample &lt;N&gt;: output:" in md
    assert "| mismatch (known issue: emu-erf) | 1 | 0 | special.erf (float32) |" in md
    assert "torch-dtype × 1" in md
    section = _section(render_html(report))
    assert '<td title="the device has no kernel for the operator (NotImplementedError)"><code>missing-kernel</code>' in section


def test_passing_operator_rows_are_summarised_not_listed_and_failures_still_count(tmp_path):
    rows = [row(f"op{i:04d}") for i in range(1500)] + [row("addr", "float32", "failed", "mismatch", "sample 0: output: differ")]
    sweep_file(tmp_path / "ops.jsonl", rows, run_id="sweep-1")
    suite_file(tmp_path / "suite.jsonl", {"test_ok": "passed", "test_bad": "failed"}, run_id="suite-1")
    report = _report([tmp_path])
    page, md = render_html(report), render_markdown(report)
    assert "op0007" not in page and "op0007" not in md  # 1,500 passing rows: counted, never listed
    assert "test_ops.py::addr[" not in page  # its failure is in the Operators section's groups, not in a per-test table
    grid = page[page.index('<section id="grid">'):page.index('<section id="details">')]
    assert "suites/test_training.py::test_bad" in grid and "suites/test_training.py::test_ok" in grid
    assert "test_ops.py" not in grid and "The 1,501 operator rows are summed up" in grid
    details = page[page.index('<section id="details">'):]
    assert "test_ops.py" not in details.split("</section>")[0]
    clusters = page[page.index('<section id="failures">'):page.index('<section id="skips">')]
    assert "loss went up" in clusters and "differ" not in clusters
    assert "1 failed, grouped by reason and message in" in clusters
    # the verdict and the gate count every row; the areas name the operators
    assert "emu: 1501/1503 pass, 2 fail; 2 failures not covered by a known issue" in md
    assert "| operators | 1501 | 1500 | 1 | 0 |" in md and "| data-parallel | 2 | 1 | 1 | 0 |" in md
    assert "(tests outside the operator sweep); 1 operator row failed (1 not covered by a known issue), in 1 group" in md
    assert len(page.encode()) < 60_000  # the page stays small however many rows pass


def test_everything_a_sweep_writes_is_escaped(tmp_path):
    evil = "<img src=x onerror=alert(1)>"
    rows = [row(f"{evil}|x", "float32", "failed", "error", f"sample 0: RuntimeError: {evil} | `code` *b*"),
            row("add", "float32", "failed", "mismatch", "sample 0: <script>alert(2)</script>")]
    census = [{"operator": "aten::x", "kind": "<script>alert(3)</script>", "host_kernel": True}]
    trace = [{"operator": f"aten::{evil}", "calls": 1, "kind": "fallback"}]
    claims = {"<svg onload=alert(4)>": {"verdict": "<b>v</b>", "passed": 0, "compared": 1}}
    sweep_file(tmp_path / "ops.jsonl", rows, run_id="<script>alert(5)</script>", backend="emu", census=census, trace=trace,
               claims=claims)
    report = _report([tmp_path])
    write_report(report, tmp_path / "out")
    page = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    md = (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    for raw in (evil, "<script>alert(", "<svg onload", "<b>v</b>"):
        assert raw not in page and raw not in md
    section = _section(page)
    assert "&lt;img src=x onerror=alert(1)&gt;|x (float32)" in section
    assert "<code>&lt;script&gt;alert(3)&lt;/script&gt;</code>" not in section  # census kinds are cells, not code
    assert "<td>&lt;script&gt;alert(3)&lt;/script&gt;</td>" in section
    assert "&lt;img src=x onerror=alert(1)&gt;\\|x (float32)" in md  # a pipe cannot end a Markdown cell
    assert "\\`code\\` \\*b\\*" in md


def test_support_list_is_written_beside_the_report_and_linked(tmp_path):
    rows = sample_rows() + [row("=cmd|' /C calc'!A0")]
    sweep_file(tmp_path / "ops.jsonl", rows, run_id="sweep-1")
    written = write_report(_report([tmp_path]), tmp_path / "out")
    name = "operator-support-emu-torch-2-13-0.csv"
    assert written[name] == tmp_path / "out" / name
    with open(written[name], newline="", encoding="utf-8") as handle:
        listed = list(csv.DictReader(handle))
    expected = {s["op"]: s for s in support_list(rows)}
    assert len(listed) == len(expected)
    addr = next(r for r in listed if r["op"] == "addr")
    assert addr == {"op": "addr", "supported_dtypes": "float32", "limitations": "bfloat16: mismatch (function, forward)"}
    assert any(r["op"] == "'=cmd|' /C calc'!A0" for r in listed)  # a spreadsheet shows it as text, never runs it
    md = written["md"].read_text(encoding="utf-8")
    assert f"[{name}]({name})" in md and "| addr | float32 | bfloat16: mismatch (function, forward) |" in md
    assert f'<a href="{name}">' in written["html"].read_text(encoding="utf-8")


# ---------------------------------------------------------------------------- the gate and the inputs
def test_an_operator_row_that_passed_in_the_baseline_and_fails_now_is_a_new_failure(tmp_path):
    base, now = tmp_path / "base", tmp_path / "now"
    base.mkdir(), now.mkdir()
    sweep_file(base / "ops.jsonl", [row("addr"), row("add"), row("mul", "float32", "failed", "mismatch", "sample 0: differ")],
               run_id="night-1", start="2026-03-01T00:00:00+00:00")
    sweep_file(now / "ops.jsonl", [row("addr", "float32", "failed", "mismatch", "sample 2: output: 3 of 9 elements differ"),
                                   row("add"), row("mul")], run_id="night-2", start="2026-03-02T00:00:00+00:00")
    report = _report([now], baseline=[base])
    regressed = nodeid_of(row("addr"))
    assert list(report.diff.new_untracked["test_id"]) == [regressed]
    assert report.diff.new_untracked.iloc[0]["was"] == "passed"
    assert list(report.diff.fixed["test_id"]) == [nodeid_of(row("mul"))]
    assert list(report.untracked_failures["test_id"]) == [regressed]
    diff = render_html(report).split('<section id="diff">')[1].split("</section>")[0]
    assert "New untracked failures (1)" in diff and html.escape(regressed) in diff
    code, out, err = _cli(str(now), "--baseline", str(base), "-o", str(tmp_path / "out"))
    assert code == 1, (out, err)
    assert "1 failure (1 new not covered by a known issue)" in out
    code, _, _ = _cli(str(now), "--baseline", str(now), "-o", str(tmp_path / "same"))
    assert code == 0


def test_figures_are_recomputed_from_the_rows_when_the_run_has_none(tmp_path):
    rows = sample_rows()
    sweep_file(tmp_path / "ops.jsonl", rows, run_id="sweep-1", ops=None)
    report = _report([tmp_path], known=KnownIssues.from_data([{"id": "emu-erf", "ops": ["special.erf"]}]))
    assert not report.problems
    cell = operators_view(report)["cells"][0]
    assert not cell["from_run"]
    assert cell["lines"] == headline_lines({"headline": headline(rows, [], [])})
    assert "recorded none (so no census or training step)" in _section(render_html(report))


def test_a_wrong_ops_block_is_an_invalid_input(tmp_path):
    sweep_file(tmp_path / "ops.jsonl", sample_rows(), run_id="sweep-1", ops={"operators_passed": {"float32": "all"}, "outcomes": {}})
    loaded = load_results([tmp_path])
    assert [(p.kind, p.line) for p in loaded.problems] == [("invalid", 1)]
    assert "field 'extra.ops': 'operators_passed' is not what accel ops writes" in loaded.problems[0].message
    assert loaded.runs.iloc[0]["ops"] is None
    assert operators_view(build_report(loaded))["cells"][0]["lines"][0] == "bfloat16: 2 of 5 operators passed (40.0 %)"
    code, _, err = _cli(str(tmp_path), "-o", str(tmp_path / "out"), "--fail-on", "none")
    assert code == 2 and "extra.ops" in err


def test_known_issue_ops_patterns_track_operator_failures_at_report_time(tmp_path):
    rows = [row("fft.fft", "bfloat16", "failed", "mismatch", "sample 0: output: differ"), row("fft.fft")]
    sweep_file(tmp_path / "ops.jsonl", rows, run_id="sweep-1")
    known = KnownIssues.from_data([{"id": "emu-fft-bf16", "ops": ["fft.*"], "dtypes": ["bfloat16"]}])
    report = _report([tmp_path], known=known)
    assert report.untracked_failures.empty
    assert operators_view(report)["cells"][0]["failures"][0]["known_issues"] == ["emu-fft-bf16"]


def test_the_section_renders_the_same_from_a_run_history(tmp_path):
    from accel_reports.history.store import open_history

    sweep_file(tmp_path / "ops.jsonl", sample_rows(), run_id="sweep-1", census=CENSUS, trace=TRACE)
    loaded = load_results([tmp_path / "ops.jsonl"])
    with open_history(tmp_path / "h.db") as history:
        history.ingest(loaded)
        stored = history.load()
    direct, again = operators_view(build_report(loaded)), operators_view(build_report(stored))
    assert again["cells"][0]["lines"] == direct["cells"][0]["lines"] and again["cells"][0]["from_run"]
    assert again["cells"][0]["failures"] == direct["cells"][0]["failures"]


@pytest.mark.parametrize("where", ["html", "md"])
def test_a_report_without_operator_rows_has_no_operators_section(tmp_path, where):
    suite_file(tmp_path / "suite.jsonl", {"test_ok": "passed"}, run_id="suite-1")
    report = _report([tmp_path])
    text = render_html(report) if where == "html" else render_markdown(report)
    assert "Operators" not in text and "operator sweep" not in text
    assert sorted(write_report(report, tmp_path / "out")) == ["html", "md"]
