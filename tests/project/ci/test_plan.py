"""python -m ci.plan: the GitHub job matrix from the matrix file, filters, outputs, errors."""

from __future__ import annotations

import json
import subprocess
import sys

from _ci_data import REPO, SMALL_MATRIX, write

from ci import plan
from ci.matrix import load_matrix
from _waits import SAFETY_NET_S


def run_plan(capsys, *argv: str) -> tuple[int, str, str]:
    code = plan.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_github_format_is_one_line_of_include_entries(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("GITHUB_OUTPUT", raising=False)
    code, out, _ = run_plan(capsys, "--matrix", str(write(tmp_path, SMALL_MATRIX)))
    assert code == 0 and out.count("\n") == 1
    doc = json.loads(out)
    assert list(doc) == ["include"] and len(doc["include"]) == 7
    for entry in doc["include"]:
        assert set(entry) == {"id", "backend", "torch", "python", "runner", "setup_python", "timeout_minutes"}
        assert isinstance(entry["runner"], list) and entry["runner"]
        assert entry["id"] == f"{entry['backend']}-torch{entry['torch']}-py{entry['python']}"


def test_only_filter_and_include_disabled(tmp_path, capsys):
    path = str(write(tmp_path, SMALL_MATRIX))
    _, out, _ = run_plan(capsys, "--matrix", path, "--only", "cuda")
    assert [e["id"] for e in json.loads(out)["include"]] == ["cuda-torch2.13.0-py3.11", "cuda-torch2.14.1-py3.11"]
    _, out, _ = run_plan(capsys, "--matrix", path, "--only", "cuda", "--include-disabled")
    assert [e["id"] for e in json.loads(out)["include"]][-1] == "cuda-torchnightly-py3.11"
    _, out, _ = run_plan(capsys, "--matrix", path, "--only", "", "--torch", "")  # empty dispatch inputs
    assert len(json.loads(out)["include"]) == 7


def test_github_output_file(tmp_path, capsys, monkeypatch):
    output = tmp_path / "github_output"
    output.write_text("earlier=1\n")
    monkeypatch.setenv("GITHUB_OUTPUT", str(output))
    code, out, _ = run_plan(capsys, "--matrix", str(write(tmp_path, SMALL_MATRIX)), "--only", "hpu")
    assert code == 0
    lines = dict(line.split("=", 1) for line in output.read_text().splitlines())
    assert lines["earlier"] == "1"  # appended, not overwritten
    assert json.loads(lines[plan.OUTPUT_NAME]) == json.loads(out)
    assert lines["count"] == "1" and lines["ids"] == "hpu-torch2.13.0-py3.11"


def test_empty_plan_is_count_zero_not_an_error(tmp_path, capsys, monkeypatch):
    output = tmp_path / "github_output"
    monkeypatch.setenv("GITHUB_OUTPUT", str(output))
    code, out, err = run_plan(capsys, "--matrix", str(write(tmp_path, SMALL_MATRIX)), "--only", "hpu", "--torch", "2.14.1")
    assert code == 0 and json.loads(out) == {"include": []} and "no cell matches" in err
    assert "count=0\n" in output.read_text()


def test_unknown_backend_and_broken_matrix_exit_2(tmp_path, capsys):
    code, out, err = run_plan(capsys, "--matrix", str(write(tmp_path, SMALL_MATRIX)), "--only", "xpuu")
    assert code == 2 and out == "" and "unknown backend 'xpuu'" in err
    broken = write(tmp_path, SMALL_MATRIX.replace("    comm: gloo", "    com: gloo"), "broken.yaml")
    code, _, err = run_plan(capsys, "--matrix", str(broken))
    assert code == 2 and f"matrix file {broken}, line 8: backends.cpu.com: unknown key (did you mean 'comm'?)" in err


def test_table_and_json_formats(tmp_path, capsys):
    path = str(write(tmp_path, SMALL_MATRIX))
    _, out, _ = run_plan(capsys, "--matrix", path, "--format", "table", "--include-disabled")
    assert "cpu-torch2.13.0-py3.12" in out and "1,2 (-4)" in out and "[disabled]" in out
    assert "10 cells from" in out and "excluded: backend=hpu torch=2.14.1,nightly (the image ships 2.13.0)" in out
    header = out.splitlines()[0]
    assert header.split()[header.split().index("bench") + 1] == "ops"  # the sweep's mode, beside the benchmarks'

    def column(text: str, cell: str, name: str) -> str:
        lines = text.splitlines()
        row = next(line for line in lines if line.startswith(cell + " "))
        return row[lines[0].index(f"  {name} ") + 2:].split()[0]

    assert (column(out, "cuda-torch2.13.0-py3.11", "bench"), column(out, "cuda-torch2.13.0-py3.11", "ops")) == ("full", "off")
    text = SMALL_MATRIX.replace("    bench: full\n", "    bench: full\n    ops: full\n")
    _, out, _ = run_plan(capsys, "--matrix", str(write(tmp_path, text, "ops.yaml")), "--format", "table")
    assert column(out, "cuda-torch2.14.1-py3.11", "ops") == "full" and column(out, "cpu-torch2.13.0-py3.11", "ops") == "off"
    _, out, _ = run_plan(capsys, "--matrix", path, "--format", "json", "--profile", "local", "--only", "cpu")
    cells = json.loads(out)
    assert cells[0]["install"]["profile"] == "local" and cells[0]["install"]["requirement"] == "torch==2.13.0"
    assert cells[0]["world_sizes"] == [1, 2, 4] and cells[1]["world_sizes"] == [1, 2]


def test_plan_command_reads_the_same_matrix_file_as_the_tests():
    """The workflow runs `python -m ci.plan` on ci/matrix.yaml: its output is these cells, nothing else."""
    proc = subprocess.run([sys.executable, "-m", "ci.plan", "--matrix", "ci/matrix.yaml", "--format", "github"],
                          cwd=REPO, capture_output=True, text=True, timeout=SAFETY_NET_S, env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"include": [c.github() for c in load_matrix().cells()]}
