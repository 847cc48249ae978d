"""pytest wiring of the benchmark suites (pytest-benchmark + the accel harness).

* Every benchmark test here gets ``@pytest.mark.benchmark(timer=timing.DEVICE_CLOCK)``, so the
  rounds pytest-benchmark records are the device-synchronized rounds of :mod:`timing`.
* Under pytest-xdist (``-n``) the benchmarks are skipped with a reason: pytest-benchmark disables
  itself there (parallel workers would time each other) and leaves no JSON; run them in their own
  invocation without ``-n`` (``accel bench`` does).
* ``--benchmark-disable`` turns each benchmark into a one-round smoke run with no statistics.
* ``ACCEL_BENCH_QUICK=1`` selects smaller problems and fewer rounds (``accel bench --quick``).
* ``ACCEL_BENCH_THREADS=N`` sets torch's thread count in the pytest process (``accel bench
  --threads N``); ranks of multi-process benchmarks run one thread each (the harness's pools).
* Every benchmark is bracketed by the host probe (``host_reference.py``): ``extra_info["host_reference"]``
  says how fast the host's CPU and memory were just before and just after it, so drift of a shared
  machine can be told from a change of the software. Not in smoke runs (``--benchmark-disable``);
  ``ACCEL_BENCH_HOST_PROBE=0`` turns it off.
* The benchmarking process keeps freed heap memory (glibc ``mallopt``: no heap trimming, a fixed
  32 MiB mmap threshold) instead of handing it back to the kernel: on a VM with free page
  reporting the kernel passes it on to the hypervisor, and the next allocation pays a host page
  fault (what that did to checkpoint loads: docs/benchmarks.md, "Why the benchmarks are built this way").
  Recorded in the machine info as ``heap``; ``ACCEL_BENCH_KEEP_HEAP=0`` turns it off.
* The machine info of the JSON gains ``torch_version``, ``accel_version``, the selected backends
  with their device descriptions, and the whole ``accel env`` report under ``accel_env``.
* The benchmarks named in :data:`CORE_SET` carry the marker ``bench_core``: the standard set
  (``accel bench --set core``, what ``accel qualify`` runs unless ``--thorough``), one headline figure
  per area sized like the full run, so its figures compare with a full run's.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import host_reference
import timing

HERE = Path(__file__).resolve().parent

XDIST_SKIP = ("[opt-in] benchmarks do not run under pytest-xdist (-n): pytest-benchmark disables itself "
              "there and parallel workers would distort each other's timings; run them without -n "
              "(e.g. `accel bench`)")


THREADS_ENV = "ACCEL_BENCH_THREADS"
HOST_PROBE_ENV = host_reference.ENABLED_ENV
KEEP_HEAP_ENV = "ACCEL_BENCH_KEEP_HEAP"
#: glibc mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
KEEP_HEAP = {"trim_threshold": 1 << 30, "mmap_threshold": 32 << 20}
_heap_setting: dict = {"kept": False, "reason": "not configured"}

CORE_MARKER = "bench_core"
#: the standard set: test function -> the parameter combinations in it (an empty mapping: all of them)
CORE_SET: dict[str, list[dict]] = {
    "test_matmul": [{"dtype_name": "float32"}, {"dtype_name": "bfloat16"}],
    "test_train_step": [{}],
    "test_transfer": [{"direction": "h2d", "memory": "pageable"}],
    "test_collective": [{"op": "all_reduce", "size": "large", "nranks": 2}],
}


def in_core_set(item: pytest.Item) -> bool:
    """Whether ``item`` is one of :data:`CORE_SET`'s benchmarks."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    combos = CORE_SET.get(getattr(item, "originalname", item.name), ())
    return any(all(params.get(key) == value for key, value in combo.items()) for combo in combos)


def _flag(name: str) -> bool:
    try:
        return host_reference.env_flag(name)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def keep_heap() -> dict:
    """Ask glibc to keep freed heap memory in the process (see the module docstring); say what happened."""
    if not _flag(KEEP_HEAP_ENV):
        return {"kept": False, "reason": f"{KEEP_HEAP_ENV}=0"}
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError) as exc:
        return {"kept": False, "reason": f"no glibc mallopt here ({exc})"}
    trim = mallopt(M_TRIM_THRESHOLD, KEEP_HEAP["trim_threshold"]) == 1
    mmap = mallopt(M_MMAP_THRESHOLD, KEEP_HEAP["mmap_threshold"]) == 1
    if trim and mmap:
        return {"kept": True, **KEEP_HEAP}
    return {"kept": False, "reason": f"mallopt accepted trim_threshold={trim}, mmap_threshold={mmap}"}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{CORE_MARKER}: one of the standard benchmark set (accel bench --set core)")
    _host_probe_wanted()  # a bad ACCEL_BENCH_HOST_PROBE stops the session once, at start-up
    _heap_setting.clear()
    if _under_xdist(config) or getattr(config.option, "benchmark_disable", False):
        _heap_setting.update({"kept": False, "reason": "benchmarks are not timed in this session"})
    else:
        _heap_setting.update(keep_heap())
    threads = os.environ.get(THREADS_ENV, "").strip()
    if threads:
        import torch

        try:
            count = int(threads)
        except ValueError:
            raise pytest.UsageError(f"{THREADS_ENV} must be a positive integer, got {threads!r}") from None
        if count < 1:
            raise pytest.UsageError(f"{THREADS_ENV} must be a positive integer, got {threads!r}")
        torch.set_num_threads(count)


