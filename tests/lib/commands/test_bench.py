"""`accel bench` and the benchmark suites end to end: JSON fields, xdist, errors, the summary table."""

from __future__ import annotations

import json
import platform
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from accel.commands import UsageError
from accel.commands import bench as bench_command
from accel.commands.cli import main

REPO = Path(__file__).resolve().parents[3]
SUITES = REPO / "suites" / "benchmarks"

SCHEMA = ("backend", "device", "dtype", "metric", "unit", "throughput", "higher_is_better", "world_size",
          "work_per_round", "work_unit", "work_size", "sizes", "iterations", "rounds", "warmup_rounds", "median_s",
          "timing", "quick", "torch_version", "accel_version", "torch_threads", "loadavg_1m")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "ACCEL_BENCH_"))}
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


def _accel(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    code = "import sys; from accel.commands.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One `accel bench --quick` over one benchmark of each suite file (single- and multi-process)."""
    out = tmp_path_factory.mktemp("bench")
    proc = _accel("bench", "--backend", "cpu", "--quick", "--results-dir", str(out), "-k",
                  "(matmul and float32) or (all_reduce and large and ranks2) or device_copy or (mlp and accel) "
                  "or (shard and ranks1) or (checkpoint and save)", cwd=out)
    files = sorted(out.glob("bench-*.json"))
    return proc, files


def test_quick_bench_writes_json_with_the_extra_info_schema(quick_run):
    proc, files = quick_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(files) == 1
    assert f"results: {files[0]}" in proc.stdout
    assert "TFLOP/s" in proc.stdout and "GB/s" in proc.stdout and "steps/s" in proc.stdout  # the summary table
    assert "QUICK run" in proc.stdout and "QUICK RUN" in proc.stdout and f"results: {files[0]} (quick)" in proc.stdout
    doc = json.loads(files[0].read_text())
    machine = doc["machine_info"]
    assert machine["torch_version"] and machine["accel_version"] and machine["bench_quick"] is True
    assert machine["bench_backends"] == ["cpu"]
    if platform.libc_ver()[0] == "glibc":  # freed heap memory stays in the process (no hypervisor page faults)
        assert machine["heap"] == {"kept": True, "trim_threshold": 1 << 30, "mmap_threshold": 32 << 20}
    assert machine["accel_devices"]["cpu"]["devices"][0]["name"]
    assert machine["accel_env"]["torch"]["version"] == machine["torch_version"]
    benches = {b["extra_info"]["metric"]: b for b in doc["benchmarks"]}
    assert set(benches) == {"matmul", "all_reduce_busbw", "device_copy", "train_step_mlp", "data_loader_shard",
                            "checkpoint_save"}
    for bench in benches.values():
        extra, stats = bench["extra_info"], bench["stats"]
        missing = [k for k in SCHEMA if k not in extra]
        assert not missing, missing
        assert extra["backend"] == "cpu" and extra["higher_is_better"] is True and extra["quick"] is True
        assert extra["unit"] == extra["work_unit"] + "/s"
        assert extra["work_size"] == extra["work_per_round"]
        assert bench["options"]["timer"] == "accel_device_timer"
        assert len(stats["data"]) == stats["rounds"] == extra["rounds"] >= 5  # raw samples kept
        assert extra["median_s"] == pytest.approx(stats["median"], rel=1e-12)
        assert stats["median"] == pytest.approx(statistics.median(stats["data"]), rel=1e-12)
        assert extra["throughput"] == pytest.approx(extra["work_per_round"] / stats["median"], rel=1e-12)
        assert extra["throughput"] > 0
    units = {metric: b["extra_info"]["unit"] for metric, b in benches.items()}
    assert units == {"matmul": "TFLOP/s", "all_reduce_busbw": "GB/s", "device_copy": "GB/s", "train_step_mlp": "steps/s",
                     "data_loader_shard": "samples/s", "checkpoint_save": "MB/s"}
    for metric in ("train_step_mlp", "data_loader_shard"):  # accel against the hand-written equivalent
        extra = benches[metric]["extra_info"]
        assert extra["overhead_ratio"] > 0 and extra["baseline_throughput"] > 0
        assert len(extra["baseline_samples_s"]) == extra["rounds"]
    # every benchmark is bracketed by the host probe; its kind says which probe figure applies
    bounds = {metric: b["extra_info"]["host_bound"] for metric, b in benches.items()}
    assert bounds == {"matmul": "compute", "all_reduce_busbw": None, "device_copy": "memory",
                      "train_step_mlp": "memory", "data_loader_shard": "compute", "checkpoint_save": None}
    for bench in benches.values():
        probe = bench["extra_info"]["host_reference"]
        assert probe["compute_gflops"] > 0 and probe["memory_gbs"] > 0
        assert probe["before"]["time"] < probe["after"]["time"]
        assert len(probe["before"]["memory_samples"]) == len(probe["after"]["compute_samples"]) == 3  # quick
    # the memory-bound copy times the memory probe in rounds interleaved with its own
    for metric in ("device_copy", "train_step_mlp"):
        copy = benches[metric]["extra_info"]
        assert copy["host_reference"]["memory_source"] == "interleaved with the benchmark's rounds"
        assert len(copy["host_reference"]["memory_samples"]) == copy["rounds"]
    assert "host_reference_paired" not in copy and benches["matmul"]["extra_info"]["host_reference"]["memory_source"] == "bracket"
    matmul, allreduce = benches["matmul"]["extra_info"], benches["all_reduce_busbw"]["extra_info"]
    n = matmul["sizes"]["n"]
    assert matmul["dtype"] == "float32" and matmul["world_size"] == 1 and matmul["unit"] == "TFLOP/s"
    assert matmul["work_per_round"] == pytest.approx(2 * n ** 3 * matmul["iterations"] / 1e12)
    assert allreduce["world_size"] == 2 and allreduce["unit"] == "GB/s" and allreduce["comm_backend"] == "gloo"
    size = allreduce["sizes"]["message_bytes"]
    assert allreduce["work_per_round"] == pytest.approx(size * 2 * (2 - 1) / 2 * allreduce["iterations"] / 1e9)


def test_the_report_loader_reads_the_json(quick_run):
    pytest.importorskip("pandas")
    from accel_reports.load.loaders import load_benchmark_json

    _proc, files = quick_run
    rows, problems = load_benchmark_json(files[0])
    assert not problems
    assert {r["backend"] for r in rows} == {"cpu"}
    raw = {b["fullname"]: b for b in json.loads(files[0].read_text())["benchmarks"]}
    assert {row["fullname"] for row in rows} == set(raw)
    for row in rows:
        bench = raw[row["fullname"]]
        assert row["higher_is_better"] and row["throughput"] > 0
        work, times = bench["extra_info"]["work_size"], bench["stats"]["data"]
        # the value is the median of the per-round rates (work / round time) pytest-benchmark stored; the
        # benchmark's own throughput is work over the median round time; both are read back exactly
        assert row["value"] == pytest.approx(statistics.median(work / t for t in times), rel=1e-9)
        assert row["throughput"] == pytest.approx(work / statistics.median(times), rel=1e-9)


def _pytest_suites(*args: str, cwd: Path, timeout: float = 300, path: Path = SUITES) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pytest", str(path), "-p", "no:cacheprovider", "--backend", "cpu", "-m", "cpu",
           "-rs", *args]
    return subprocess.run(cmd, cwd=REPO, env=_env(ACCEL_BENCH_QUICK="1"), capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_xdist_skips_the_benchmarks_with_a_reason(tmp_path):
    pytest.importorskip("xdist")
    out = tmp_path / "xdist.json"
    # one worker is under xdist as two are (it has workerinput), and it collects the matmul module only (the
    # skip is added per benchmark): fewer processes and imports than -n 2 over every module
    proc = _pytest_suites("-n", "1", "-k", "matmul and float32", "--benchmark-json", str(out), cwd=tmp_path,
                          path=SUITES / "test_bench_matmul.py")
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    assert "1 skipped" in text and "pytest-xdist" in text and "failed" not in text
    # pytest-benchmark writes nothing (or an empty file) here; nothing reads it as a failure
    assert not out.exists() or not out.read_text().strip() or json.loads(out.read_text())["benchmarks"] == []


def test_benchmark_disable_runs_each_benchmark_once_as_a_smoke_test(tmp_path):
    proc = _pytest_suites("--benchmark-disable", "-k", "matmul and float32 or device_copy", "-q", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout


def test_unknown_backend_and_missing_suites_are_usage_errors(tmp_path, capsys):
    assert main(["bench", "--backend", "nosuchdevice", "--results-dir", str(tmp_path)]) == 2
    assert "unknown backend 'nosuchdevice'" in capsys.readouterr().err
    assert main(["bench", "--suites", str(tmp_path / "absent"), "--results-dir", str(tmp_path)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["bench", "--repeat", "0"]) == 2


def test_suites_not_found_is_a_clear_error_naming_where_it_looked(monkeypatch, tmp_path):
    from accel_harness import suites_location

    monkeypatch.delenv(bench_command.SUITES_ENV, raising=False)
    monkeypatch.delenv(suites_location.SUITES_ENV, raising=False)
    monkeypatch.setattr(suites_location, "_PACKAGE_DIR", tmp_path / "site-packages" / "accel_harness")
    with pytest.raises(UsageError, match="cannot find the conformance suites") as excinfo:
        bench_command.locate_suites()
    assert str(tmp_path / "site-packages" / "accel_harness" / "suites") in str(excinfo.value)
    assert "--suites DIR" in str(excinfo.value)
    monkeypatch.setattr(suites_location, "_PACKAGE_DIR", REPO / "accel_harness")
    assert bench_command.locate_suites() == SUITES


def test_a_wheel_copy_of_the_suites_is_found_without_a_checkout(monkeypatch, tmp_path):
    from accel_harness import suites_location

    monkeypatch.delenv(suites_location.SUITES_ENV, raising=False)
    shipped = tmp_path / "site-packages" / "accel_harness"
    (shipped / "suites" / "benchmarks").mkdir(parents=True)
    (shipped / "suites" / "test_training.py").write_text("")
    (shipped / "suites" / "benchmarks" / "conftest.py").write_text("")
    monkeypatch.setattr(suites_location, "_PACKAGE_DIR", shipped)
    assert suites_location.suites_root() == shipped / "suites"
    assert suites_location.benchmarks_root() == shipped / "suites" / "benchmarks"
    monkeypatch.setenv(suites_location.SUITES_ENV, str(REPO / "suites"))
    assert suites_location.suites_root() == REPO / "suites"


def test_no_match_and_failing_benchmarks_give_a_nonzero_exit(tmp_path, monkeypatch, capfd):
    """Through main() in this process (the benchmarks run in a pytest child either way), in _accel's environment."""
    for name in os.environ:
        if name.startswith(("PYTEST_", "ACCEL_BENCH_")) and name != "PYTEST_CURRENT_TEST":
            monkeypatch.delenv(name)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.chdir(tmp_path)
    suite = tmp_path / "suite"  # a one-benchmark suite: nothing of the real suites' collection is needed here
    suite.mkdir()
    (suite / "test_broken.py").write_text(
        "def test_broken(benchmark, backend):\n    raise RuntimeError('boom')\n")
    code = main(["bench", "--backend", "cpu", "--quick", "--suites", str(suite), "--results-dir", str(tmp_path),
                 "-k", "no_such_benchmark"])
    assert code != 0
    assert "no benchmark matched" in capfd.readouterr().err

    code = main(["bench", "--backend", "cpu", "--suites", str(suite), "--results-dir", str(tmp_path)])
    out, err = capfd.readouterr()  # the pytest child writes to this process's descriptors
    assert code == 1, out + err
    assert "boom" in out and "pytest exited with status 1" in err


def test_summary_table_shows_runs_and_their_spread():
    def bench(name, value, median=0.5):
        return {"name": name, "extra_info": {"throughput": value, "unit": "GB/s", "spread": 0.1},
                "stats": {"rounds": 10, "median": median, "iqr": median * 0.1}}

    text = bench_command.summary_table([[bench("test_a[cpu]", 10.0)], [bench("test_a[cpu]", 11.0)],
                                        [bench("test_a[cpu]", 12.0)]])
    line = next(line for line in text.splitlines() if line.startswith("test_a[cpu]"))
    assert "10" in line and "12" in line and "GB/s" in line and "18.2%" in line  # (12 - 10) / 11
    assert line.split()[-2:] == ["-", "-"]  # no host probe: no host columns
    single = bench_command.summary_table([[bench("test_b[cpu]", 3.0)]])
    assert "spread" not in single.splitlines()[0] and "10%" in single
    assert bench_command.summary_table([]) == "(no benchmark results)"


def test_summary_table_separates_host_drift_from_the_benchmarks_own_spread():
    def bench(name, value, memory):
        return {"name": name, "stats": {"rounds": 10, "median": 0.5, "iqr": 0.05},
                "extra_info": {"throughput": value, "unit": "GB/s", "host_bound": "memory",
                               "host_reference": {"memory_gbs": memory, "compute_gflops": 90.0}}}

    # the throughput moved 30 % between runs and the host's memory probe moved with it
    text = bench_command.summary_table([[bench("test_copy[cpu]", 20.0, 40.0)], [bench("test_copy[cpu]", 26.0, 52.0)],
                                        [bench("test_copy[cpu]", 23.0, 46.0)]])
    row = next(line for line in text.splitlines() if line.startswith("test_copy[cpu]")).split()
    assert row[-3:] == ["26.1%", "26.1%", "0.0%"]  # raw spread, host spread, spread relative to the host
    assert "host probe, run 2: compute GFLOP/s 90.0 (min 90.0, max 90.0); memory GB/s 52.0" in text


def _entry(name: str, iqr: float, quick: bool = False) -> dict:
    return {"name": name, "extra_info": {"throughput": 5.0, "unit": "GB/s", "quick": quick, "spread": iqr},
            "stats": {"rounds": 10, "median": 0.5, "iqr": 0.5 * iqr}}


def test_a_benchmark_too_noisy_to_judge_is_marked_and_warned_about():
    runs = [[_entry("test_calm[cpu]", 0.05), _entry("test_wild[cpu]", 28.04), _entry("test_edge[cpu]", 0.30)]]
    text = bench_command.summary_table(runs)
    rows = {line.split()[0]: line for line in text.splitlines() if line.startswith("test_")}
    assert rows["test_wild[cpu]"].rstrip().endswith("2804%!") and rows["test_edge[cpu]"].rstrip().endswith("30%!")
    assert rows["test_calm[cpu]"].rstrip().endswith("5%")
    assert "QUICK" not in text
    warning = bench_command.noise_warning(runs, "7.24, 6.52, 4.63")
    assert warning.startswith("accel bench: WARNING: 2 of 3 benchmarks spread too wide to judge")
    assert warning.index("test_wild[cpu] (2804%)") < warning.index("test_edge[cpu] (30%)")  # widest first
    assert "load average 7.24" in warning and "test_calm" not in warning
    assert bench_command.noise_warning([[_entry("test_calm[cpu]", 0.05)]]) is None
    assert bench_command.noise_warning([]) is None


def test_console_and_report_give_one_spread_for_the_same_record():
    """The console (accel bench), the gate and the report read one noise measure: the stored spread,
    or, for a record without it, the same function over the record's rounds."""
    from accel_reports.analyse import benchmarks as report_benchmarks
    from accel_reports.analyse.noise import relative_iqr, spread_of

    rounds = [1.0, 1.1, 1.3, 0.9, 1.0, 2.0, 1.05, 0.95]
    record = {"name": "test_x[cpu]", "stats": {"data": rounds, "median": 1.025, "iqr": 0.9}}  # pytest-benchmark's own iqr differs
    assert spread_of(record) == relative_iqr(rounds) == report_benchmarks.relative_iqr(rounds)
    assert bench_command.too_noisy([record]) == ([("test_x[cpu]", relative_iqr(rounds))] if relative_iqr(rounds) > 0.25 else [])
    stored = {**record, "extra_info": {"spread": 0.31}}
    assert spread_of(stored) == 0.31 and bench_command.too_noisy([stored]) == [("test_x[cpu]", 0.31)]


def test_a_quick_run_is_labelled_in_the_table():
    text = bench_command.summary_table([[_entry("test_a[cpu]", 0.05, quick=True)]])
    assert text.splitlines()[0].startswith("QUICK RUN") and "never with full ones" in text.splitlines()[0]


def test_the_noise_warning_reaches_stderr(monkeypatch, tmp_path, capsys):
    suites = tmp_path / "suites"
    suites.mkdir()

    def fake_call(cmd, cwd, env):  # what pytest-benchmark would leave: one very noisy benchmark
        path = Path(cmd[cmd.index("--benchmark-json") + 1])
        path.write_text(json.dumps({"benchmarks": [_entry("test_wild[cpu]", 28.04, quick=env["ACCEL_BENCH_QUICK"] == "1")]}))
        return 0

    monkeypatch.setattr(bench_command.subprocess, "call", fake_call)
    code = main(["bench", "--backend", "cpu", "--quick", "--suites", str(suites), "--results-dir", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert code == 0
    assert "WARNING: 1 of 1 benchmarks spread too wide to judge" in err and "test_wild[cpu] (2804%)" in err
    assert "QUICK RUN" in out and "(quick)" in out


def test_help_lists_the_bench_command(capsys):
    assert main(["--help"]) == 0
    assert "bench" in capsys.readouterr().out
    assert main(["bench", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--backend", "--quick", "--results-dir", "-k", "--repeat", "--threads"):
        assert flag in out


def test_the_benchmark_child_runs_with_a_safe_path(monkeypatch, tmp_path):
    """A folder named pytest or accel in the working folder cannot shadow the real ones in the child."""
    suites = tmp_path / "suites"
    suites.mkdir()
    seen = {}

    def fake_call(cmd, cwd, env):
        seen.update(env=env, cmd=cmd)
        Path(cmd[cmd.index("--benchmark-json") + 1]).write_text(json.dumps({"benchmarks": [_entry("test_a[cpu]", 0.05)]}))
        return 0

    monkeypatch.setattr(bench_command.subprocess, "call", fake_call)
    monkeypatch.delenv("PYTHONSAFEPATH", raising=False)
    assert main(["bench", "--backend", "cpu", "--suites", str(suites), "--results-dir", str(tmp_path / "out")]) == 0
    assert seen["env"]["PYTHONSAFEPATH"] == "1" and seen["cmd"][1:3] == ["-m", "pytest"]


#: the standard set (suites/benchmarks/conftest.py's CORE_SET) as collected on cpu
CORE_IDS = {
    "test_bench_matmul.py::test_matmul[cpu-ws1-float32]", "test_bench_matmul.py::test_matmul[cpu-ws1-bfloat16]",
    "test_bench_train_step.py::test_train_step[cpu-ws1-mlp-torch]",
    "test_bench_train_step.py::test_train_step[cpu-ws1-mlp-accel]",
    "test_bench_train_step.py::test_train_step[cpu-ws1-transformer-torch]",
    "test_bench_train_step.py::test_train_step[cpu-ws1-transformer-accel]",
    "test_bench_memory.py::test_transfer[cpu-ws1-h2d-pageable]",
    "test_bench_collectives.py::test_collective[cpu-ws1-all_reduce-large-ranks2]",
}


def test_the_core_set_selects_its_benchmarks_and_no_others(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pytest", str(SUITES), "-p", "no:cacheprovider", "--backend", "cpu",
                           "-m", "cpu and bench_core", "--collect-only", "-q"], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    collected = {line.split("benchmarks/", 1)[1] for line in proc.stdout.splitlines() if "::" in line}
    assert collected == CORE_IDS


@pytest.mark.parametrize(("chosen", "marks"), [(None, "cpu"), ("all", "cpu"), ("core", "cpu and bench_core")])
def test_the_set_option_chooses_the_marker_expression(monkeypatch, tmp_path, chosen, marks):
    suites = tmp_path / "suites"
    suites.mkdir()
    seen = {}

    def fake_call(cmd, cwd, env):
        seen["cmd"] = cmd
        Path(cmd[cmd.index("--benchmark-json") + 1]).write_text(json.dumps({"benchmarks": [_entry("test_a[cpu]", 0.05)]}))
        return 0

    monkeypatch.setattr(bench_command.subprocess, "call", fake_call)
    argv = ["bench", "--backend", "cpu", "--suites", str(suites), "--results-dir", str(tmp_path / "out")]
    assert main(argv + (["--set", chosen] if chosen else [])) == 0
    assert seen["cmd"][seen["cmd"].index("-m", 3) + 1] == marks


def test_an_unknown_set_is_refused(capsys):
    assert main(["bench", "--set", "fastest"]) == 2
    assert "argument --set: invalid choice: 'fastest'" in capsys.readouterr().err
