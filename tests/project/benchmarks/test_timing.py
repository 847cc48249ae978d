"""The benchmark timing helper (suites/benchmarks/timing.py): synchronization, events, warm-up, records."""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import pytest

from accel.backends import base as backends_base
from accel.backends.cpu import CPUBackend
from _fake_clock import FakeClock
from _waits import SAFETY_NET_S

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[3]
SUITES = REPO / "suites" / "benchmarks"


def _load_timing():
    """timing.py under a name of its own, and its measuring module; its siblings load by name, as in the suites."""
    sys.path.insert(0, str(SUITES))
    try:
        spec = importlib.util.spec_from_file_location("accel_bench_timing_under_test", SUITES / "timing.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up
        spec.loader.exec_module(module)
        return module, importlib.import_module("timing_measure")
    finally:
        sys.path.remove(str(SUITES))


timing, timing_measure = _load_timing()


def _load_host_reference():
    spec = importlib.util.spec_from_file_location("accel_bench_host_reference_under_test", SUITES / "host_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


host_reference = _load_host_reference()


# ---------------------------------------------------------------------------- fake backends
#: one fake call (about a millisecond) and a benchmark round of 16 of them
CALL_S = 2.0 ** -10
ROUND_S = 16 * CALL_S


class QueueBackend(CPUBackend):
    """A CPU backend that behaves like an asynchronous device.

    ``enqueue(seconds)`` queues work and returns at once; ``synchronize()`` waits until the queued
    work is done (advances ``clock`` by it). Every call is logged in ``log`` so the order can be checked.
    """

    name = "fakequeue"

    def __init__(self, clock: FakeClock):
        super().__init__()
        self.clock = clock
        self.pending = 0.0
        self.log: list[str] = []
        self.syncs = 0

    def enqueue(self, seconds: float) -> None:
        self.log.append("work")
        self.pending += seconds

    def synchronize(self, index=None) -> None:
        self.syncs += 1
        self.log.append("sync")
        if self.pending:
            self.clock.advance(self.pending)
            self.pending = 0.0


class FakeEvent:
    def __init__(self, backend: "EventBackend", enable_timing: bool):
        self.backend = backend
        self.enable_timing = enable_timing
        self.recorded = False
        self.synchronized = False
        backend.events.append(self)

    def record(self, stream=None) -> None:
        self.recorded = True
        self.backend.log.append("record")

    def synchronize(self) -> None:
        self.synchronized = True
        self.backend.log.append("event-sync")

    def elapsed_time(self, end: "FakeEvent") -> float:
        assert self.enable_timing and end.enable_timing, "events must be created with enable_timing=True"
        assert self.recorded and end.recorded, "elapsed_time before both events were recorded"
        assert end.synchronized, "elapsed_time read before the end event was synchronized"
        self.backend.log.append("elapsed")
        return self.backend.elapsed_ms.pop(0)


class EventBackend(CPUBackend):
    """A backend with device events (``use_host_timers = False``) whose elapsed times are scripted."""

    name = "fakeevents"
    use_host_timers = False

    def __init__(self, elapsed_ms):
        super().__init__()
        self.elapsed_ms = list(elapsed_ms)
        self.events: list[FakeEvent] = []
        self.log: list[str] = []
        self.host_syncs = 0

    def event(self, enable_timing: bool = False):
        return FakeEvent(self, enable_timing)

    def synchronize(self, index=None) -> None:
        self.host_syncs += 1


class _ClockShim:
    """Stands in for the ``time`` module inside accel.backends.base: logs every read of ``clock``."""

    def __init__(self, log, clock: FakeClock):
        self.log = log
        self.clock = clock

    def perf_counter(self) -> float:
        self.log.append("clock")
        return self.clock.perf_counter()

    def __getattr__(self, name):
        return getattr(time, name)


# ---------------------------------------------------------------------------- synchronization
def test_host_timer_synchronizes_before_each_clock_read(monkeypatch):
    backend = QueueBackend(FakeClock())
    monkeypatch.setattr(backends_base, "time", _ClockShim(backend.log, backend.clock))
    m = timing.measure(backend, lambda: backend.enqueue(CALL_S), iterations=2, rounds=3, warmup_rounds=1)
    assert m.rounds == 3 and m.iterations == 2 and len(m.warmup_samples) == 1
    log = backend.log
    clocks = [i for i, event in enumerate(log) if event == "clock"]
    assert len(clocks) == 2 * (1 + 3)  # a start and an end read per timed round
    for i in clocks:
        assert log[i - 1] == "sync", f"clock read without a synchronize right before it: {log[max(0, i - 4):i + 1]}"
    # the end read of each round comes after that round's work, behind a synchronize
    for start, end in zip(clocks[::2], clocks[1::2]):
        assert log[start + 1:end - 1] == ["work", "work"]


def test_elapsed_includes_the_rounds_queued_work_and_excludes_earlier_work(timer_clock):
    backend = QueueBackend(timer_clock)
    queued_before, per_call = 64 * CALL_S, CALL_S
    m = timing.measure(backend, lambda: backend.enqueue(per_call), iterations=1, rounds=4, warmup_rounds=1,
                       setup=lambda: backend.enqueue(queued_before))
    # without the closing synchronize a round would take 0 s (enqueue returns at once);
    # without the opening one it would include the setup's queued work
    assert m.samples == [per_call] * 4 and m.warmup_samples == [per_call]
    assert backend.pending == 0.0


def test_device_events_are_used_when_the_backend_has_them():
    scripted = [7.0, 5.0, 6.0, 4.0]  # ms: one warm-up round, then three measured rounds
    backend = EventBackend(scripted)
    calls = []
    m = timing.measure(backend, lambda: calls.append(1), iterations=3, rounds=3, warmup_rounds=1)
    assert m.timing == "device events"
    assert m.warmup_samples == [pytest.approx(0.007)]
    assert m.samples == [pytest.approx(0.005), pytest.approx(0.006), pytest.approx(0.004)]
    assert len(backend.events) == 2 * 4 and all(e.enable_timing and e.recorded for e in backend.events)
    assert backend.log.count("elapsed") == 4
    for i, event in enumerate(backend.log):
        if event == "elapsed":
            assert backend.log[i - 1] == "event-sync"
    assert len(calls) == 1 + 3 * 4  # first touch + (1 warm-up + 3 rounds) x 3 iterations
    assert backend.host_syncs == 0  # events carry the ordering; no host-wide synchronize needed


def test_host_timers_reported_as_such():
    m = timing.measure(CPUBackend(), lambda: None, iterations=1, rounds=2, warmup_rounds=0)
    assert m.timing == "host timers"


# ---------------------------------------------------------------------------- warm-up and calibration
def test_warmup_rounds_are_excluded_from_the_samples(timer_clock):
    calls = []

    def fn():
        calls.append(1)
        timer_clock.advance(64 * CALL_S if len(calls) <= 4 else CALL_S)  # the first touch and 3 warm-up rounds are slow

    m = timing.measure(CPUBackend(), fn, iterations=1, rounds=5, warmup_rounds=3)
    assert len(calls) == 1 + 3 + 5
    assert m.warmup_samples == [64 * CALL_S] * 3
    assert m.samples == [CALL_S] * 5


def test_calibration_picks_iterations_for_the_round_time_and_rounds_for_the_budget(timer_clock):
    # the budget holds 5 rounds of 16 calls, between the minimum (3) and the maximum (6)
    settings = timing.Settings(warmup_rounds=1, min_rounds=3, max_rounds=6, round_time_s=ROUND_S, budget_s=5 * ROUND_S)
    calls = []

    def fn():
        calls.append(1)
        timer_clock.advance(CALL_S)

    m = timing.measure(CPUBackend(), fn, settings)
    assert m.calibration_s == CALL_S
    assert m.iterations == 16 and m.rounds == 5
    assert m.samples == [ROUND_S] * 5 and m.warmup_samples == [ROUND_S]
    # first touch, calibration batches of 1, 2 and 4 calls (the last fills a quarter round), warm-up, rounds
    assert len(calls) == 1 + (1 + 2 + 4) + 16 * (1 + 5)
    capped = timing.Settings(warmup_rounds=0, min_rounds=3, max_rounds=6, round_time_s=ROUND_S, budget_s=100 * ROUND_S)
    assert timing.measure(CPUBackend(), fn, capped).rounds == 6
    floored = timing.Settings(warmup_rounds=0, min_rounds=3, max_rounds=6, round_time_s=ROUND_S, budget_s=ROUND_S)
    assert timing.measure(CPUBackend(), fn, floored).rounds == 3


def test_calibration_trusts_the_longest_batch_not_a_lucky_short_one(timer_clock):
    calls = []

    def fn():  # the first calls are free, then each call costs CALL_S (a latency-bound call on a busy host)
        calls.append(1)
        if len(calls) > 3:
            timer_clock.advance(CALL_S)

    # batches of 1 and 2 calls take no time, 4 and 8 calls less than a quarter of the round, 16 calls fill it
    per_call = timing_measure._calibrate(CPUBackend(), fn, round_time_s=64 * CALL_S)
    assert len(calls) == 1 + 2 + 4 + 8 + 16
    assert per_call == CALL_S  # the fastest batch would say 0
    assert timing_measure._iterations_for(64 * CALL_S, per_call) == 64


def test_smoke_settings_run_once_and_time_one_round():
    calls = []
    m = timing.measure(CPUBackend(), lambda: calls.append(1), timing.SMOKE)
    assert m.rounds == 1 and m.iterations == 1 and not m.warmup_samples
    assert len(calls) == 2  # first touch + the one round


def test_settings_for_quick_disabled_and_full(monkeypatch):
    class Disabled:
        disabled = True

    class Enabled:
        disabled = False

    assert timing.settings_for(Enabled(), environ={}) is timing.FULL
    assert timing.settings_for(Enabled(), environ={timing.QUICK_ENV: "1"}) is timing.QUICK
    smoke = timing.settings_for(Disabled(), environ={})
    assert smoke.smoke and smoke.max_rounds == 1
    standard = timing.settings_for(Enabled(), environ={timing.SET_ENV: "core"})
    assert standard is timing.STANDARD and timing.settings_for(Enabled(), environ={timing.SET_ENV: "all"}) is timing.FULL
    # the standard set times the full run's round size, over fewer rounds; --quick's smaller problems win
    assert standard.round_time_s == timing.FULL.round_time_s and standard.max_rounds < timing.FULL.max_rounds
    assert timing.settings_for(Enabled(), environ={timing.SET_ENV: "core", timing.QUICK_ENV: "1"}) is timing.QUICK


def test_interleaved_variants_share_iterations_and_rotate_order():
    order = []
    fns = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    results = timing.measure_interleaved(CPUBackend(), fns, iterations=1, rounds=4, warmup_rounds=1)
    assert set(results) == {"a", "b"}
    assert all(r.rounds == 4 and len(r.warmup_samples) == 1 and r.iterations == 1 for r in results.values())
    timed = order[2:]  # after one untimed first call of each
    assert timed == ["a", "b", "b", "a", "a", "b", "b", "a", "a", "b"]


def test_reduce_max_makes_samples_the_slowest_rank():
    seen = []

    def fake_max(values):
        seen.append(list(values))
        return [v + 1.0 for v in values]  # "another rank" was one second slower

    m = timing.measure(CPUBackend(), lambda: None, iterations=1, rounds=3, warmup_rounds=2, reduce_max=fake_max)
    assert [len(v) for v in seen] == [3, 2]
    assert all(s >= 1.0 for s in m.samples + m.warmup_samples)


# ---------------------------------------------------------------------------- extra_info and formulas
def test_extra_info_fields_and_throughput_from_the_median():
    m = timing.Measurement(samples=[0.4, 0.1, 0.2, 0.3, 0.25], iterations=5, warmup_samples=[1.0])
    info = timing.extra_info(CPUBackend(), m, metric="matmul", unit="TFLOP/s", work_per_round=2.0,
                             work_unit="TFLOP", dtype="float32", sizes={"n": 4}, extra_key=1)
    for key in ("backend", "device", "dtype", "metric", "unit", "throughput", "higher_is_better", "world_size",
                "work_per_round", "work_unit", "work_size", "sizes", "iterations", "rounds", "warmup_rounds",
                "median_s", "timing", "quick", "torch_version", "accel_version", "torch_threads"):
        assert key in info, key
    assert info["backend"] == "cpu" and info["world_size"] == 1 and info["higher_is_better"] is True
    assert info["median_s"] == 0.25
    assert info["throughput"] == pytest.approx(2.0 / 0.25)
    assert info["work_size"] == info["work_per_round"] == 2.0
    assert info["rounds"] == 5 and info["warmup_rounds"] == 1 and info["extra_key"] == 1
    json.dumps(info)
    with pytest.raises(ValueError, match="numerator"):
        timing.extra_info(CPUBackend(), m, metric="x", unit="GB/s", work_per_round=1.0, work_unit="bytes")


def test_bus_bandwidth_formulas_follow_nccl_tests():
    assert timing.all_reduce_busbw_bytes(1000, 2) == pytest.approx(1000.0)  # 2 (n-1)/n = 1
    assert timing.all_reduce_busbw_bytes(1000, 4) == pytest.approx(1500.0)  # 2 * 3/4
    assert timing.all_gather_busbw_bytes(1000, 2) == pytest.approx(500.0)
    assert timing.all_gather_busbw_bytes(1000, 4) == pytest.approx(750.0)


def test_device_clock_only_moves_while_replaying():
    clock = timing.DeviceClock()
    with pytest.raises(RuntimeError):
        clock.advance(1.0)
    with clock.replaying():
        start = clock()
        clock.advance(0.25)
        assert clock() - start == pytest.approx(0.25)
        with pytest.raises(RuntimeError):
            with clock.replaying():
                pass
    assert clock() > 1.0  # back to the host clock (perf_counter)


# ---------------------------------------------------------------------------- through pytest-benchmark
RECORD_TEST = """
import json, sys, time
import pytest
sys.path.insert(0, {suites!r})
import timing
from accel.backends.cpu import CPUBackend


@pytest.mark.benchmark(timer=timing.DEVICE_CLOCK)
def test_recorded(benchmark):
    backend = CPUBackend()
    m = timing.measure(backend, lambda: time.sleep(0.002), iterations=2, rounds=7, warmup_rounds=2)
    info = timing.extra_info(backend, m, metric="sleep", unit="steps/s", work_per_round=2.0, work_unit="steps")
    timing.record(benchmark, m, info)
    with open("samples.json", "w") as fh:
        json.dump({{"samples": m.samples, "warmup": m.warmup_samples}}, fh)


def test_without_the_clock_is_refused(benchmark):
    m = timing.Measurement(samples=[0.1, 0.2])
    with pytest.raises(RuntimeError, match="device clock"):
        timing.record(benchmark, m, {{}})
    benchmark.pedantic(lambda: None)
"""


def test_record_puts_exactly_the_measured_rounds_into_the_json(pytester, monkeypatch):
    # a pytest started from an xdist worker inherits these and pytest-benchmark would disable itself
    for var in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(var, raising=False)
    pytester.makepyfile(test_record=RECORD_TEST.format(suites=str(SUITES)))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--benchmark-json", "out.json", "-q", timeout=SAFETY_NET_S)
    result.assert_outcomes(passed=2)
    doc = json.loads((pytester.path / "out.json").read_text())
    measured = json.loads((pytester.path / "samples.json").read_text())
    (bench,) = [b for b in doc["benchmarks"] if b["name"] == "test_recorded"]
    assert bench["stats"]["data"] == measured["samples"]  # raw samples kept, warm-up excluded
    assert bench["stats"]["rounds"] == 7
    assert bench["options"]["timer"] == "accel_device_timer"
    assert all(s >= 0.004 for s in bench["stats"]["data"])
    assert bench["stats"]["median"] == pytest.approx(statistics.median(measured["samples"]))
    assert bench["extra_info"]["throughput"] == pytest.approx(2.0 / bench["stats"]["median"])


# ---------------------------------------------------------------------------- host probe
def test_host_probe_measures_compute_and_memory_and_restores_threads():
    import torch

    threads = torch.get_num_threads()
    probe = host_reference.probe(rounds=3, round_s=0.005)
    assert torch.get_num_threads() == threads
    assert len(probe["compute_samples"]) == len(probe["memory_samples"]) == 3
    assert probe["compute_gflops"] == statistics.median(probe["compute_samples"]) > 0
    assert probe["memory_gbs"] == statistics.median(probe["memory_samples"]) > 0
    with pytest.raises(ValueError, match="rounds >= 1"):
        host_reference.probe(rounds=0)


def test_bracket_pools_the_rounds_before_and_after():
    before = {"compute_samples": [10.0, 11.0, 12.0], "memory_samples": [30.0, 31.0, 32.0], "time": 1.0}
    after = {"compute_samples": [20.0, 21.0, 22.0], "memory_samples": [40.0, 41.0, 42.0], "time": 2.0}
    record = host_reference.bracket(before, after)
    assert record["compute_gflops"] == 16.0 and record["memory_gbs"] == 36.0  # medians of the 6 rounds
    assert record["before"] is before and record["after"] is after
    assert set(record["probe"]) == set(host_reference.KINDS)


def test_an_interleaved_memory_probe_replaces_the_brackets_figure():
    before = {"compute_samples": [10.0], "memory_samples": [30.0], "time": 1.0}
    after = {"compute_samples": [12.0], "memory_samples": [50.0], "time": 2.0}
    interleaved = host_reference.paired([20.0, 10.0, 5.0], calls_per_round=2)
    assert interleaved["memory_gbs"] == 10.0 and interleaved["rounds"] == 3
    record = host_reference.bracket(before, after, interleaved)
    assert record["memory_gbs"] == 10.0 and record["memory_gbs_bracket"] == 40.0
    assert record["memory_samples"] == [20.0, 10.0, 5.0]
    assert record["memory_source"].startswith("interleaved")
    assert host_reference.bracket(before, after)["memory_source"] == "bracket"
    with pytest.raises(ValueError, match="no interleaved probe rounds"):
        host_reference.paired([], calls_per_round=1)


def test_extra_info_rejects_an_unknown_host_bound():
    m = timing.Measurement(samples=[0.1, 0.2, 0.3])
    backend = CPUBackend()
    info = timing.extra_info(backend, m, metric="x", unit="GB/s", work_per_round=1.0, work_unit="GB", host_bound="memory")
    assert info["host_bound"] == "memory" and timing.on_host(backend, "compute") == "compute"
    with pytest.raises(ValueError, match="host_bound"):
        timing.extra_info(backend, m, metric="x", unit="GB/s", work_per_round=1.0, work_unit="GB", host_bound="disk")


def test_interleaving_with_the_memory_probe_records_it_apart_from_the_variants(monkeypatch, timer_clock):
    from types import SimpleNamespace

    monkeypatch.setitem(sys.modules, "timing", timing)  # host_reference imports the suites' timing by name
    import torch

    bench = SimpleNamespace(extra_info={})
    settings = timing.Settings(warmup_rounds=1, min_rounds=3, max_rounds=3, round_time_s=ROUND_S, budget_s=ROUND_S)
    threads = []

    def step():
        threads.append(torch.get_num_threads())
        timer_clock.advance(CALL_S)

    # a probe round that costs 64 calls of the step: had the benchmark's calibration or its rounds timed it
    # along with the step, one call would fill the round and the samples would hold the probe's time
    real_probe = host_reference.InterleavedMemoryProbe.__call__

    def slower(self):
        real_probe(self)
        timer_clock.advance(64 * CALL_S)

    monkeypatch.setattr(host_reference.InterleavedMemoryProbe, "__call__", slower)
    results = host_reference.interleave_with_memory_probe(bench, CPUBackend(), {"a": step, "b": step}, settings)
    assert list(results) == ["a", "b"] and results["a"].rounds == results["b"].rounds == 3
    for result in results.values():  # the step's own time, not the probe's
        assert result.iterations == 16 and result.samples == [ROUND_S] * 3, result
    monkeypatch.setattr(host_reference.InterleavedMemoryProbe, "__call__", real_probe)
    probe = bench.extra_info[host_reference.PAIRED_KEY]
    assert probe["rounds"] == 3 and probe["memory_gbs"] > 0  # one probe round per measured round, none in warm-up
    assert set(threads) == {torch.get_num_threads()}  # the probe's single thread never leaks into the benchmark
    single = SimpleNamespace(extra_info={})
    m = host_reference.measure_with_memory_probe(single, CPUBackend(), step, settings)
    assert m.rounds == len(single.extra_info[host_reference.PAIRED_KEY]["memory_samples"]) == 3
    monkeypatch.setenv(host_reference.ENABLED_ENV, "0")
    off = SimpleNamespace(extra_info={})
    host_reference.measure_with_memory_probe(off, CPUBackend(), step, settings)
    assert off.extra_info == {}
    monkeypatch.setenv(host_reference.ENABLED_ENV, "maybe")
    with pytest.raises(ValueError, match="must be 0 or 1"):
        host_reference.enabled()


def test_host_correlation_finds_the_probe_a_benchmark_follows(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("accel_bench_host_correlation", SUITES / "host_correlation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    paths = []
    for i, (compute, memory) in enumerate([(90.0, 40.0), (100.0, 30.0), (115.0, 45.0), (95.0, 50.0)]):
        bench = {"name": "test_follows_compute[cpu]",
                 "extra_info": {"throughput": 2.0 * compute, "host_bound": "compute",
                                "host_reference": {"compute_gflops": compute, "memory_gbs": memory}}}
        path = tmp_path / f"run{i}.json"
        path.write_text(json.dumps({"benchmarks": [bench]}))
        paths.append(path)
    compute_r, memory_r = module.correlations(module.collect(paths)["test_follows_compute[cpu]"])
    assert compute_r == pytest.approx(1.0) and abs(memory_r) < 0.9
    assert module.main([str(p) for p in paths]) == 0
    assert "+1.00" in capsys.readouterr().out
    assert module.main([str(paths[0])]) == 2  # one run proves nothing