def _under_xdist(config: pytest.Config) -> bool:
    # not PYTEST_XDIST_WORKER: a pytest started from inside an xdist worker inherits it, yet runs alone
    if hasattr(config, "workerinput"):
        return True
    numprocesses = getattr(config.option, "numprocesses", None)
    return bool(numprocesses) or getattr(config.option, "dist", "no") not in ("no", None)


def _is_ours(item: pytest.Item) -> bool:
    try:
        return Path(str(item.path)).resolve().is_relative_to(HERE)
    except (AttributeError, OSError):
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    xdist = _under_xdist(config)
    for item in items:
        if not _is_ours(item) or "benchmark" not in getattr(item, "fixturenames", ()):
            continue
        if in_core_set(item):
            item.add_marker(CORE_MARKER)
        if xdist:
            item.add_marker(pytest.mark.skip(reason=XDIST_SKIP))
            continue
        existing = item.get_closest_marker("benchmark")
        options = dict(existing.kwargs) if existing is not None else {}
        options["timer"] = timing.DEVICE_CLOCK
        item.add_marker(pytest.mark.benchmark(**options), append=False)


def _selected_backends(config: pytest.Config) -> list[str]:
    try:
        from accel_harness.plugin import _context

        return list(_context(config).selected)
    except Exception:
        return []


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict) -> None:
    import torch

    from accel.backends import get_registry
    from accel.commands.env import collect_environment

    selected = _selected_backends(config)
    registry = get_registry()
    machine_info["torch_version"] = torch.__version__
    try:
        import accel

        machine_info["accel_version"] = accel.__version__
    except Exception:
        machine_info["accel_version"] = "unknown"
    machine_info["bench_quick"] = timing.quick_requested()
    machine_info["bench_set"] = "core" if timing.core_set_requested() else "all"
    machine_info["torch_threads"] = torch.get_num_threads()
    machine_info["bench_backends"] = selected
    devices = {}
    for name in selected:
        try:
            devices[name] = registry.get(name).describe()
        except Exception as exc:  # a description must not lose the results
            devices[name] = {"error": f"{type(exc).__name__}: {exc}"}
    machine_info["accel_devices"] = devices
    machine_info["accel_env"] = collect_environment(include_deepspeed=False)
    machine_info["heap"] = dict(_heap_setting)
    try:
        machine_info["loadavg"] = list(os.getloadavg())
    except (AttributeError, OSError):
        pass


def _host_probe_wanted() -> bool:
    return _flag(HOST_PROBE_ENV)


@pytest.fixture(autouse=True)
def host_probe(request: pytest.FixtureRequest):
    """Bracket each timed benchmark with the host probe and record it in ``extra_info["host_reference"]``."""
    if not _is_ours(request.node) or "benchmark" not in request.fixturenames:
        yield None
        return
    benchmark = request.getfixturevalue("benchmark")
    if getattr(benchmark, "disabled", False) or not _host_probe_wanted():
        yield None
        benchmark.extra_info.pop(host_reference.PAIRED_KEY, None)  # never a stray half record in the JSON
        return
    rounds = 3 if timing.quick_requested() else 5
    before = host_reference.probe(rounds=rounds)
    yield before
    after = host_reference.probe(rounds=rounds)
    interleaved = benchmark.extra_info.pop(host_reference.PAIRED_KEY, None)
    benchmark.extra_info["host_reference"] = host_reference.bracket(before, after, interleaved)


@pytest.fixture
def bench_settings(benchmark) -> timing.Settings:
    """FULL, QUICK (``ACCEL_BENCH_QUICK=1``) or SMOKE (benchmarks disabled) timing settings."""
    return timing.settings_for(benchmark)


@pytest.fixture
def accel_on_backend(backend, monkeypatch):
    """Single-process benchmarks that build an Accelerator: accel selects this instance's backend,
    and the shared state is forgotten before and after (other tests of the session are unaffected)."""
    from accel.state import AcceleratorState, GradientState

    monkeypatch.setenv("ACCEL_DEVICE", backend.name)
    for name in ("ACCEL_USE_CPU", "ACCELERATE_USE_CPU", "ACCEL_MIXED_PRECISION", "ACCELERATE_MIXED_PRECISION",
                 "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield backend
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
