"""accel_reports.analyse.benchmarks: the noise-aware regression rule, directions, tables and geometric means."""

from __future__ import annotations

import itertools
import random

import pandas as pd
import pytest

from accel_reports.analyse.benchmarks import (
    benchmark_row,
    compare_benchmarks,
    compare_samples,
    geometric_mean,
    higher_is_better,
    host_drift,
    host_reference_value,
    mann_whitney_greater,
    summarise_benchmarks,
)
from accel_reports.load.loaders import load_results
from _synthetic_results import bench_entry

from _report_data import bench_file


def _noisy(median: float, n: int, spread: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [median * rng.lognormvariate(0, spread) for _ in range(n)]


# ---------------------------------------------------------------------------- the statistic
def test_mann_whitney_exact_matches_enumeration():
    assert mann_whitney_greater([6, 7, 8, 9, 10], [1, 2, 3, 4, 5]) == pytest.approx(1 / 252)
    assert mann_whitney_greater([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(1.0)
    x, y = [0.3, 2.5, 4.1, 7.7], [1.2, 3.3, 5.0, 6.1, 8.4, 9.9]
    u = sum(a > b for a in x for b in y)
    pool = x + y
    counts = [sum(a > b for a in combo for b in pool if b not in combo) for combo in itertools.combinations(pool, len(x))]
    assert mann_whitney_greater(x, y) == pytest.approx(sum(c >= u for c in counts) / len(counts))


def test_mann_whitney_normal_approximation_with_ties():
    high = [2.0] * 30 + [3.0] * 30
    low = [1.0] * 30 + [2.0] * 30
    assert mann_whitney_greater(high, low) < 1e-6
    assert mann_whitney_greater(low, high) > 0.99
    same = [1.0, 2.0, 2.0, 3.0] * 10
    assert 0.3 < mann_whitney_greater(same, list(same)) < 0.7


# ---------------------------------------------------------------------------- the rule
def test_noise_does_not_trigger():
    # medians 15 % apart, but the samples overlap: not distinguishable from noise
    reference = [1.00, 1.30, 0.80, 1.25, 0.90, 1.10, 0.95]
    new = [1.15, 1.35, 0.85, 1.40, 0.95, 1.20, 0.82]
    result = compare_samples(reference, new, higher_better=False)
    assert result["worse"] > 0.10
    assert result["status"] == "within noise" and result["p_value"] > 0.01


def test_small_changes_are_unchanged_even_when_significant():
    reference = _noisy(1.0, 40, 0.005, 1)
    new = [t * 1.05 for t in _noisy(1.0, 40, 0.005, 2)]
    result = compare_samples(reference, new, higher_better=False)
    assert result["status"] == "unchanged" and result["change"] == pytest.approx(0.05, abs=0.01)


def test_a_real_20_percent_slowdown_with_many_samples_is_a_regression():
    reference = _noisy(1.0, 30, 0.03, 3)
    new = _noisy(1.2, 30, 0.03, 4)
    result = compare_samples(reference, new, higher_better=False)
    assert result["status"] == "regression"
    assert result["change"] == pytest.approx(0.2, abs=0.03)
    assert result["speedup"] == pytest.approx(1 / 1.2, abs=0.03)
    assert result["p_value"] < 1e-6 and "Mann-Whitney" in result["evidence"]


def test_throughput_drop_is_a_regression_and_a_rise_an_improvement():
    reference = _noisy(1000.0, 20, 0.02, 5)
    assert compare_samples(reference, _noisy(800.0, 20, 0.02, 6), higher_better=True)["status"] == "regression"
    assert compare_samples(reference, _noisy(1250.0, 20, 0.02, 7), higher_better=True)["status"] == "improvement"
    # the same rise read as a time is a slowdown
    assert compare_samples(reference, _noisy(1250.0, 20, 0.02, 7), higher_better=False)["status"] == "regression"


def test_a_single_sample_comparison_is_not_called_a_regression():
    result = compare_samples([1.0], [1.5], higher_better=False)
    assert result["status"] == "unconfirmed" and result["p_value"] is None
    assert "sample" in result["evidence"]
    # five samples on one side and one on the other: still not enough
    assert compare_samples(_noisy(1.0, 5, 0.01, 8), [1.5], higher_better=False)["status"] == "unconfirmed"


def test_repeated_violation_confirms_when_samples_are_too_few():
    repeated = compare_samples([1.0], [1.5], higher_better=False, previous=[1.4])
    assert repeated["status"] == "regression" and "repeated" in repeated["evidence"]
    once = compare_samples([1.0], [1.5], higher_better=False, previous=[1.02])
    assert once["status"] == "unconfirmed"


@pytest.mark.parametrize("extra, expected", [
    ({"metric": "throughput", "unit": "samples/s"}, True),
    ({"unit": "GB/s"}, True),
    ({"metric": "bandwidth"}, True),
    ({"metric": "latency", "unit": "ms"}, False),
    ({"metric": "step_time", "unit": "s"}, False),
    ({}, False),
    ({"metric": "time", "higher_is_better": True}, True),  # explicit wins
])
def test_direction_from_extra_info(extra, expected):
    assert higher_is_better(extra) is expected


def test_benchmark_row_reads_time_and_throughput_samples():
    times = [0.10, 0.11, 0.09, 0.10, 0.12]
    row = benchmark_row(bench_entry("test_fwd", "xpu", times, work_size=64.0, torch_version="2.8.0"))
    assert row["samples"] == pytest.approx(tuple(64.0 / t for t in times))
    assert row["value"] == pytest.approx(640.0) and row["unit"] == "samples/s"
    # a time metric in milliseconds: samples are converted from pytest-benchmark's seconds
    timed = bench_entry("test_lat", "xpu", times, metric="latency", unit="ms")
    assert benchmark_row(timed)["samples"] == pytest.approx(tuple(t * 1000 for t in times))
    # without raw data a benchmark has one sample (its median)
    no_data = bench_entry("test_fwd", "xpu", times, work_size=64.0, keep_data=False)
    assert benchmark_row(no_data)["n_samples"] == 1
    with pytest.raises(ValueError):
        benchmark_row({"name": "x", "stats": {}, "extra_info": {"metric": "throughput"}})


def test_geometric_mean():
    assert geometric_mean([2.0, 0.5]) == pytest.approx(1.0)
    assert geometric_mean([1.1, 1.1, 1.1]) == pytest.approx(1.1)
    assert geometric_mean([]) is None


# ---------------------------------------------------------------------------- tables from files
def test_history_and_baseline_tables(tmp_path):
    steady = {"test_fwd": _noisy(0.1, 15, 0.02, 10)}
    bench_file(tmp_path / "base", "base", "xpu", {"test_step": _noisy(0.5, 15, 0.02, 11), **steady})
    bench_file(tmp_path / "cur", "n1", "xpu", {"test_step": _noisy(0.5, 15, 0.02, 12), **steady}, when="2025-06-02T00:00:00")
    bench_file(tmp_path / "cur", "n2", "xpu", {"test_step": _noisy(0.625, 15, 0.02, 13), "test_fwd": _noisy(0.1, 15, 0.02, 14)},
               when="2025-06-03T00:00:00")
    current = load_results([tmp_path / "cur"]).benchmarks
    baseline = load_results([tmp_path / "base"]).benchmarks
    table = compare_benchmarks(current, baseline).set_index("name")
    step = table.loc["test_step[bf16-xpu-ws1]"]
    assert step["status"] == "regression" and step["ref_source"] == "baseline" and step["runs"] == 2
    assert step["change"] == pytest.approx(-0.2, abs=0.03)  # throughput 20 % lower = 25 % longer steps
    assert table.loc["test_fwd[bf16-xpu-ws1]", "status"] == "unchanged"
    summary = summarise_benchmarks(table.reset_index())
    assert summary.iloc[0]["regressions"] == 1
    assert summary.iloc[0]["geomean_speedup"] == pytest.approx((0.8 * 1.0) ** 0.5, abs=0.03)
    # without a baseline the oldest run of the history is the reference
    history = compare_benchmarks(current).set_index("name")
    assert history.loc["test_step[bf16-xpu-ws1]", "ref_source"] == "first of 2 runs"
    assert history.loc["test_step[bf16-xpu-ws1]", "status"] == "regression"
    # a single run has nothing to compare with
    single = compare_benchmarks(load_results([tmp_path / "base"]).benchmarks)
    assert set(single["status"]) == {"no reference"}


# ---------------------------------------------------------------------------- host drift
def test_host_drift_splits_a_change_into_the_hosts_part_and_the_benchmarks_own():
    # throughput -25 % while the host's memory probe fell 24 %: the host explains it
    drift = host_drift(75.0, 30.4, 100.0, 40.0, higher_better=True)
    assert drift["host_change"] == pytest.approx(-0.24) and drift["explained"]
    assert drift["adjusted_change"] == pytest.approx((75 / 30.4) / (100 / 40) - 1)
    # the host was steady: the same drop is the benchmark's own
    assert not host_drift(75.0, 40.0, 100.0, 40.0, higher_better=True)["explained"]
    # the host got faster while the benchmark got slower: not explained either
    assert not host_drift(75.0, 53.0, 100.0, 40.0, higher_better=True)["explained"]
    # a time metric follows the inverse of the host speed: 30 % longer on a 25 % slower host
    assert host_drift(1.30, 30.0, 1.0, 40.0, higher_better=False)["explained"]
    # the host slowed down more than the benchmark: it explains the whole slowdown
    over = host_drift(85.0, 30.0, 100.0, 40.0, higher_better=True)
    assert over["explained"] and over["adjusted_change"] > 0.1
    # the host slowed down, but far less than the benchmark: the rest is the benchmark's own
    assert not host_drift(70.0, 38.0, 100.0, 40.0, higher_better=True)["explained"]
    # a host that barely moved explains nothing, even in the same direction
    assert not host_drift(89.0, 39.4, 100.0, 40.0, higher_better=True)["explained"]
    assert not host_drift(1.12, 39.2, 1.0, 40.0, higher_better=False)["explained"]
    # within the threshold there is nothing to explain
    assert not host_drift(95.0, 38.0, 100.0, 40.0, higher_better=True)["explained"]


def test_host_reference_value_reads_the_probe_of_the_benchmarks_kind():
    extra = {"host_bound": "memory", "host_reference": {"memory_gbs": 31.5, "compute_gflops": 90.0}}
    assert host_reference_value(extra) == 31.5
    assert host_reference_value({**extra, "host_bound": "compute"}) == 90.0
    assert host_reference_value({**extra, "host_bound": None}) is None
    assert host_reference_value({**extra, "host_bound": "disk"}) is None
    assert host_reference_value({"host_bound": "memory"}) is None
    assert host_reference_value({"host_bound": "memory", "host_reference": {"memory_gbs": "fast"}}) is None


def test_a_slowdown_the_host_probe_shares_is_host_drift_not_a_regression(tmp_path):
    bench_file(tmp_path / "base", "base", "cpu", {"test_copy": _noisy(0.5, 15, 0.02, 21)}, host=("memory", 40.0))
    bench_file(tmp_path / "cur", "n1", "cpu", {"test_copy": _noisy(0.667, 15, 0.02, 22)}, host=("memory", 30.0),
               when="2025-06-02T00:00:00")
    current = load_results([tmp_path / "cur"]).benchmarks
    baseline = load_results([tmp_path / "base"]).benchmarks
    row = compare_benchmarks(current, baseline).iloc[0]
    assert row["status"] == "host drift", row["evidence"]
    assert row["host_change"] == pytest.approx(-0.25)
    assert abs(row["adjusted_change"]) < 0.05
    assert "memory reference moved -25%" in row["evidence"] and "was: regression" in row["evidence"]
    summary = summarise_benchmarks(compare_benchmarks(current, baseline)).iloc[0]
    assert summary["regressions"] == 0 and summary["host_drift"] == 1
    # the same slowdown on a steady host stays a regression
    bench_file(tmp_path / "cur2", "n1", "cpu", {"test_copy": _noisy(0.667, 15, 0.02, 22)}, host=("memory", 40.0),
               when="2025-06-02T00:00:00")
    steady = compare_benchmarks(load_results([tmp_path / "cur2"]).benchmarks, baseline).iloc[0]
    assert steady["status"] == "regression" and steady["adjusted_change"] == pytest.approx(steady["change"])
    # a flat figure on a much faster host stays unchanged, but the evidence says what the host did
    bench_file(tmp_path / "cur3", "n1", "cpu", {"test_copy": _noisy(0.5, 15, 0.02, 23)}, host=("memory", 55.0),
               when="2025-06-02T00:00:00")
    flat = compare_benchmarks(load_results([tmp_path / "cur3"]).benchmarks, baseline).iloc[0]
    assert flat["status"] == "unchanged" and "relative to the host -2" in flat["evidence"]


# ---------------------------------------------------------------------------- the history rule
from accel_reports.analyse.benchmarks import judge_against_history, judge_series, noise_band  # noqa: E402


def _series(values, host=None, spread=0.02, up=True):
    rows = []
    for i, value in enumerate(values):
        samples = tuple(value * (1 + spread * (j - 2) / 2) for j in range(5))  # IQR = spread * median
        rows.append({"value": value, "samples": samples, "higher_is_better": up,
                     "host_bound": "memory" if host else None, "host_ref": host[i] if host else None})
    return rows


def test_the_band_is_wide_for_a_scattered_history_and_floored_for_a_tight_one():
    tight = noise_band([100.0, 100.5, 99.5, 100.2, 99.8])
    assert tight.low == pytest.approx(100 / 1.1, rel=0.01) and tight.high == pytest.approx(110, rel=0.01)  # 10 % floor
    wide = noise_band([100.0, 140.0, 70.0, 120.0, 85.0])
    assert wide.high / wide.centre > 1.5
    # three values, two of which agree: the MAD is ~0, the standard deviation is not
    few = noise_band([100.0, 100.0, 40.0])
    assert few.low < 40.0
    # rounds spreading 60 % within each run: the band cannot be ±10 %
    assert noise_band([100.0] * 5, spreads=[0.6] * 5).high > 150.0
    # one wild run among many does not widen the band much
    robust = noise_band([100.0, 101.0, 99.0, 100.5, 99.5, 100.2, 3.0])
    assert robust.low > 85.0


def test_an_excursion_needs_the_next_run_to_be_a_regression():
    history = [100.0, 101.0, 99.0, 100.5, 99.5]
    once = judge_against_history(70.0, history, higher_better=True)
    assert once["status"] == "suspect" and "not confirmed" in once["evidence"]
    twice = judge_against_history(70.0, history + [71.0], higher_better=True)
    assert twice["status"] == "regression" and "confirmed" in twice["evidence"]
    assert judge_against_history(140.0, history + [139.0], higher_better=True)["status"] == "improvement"
    # a time metric: larger is slower
    assert judge_against_history(1.4, [1.0, 1.01, 0.99, 1.0, 1.4], higher_better=False)["status"] == "regression"
    # back inside after one excursion
    assert judge_against_history(100.0, history + [70.0], higher_better=True)["status"] == "unchanged"
    # too short a history: suspect, whatever happened before
    assert judge_against_history(50.0, [100.0, 101.0], higher_better=True)["status"] == "suspect"
    # a noisy run outside, unconfirmed: labelled so
    assert judge_against_history(70.0, history, higher_better=True, spread=0.8)["status"] == "too noisy"


def test_a_memory_bound_benchmark_is_judged_relative_to_the_host_probe():
    # the throughput follows the host's memory bandwidth: -40 % with the host at -40 % is unchanged
    values = [10.0, 10.2, 9.9, 10.1, 10.0, 6.0, 6.1]
    hosts = [40.0, 40.5, 39.8, 40.2, 40.0, 24.0, 24.3]
    result = judge_series(_series(values, hosts))
    assert result["host"] and result["status"] == "unchanged"
    assert result["host_change"] == pytest.approx(24.3 / 40.0 - 1, abs=0.01)
    assert result["band_low"] < 6.1 < result["band_high"]  # the band in GB/s at today's probe
    # the same drop on a steady host is the benchmark's own: a confirmed regression
    steady = judge_series(_series(values, [40.0] * 7))
    assert steady["status"] == "regression" and "relative to the host's memory probe" in steady["evidence"]
    # without the probe in every run the raw figures are judged
    raw = _series(values, hosts)
    raw[2]["host_ref"] = None
    assert not judge_series(raw)["host"] and judge_series(raw)["status"] == "regression"


def test_the_round_spread_floors_the_band_by_the_medians_standard_error():
    # steady medians from 10 rounds that spread 15 %: a median moves ~4 % by its rounds alone, not 15 %
    steady = [100.0, 100.8, 99.4, 100.3, 99.7]
    many = noise_band(steady, spreads=[0.15] * 5, rounds=10)
    assert 110.0 <= many.high < 115.0 and many.low > 100 / 1.15  # 3 standard errors of a 10-round median
    assert noise_band(steady, spreads=[0.15] * 5, rounds=1).high > 130.0  # one round: the round spread itself
    # so a 20 % slowdown in two runs of such a benchmark is a confirmed regression
    rows = _series(steady + [83.3, 83.0], spread=0.15)
    for row in rows:
        row["n_samples"] = 10
    assert judge_series(rows)["status"] == "regression"


def test_the_host_probe_is_used_only_where_it_steadies_the_history():
    # a compute-bound figure steadier than its probe (the probe jitters, the benchmark does not)
    values = [100.0, 100.5, 99.6, 100.2, 99.8, 83.0, 83.2]
    jitter = [40.0, 52.0, 31.0, 47.0, 35.0, 44.0, 38.0]
    rows = _series(values, jitter)
    for row in rows:
        row["host_bound"] = "compute"
    result = judge_series(rows)
    assert not result["host"] and result["status"] == "regression"
    # the memory-bound benchmark that follows its probe keeps being judged relative to it
    following = judge_series(_series([10.0, 12.9, 7.8, 11.7, 8.8, 10.9, 9.5], jitter))
    assert following["host"] and following["status"] == "unchanged"


def test_compare_benchmarks_with_a_history_frame(tmp_path):
    for i, median in enumerate([0.5, 0.505, 0.495, 0.5, 0.502, 0.6]):
        bench_file(tmp_path / "h", f"run-{i}", "cpu", {"test_step": _noisy(median, 12, 0.01, 40 + i)},
                   when=f"2025-06-0{i + 1}T00:00:00")
    history = load_results([tmp_path / "h"]).benchmarks
    bench_file(tmp_path / "now", "run-6", "cpu", {"test_step": _noisy(0.6, 12, 0.01, 50)}, when="2025-06-07T00:00:00")
    current = load_results([tmp_path / "now"]).benchmarks
    row = compare_benchmarks(current, history=history).iloc[0]
    assert row["status"] == "regression" and row["history_runs"] == 6 and not row["quick"]
    assert row["spread"] == pytest.approx(0.0135, abs=0.01) and row["band_low"] < row["ref_value"] < row["band_high"]
    # the current run already stored in the history (accel report --history appends first): not its own reference
    both = compare_benchmarks(current, history=pd.concat([history, current], ignore_index=True)).iloc[0]
    assert both["history_runs"] == 6 and both["status"] == "regression"
    summary = summarise_benchmarks(compare_benchmarks(current, history=history)).iloc[0]
    assert summary["regressions"] == 1 and summary["quick"] == 0


def test_a_quick_run_against_a_full_baseline_is_not_compared(tmp_path):
    bench_file(tmp_path / "base", "base", "cpu", {"test_step": _noisy(0.5, 12, 0.01, 60)})
    path = bench_file(tmp_path / "cur", "cur", "cpu", {"test_step": _noisy(2.0, 12, 0.01, 61)}, when="2025-06-02T00:00:00")
    path.write_text(path.read_text().replace('"unit": "samples/s"', '"unit": "samples/s", "quick": true'))
    row = compare_benchmarks(load_results([tmp_path / "cur"]).benchmarks, load_results([tmp_path / "base"]).benchmarks).iloc[0]
    assert row["quick"] and row["status"] == "quick: not compared" and row["change"] is None
    assert "never compared" in row["evidence"]
