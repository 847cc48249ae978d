"""complete_records marks a run cut short through the results file's public protocol (the run_end line)."""

from __future__ import annotations

import pytest

from accel_harness import upstream as up
from accel_harness.records import RecordWriter, RunHeader, make_record, read_records

UPSTREAM = {"project": "fakeproj", "version": "2.0", "against": "accel", "against_version": "0.1.0"}


def _raw(tmp_path, end: dict | None) -> str:
    """A harness results file with one passed test; ``end``: the run_end line's fields (None: the run was killed)."""
    header = RunHeader(run_id="r1", start_time="2026-01-01T00:00:00+00:00", torch_version="2.13.0", accel_version="0.1.0",
                       backends=["cpu"])
    path = tmp_path / "raw.jsonl"
    with RecordWriter(path, header) as writer:
        writer.write(make_record(run_id="r1", nodeid="t.py::test_a", backend=None, outcome="passed"))
        if end is not None:
            writer.close(**end)
    if end is None:  # what a kill leaves: no run_end line
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        path.write_text("".join(line for line in lines if '"run_end"' not in line), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("end", [None, {"end_time": "2026-01-01T00:05:00+00:00", "interrupted": True}],
                         ids=["killed", "ctrl-c"])
def test_a_run_cut_short_says_so_in_its_run_end_line(tmp_path, end):
    block = up.complete_records(_raw(tmp_path, end), tmp_path / "out.jsonl", backend="cpu", upstream=UPSTREAM,
                                exit_code=None)
    assert block["status"] == "interrupted"
    header, records, problems = read_records(tmp_path / "out.jsonl")
    assert not problems and len(records) == 1
    assert header["interrupted"] is True
    assert header["run_end"]["interrupted"] is True and header["run_end"]["upstream_status"] == "interrupted"
    if end is not None:
        assert header["end_time"] == end["end_time"]  # the session's own end time is kept


def test_a_finished_run_is_not_marked_interrupted(tmp_path):
    up.complete_records(_raw(tmp_path, {"end_time": "2026-01-01T00:05:00+00:00"}), tmp_path / "out.jsonl", backend="cpu",
                        upstream=UPSTREAM, exit_code=0)
    header, _, _ = read_records(tmp_path / "out.jsonl")
    assert header["interrupted"] is False and "interrupted" not in header["run_end"]
    assert header["run_end"]["upstream_status"] == "completed"
