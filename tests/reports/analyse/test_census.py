"""accel_reports.analyse.census: the per-step census of two benchmark runs compared (synthetic runs)."""

from __future__ import annotations

import json

import pytest

from accel_reports.analyse.census import CensusChange, census_of_run, diff_census, format_changes, load_census, main


def _census(operators=None, kernels=None, allocations=None, schema=1):
    return {"schema": schema, "steps": 2, "activities": ["CPU", "PrivateUse1"],
            "operators": operators or {}, "kernels": kernels or {}, "allocations": allocations or {}}


def _run(**censuses):
    """A pytest-benchmark document: one entry per census, plus one benchmark without a census."""
    entries = [{"name": name, "fullname": f"suites/benchmarks/test_bench_train_step.py::{name}",
                "extra_info": {"census": census}} for name, census in censuses.items()]
    entries.append({"name": "test_matmul[emu]", "fullname": "test_matmul[emu]", "extra_info": {"metric": "matmul"}})
    return {"machine_info": {}, "benchmarks": entries}


LAST = _run(**{"test_train_step[emu-accel-mlp]": _census(
    operators={"aten::addmm": 3.0, "aten::copy_": 4.0, "aten::mm": 4.0},
    kernels={"emu::aten::addmm": 3.0, "Memcpy HtoD": 2.0},
    allocations={"emu": 20.0, "cpu": 2.0})})


def test_an_unchanged_run_has_no_changes():
    assert diff_census(census_of_run(LAST), census_of_run(LAST)) == []
    assert "no operator" in format_changes([])


def test_changed_new_and_gone_counts_are_listed_per_category_largest_first():
    this = _run(**{"test_train_step[emu-accel-mlp]": _census(
        operators={"aten::addmm": 3.0, "aten::copy_": 6.0, "aten::mm": 4.5, "aten::_to_copy": 2.0},
        kernels={"emu::aten::addmm": 3.0},
        allocations={"emu": 21.0, "cpu": 2.0})})
    bench = "suites/benchmarks/test_bench_train_step.py::test_train_step[emu-accel-mlp]"
    changes = diff_census(census_of_run(LAST), census_of_run(this))
    assert changes == [
        CensusChange(bench, "operators", "aten::_to_copy", None, 2.0),
        CensusChange(bench, "operators", "aten::copy_", 4.0, 6.0),
        CensusChange(bench, "operators", "aten::mm", 4.0, 4.5),
        CensusChange(bench, "kernels", "Memcpy HtoD", 2.0, None),
        CensusChange(bench, "allocations", "emu", 20.0, 21.0),
    ]
    text = format_changes(changes)
    assert "aten::copy_: 4 -> 6 per step (+2)" in text
    assert "aten::_to_copy: new, 2 per step" in text
    assert "Memcpy HtoD: gone (was 2 per step)" in text
    assert changes[3].delta == -2.0


def test_benchmarks_in_one_run_only_are_not_compared():
    other = _run(**{"test_train_step[cpu-accel-mlp]": _census(operators={"aten::addmm": 9.0})})
    assert diff_census(census_of_run(LAST), census_of_run(other)) == []


@pytest.mark.parametrize("census, message", [
    (_census(schema=2), "census schema 2 is not one this reader knows"),
    ({**_census(), "operators": {"aten::mm": "four"}}, "census 'operators' must map names to counts per step"),
    ([1, 2], "the census must be a mapping"),
])
def test_a_malformed_census_is_refused_naming_the_benchmark(census, message):
    with pytest.raises(ValueError, match=message) as info:
        census_of_run(_run(**{"test_train_step[emu-torch-mlp]": census}))
    assert "test_train_step[emu-torch-mlp]" in str(info.value)


def test_not_a_benchmark_document_is_refused():
    with pytest.raises(ValueError, match="not a pytest-benchmark JSON document"):
        census_of_run({"tests": []})


def test_the_command_compares_two_files(tmp_path, capsys):
    last, this = tmp_path / "last.json", tmp_path / "this.json"
    last.write_text(json.dumps(LAST))
    this.write_text(json.dumps(LAST))
    assert main([str(last), str(this)]) == 0
    changed = json.loads(json.dumps(LAST))
    changed["benchmarks"][0]["extra_info"]["census"]["kernels"]["Memcpy DtoH"] = 1.0
    this.write_text(json.dumps(changed))
    assert main([str(last), str(this)]) == 1
    assert "kernels Memcpy DtoH: new, 1 per step" in capsys.readouterr().out
    this.write_text("{not json")
    assert main([str(last), str(this)]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert load_census(last).keys() == census_of_run(LAST).keys()


def test_the_documented_command_still_runs_from_its_old_place(tmp_path):
    """``python -m accel_reports.census`` (the command the docs give) runs the comparison of
    :mod:`accel_reports.analyse.census`: the same exit codes, the same output."""
    import subprocess
    import sys
    from pathlib import Path

    last = tmp_path / "last.json"
    last.write_text(json.dumps(LAST))
    root = Path(__file__).resolve().parents[3]
    same = subprocess.run([sys.executable, "-m", "accel_reports.census", str(last), str(last)], cwd=root,
                          capture_output=True, text=True, timeout=120)
    assert same.returncode == 0, same.stderr
    assert "no operator, kernel or allocation count per step changed" in same.stdout
    usage = subprocess.run([sys.executable, "-m", "accel_reports.census", str(last)], cwd=root,
                           capture_output=True, text=True, timeout=120)
    assert usage.returncode == 2
    assert "usage: python -m accel_reports.census" in usage.stderr
