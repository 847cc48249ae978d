"""Generated qualification results, for the report's tests, its benchmark and demos.

The data follow the rules a real matrix shows rather than coin flips: multi-rank tests skip where
the machine lacks devices (``needs-devices``) or the backend has no collectives
(``needs-multiprocess``), DeepSpeed tests skip where it is not installed (``needs-package``), fp16
skips on old-torch MPS (``unsupported-dtype``); ``all_gather`` fails on xpu with torch 2.7-2.8
(known issue ``pytorch-135550``); checkpoint tests fail with accel 0.1.0 (known issue
``accel-17``, fixed in 0.2.0, so it is reported as passing there); large-memory tests run out of
memory on cuda (one signature whatever the size); a few tests time out at random.

Files are written with the harness' own :class:`accel_harness.records.RecordWriter`, so they are exactly
what a run writes. Everything is deterministic for a given ``seed``.

    python tests/support/_synthetic_results.py OUT_DIR [--runs 50] [--tests 2000] [--seed 0] [--history 10]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from accel_harness.known_issues import KnownIssues
from accel_harness.records import RecordWriter, RunHeader, TestRecord, make_record

__all__ = [
    "ACCEL_VERSIONS",
    "BACKENDS",
    "KNOWN_ISSUES_YAML",
    "TORCH_VERSIONS",
    "Generated",
    "SynthTest",
    "bench_entry",
    "catalogue",
    "generate",
    "longrepr",
    "write_benchmarks",
    "write_run",
]

BACKENDS = ("cpu", "cuda", "xpu", "hpu", "mps")
TORCH_VERSIONS = ("2.5.1", "2.6.0", "2.7.1", "2.8.0", "2.9.0")
ACCEL_VERSIONS = ("0.1.0", "0.2.0")
DEVICE_COUNT = {"cpu": 4, "cuda": 8, "xpu": 2, "hpu": 8, "mps": 1}
#: backend -> (driver version, runtime version) written into the generated run headers
DRIVERS = {"cpu": (None, None), "cuda": ("550.54.15", "CUDA 12.6"), "xpu": ("1.3.29735", "SYCL 2025.1"),
           "hpu": ("1.19.0", "SynapseAI 1.19.0"), "mps": (None, "Metal 3")}
DEVICE_MODEL = {"cpu": "Intel(R) Xeon(R) Platinum 8480+", "cuda": "NVIDIA H100 80GB HBM3",
                "xpu": "Intel(R) Data Center GPU Max 1550", "hpu": "GAUDI2", "mps": "Apple M2 Max"}

KNOWN_ISSUES_YAML = """\
issues:
  - id: pytorch-135550
    url: https://github.com/pytorch/pytorch/issues/135550
    title: all_gather_into_tensor fails with UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY on xccl
    backends: [xpu]
    torch: ">=2.7,<2.9"
    tests: ["suites/test_collectives.py::test_all_gather*"]
  - id: accel-17
    url: https://github.com/example/accel/issues/17
    title: load_state loses the optimizer state when the checkpoint has no scheduler
    tests: ["suites/test_checkpointing.py::*"]
    error: "KeyError: 'optimizer'"
"""

_MODULES = [
    # module, functions, dtype params, world sizes, tags
    ("test_collectives", ["test_all_gather", "test_all_reduce", "test_broadcast", "test_reduce_scatter", "test_gather_object"], [None], [1, 2, 4], {"collective"}),
    ("test_amp", ["test_autocast_forward", "test_grad_scaler", "test_mixed_precision_step"], ["fp16", "bf16"], [1], {"amp"}),
    ("test_checkpointing", ["test_save_load_state", "test_resume_dataloader", "test_safetensors_roundtrip"], [None], [1, 2], {"checkpoint"}),
    ("test_deepspeed", ["test_zero2_step", "test_zero3_gather", "test_offload_optimizer"], ["bf16"], [2, 4], {"deepspeed"}),
    ("test_memory", ["test_find_executable_batch_size", "test_large_alloc", "test_peak_memory"], [None], [1], {"memory"}),
    ("test_data_loader", ["test_shard_batches", "test_dispatch_batches", "test_skip_first_batches"], [None], [1, 2], set()),
    ("test_training", ["test_train_step", "test_gradient_accumulation", "test_clip_grad_norm"], ["fp32", "bf16"], [1, 2, 4], set()),
]


@dataclass(frozen=True)
class SynthTest:
    """One test before a backend is chosen: ``nodeid(backend)`` gives the instance's nodeid."""

    module: str
    function: str
    params: tuple[str, ...]
    world_size: int
    tags: frozenset = field(default_factory=frozenset)
    variant: int = 0

    def nodeid(self, backend: str) -> str:
        params = "-".join([*self.params, backend, f"ws{self.world_size}"])
        name = self.function + (f"_{self.variant}" if self.variant else "")
        return f"suites/{self.module}.py::{name}[{params}]"


def catalogue(count: int) -> list[SynthTest]:
    """``count`` distinct tests (the same catalogue for every backend)."""
    base = []
    for module, functions, dtypes, sizes, tags in _MODULES:
        for function in functions:
            for dtype in dtypes:
                for size in sizes:
                    base.append((module, function, (dtype,) if dtype else (), size, frozenset(tags)))
    out = []
    variant = 0
    while len(out) < count:
        for module, function, params, size, tags in base:
            if len(out) == count:
                break
            out.append(SynthTest(module, function, params, size, tags, variant))
        variant += 1
    return out


def longrepr(error_lines: Sequence[str], where: str = "suites/test_x.py", line: int = 42, frames: int = 3) -> str:
    """A pytest long traceback ending in ``error_lines`` (the ``E`` lines)."""
    parts = []
    for i in range(frames):
        parts.append(
            f"    def helper_{i}(model, batch):\n"
            f"        out = model(batch)\n"
            f">       loss = step_{i}(out, target=batch.labels, scale=0.{i + 5})\n\n"
            f"/opt/ci/work/accel/{where}:{line + i * 17}: \n"
            + "_" * 40 + "\n"
        )
    parts.append("".join(f"E       {e}\n" for e in error_lines))
    parts.append(f"\n/opt/ci/work/accel/{where}:{line}: {error_lines[0].split(':')[0]}")
    return "\n".join(parts)


def _outcome(test: SynthTest, backend: str, torch_version: str, accel_version: str, rng: random.Random) -> tuple[str, Any]:
    """``(outcome, text)``; text is the skip text or the failure's longrepr."""
    torch_minor = tuple(int(p) for p in torch_version.split(".")[:2])
    tags = test.tags
    where = f"suites/{test.module}.py"
    if backend == "mps" and test.world_size > 1:
        return "skipped", "Skipped: [needs-multiprocess] mps has no collective backend: single process only"
    if test.world_size > DEVICE_COUNT[backend]:
        return "skipped", f"Skipped: [needs-devices] needs {test.world_size} {backend} devices, found {DEVICE_COUNT[backend]}"
    if "deepspeed" in tags and backend in ("xpu", "hpu", "mps"):
        return "skipped", "Skipped: [needs-package] deepspeed is not installed"
    if "fp16" in test.params and backend == "mps" and torch_minor < (2, 8):
        return "skipped", "Skipped: [unsupported-dtype] fp16 autocast on mps needs torch >= 2.8"
    if test.function == "test_peak_memory" and backend == "hpu":
        return "skipped", "Skipped: [known-limitation] hpu has no resettable peak memory statistic"
    if test.variant % 7 == 6 and test.module == "test_training":
        return "skipped", "Skipped: [opt-in] slow; run with --run-slow"
    if test.function == "test_all_gather" and backend == "xpu" and (2, 7) <= torch_minor < (2, 9):
        size = rng.choice([64, 128, 512])
        return "failed", longrepr([
            f"RuntimeError: UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY in all_gather_into_tensor ({size} MiB on xpu:{rng.randrange(2)})",
        ], where, 88)
    if "checkpoint" in tags and accel_version == "0.1.0" and test.function == "test_save_load_state":
        return "failed", longrepr(["KeyError: 'optimizer'"], where, 120)
    if test.function == "test_large_alloc" and backend == "cuda" and test.variant % 3 == 0:
        gib = rng.choice(["2.00", "4.00", "8.50"])
        return "failed", longrepr([
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {gib} GiB. GPU 0 has a total capacity "
            f"of 79.11 GiB of which {rng.uniform(0.1, 1.5):.2f} GiB is free.",
        ], where, 64)
    if backend == "hpu" and "bf16" in test.params and test.function == "test_mixed_precision_step" and torch_minor >= (2, 8):
        diff = rng.uniform(0.01, 0.2)
        return "failed", longrepr([
            "AssertionError: Tensor-likes are not close!",
            f"Mismatched elements: {rng.randrange(2, 60)} / 4096 ({diff:.1%})",
        ], where, 73)
    if backend == "mps" and test.function == "test_clip_grad_norm":
        return "xfailed", None
    if rng.random() < 0.0008:
        return "failed", longrepr([f"TimeoutError: collective did not finish within 300 s on rank {rng.randrange(4)}"], where, 31)
    return "passed", None


def write_run(
    path: str | Path,
    *,
    run_id: str,
    backend: str,
    torch_version: str,
    accel_version: str,
    records: Iterable[TestRecord | Mapping[str, Any]],
    start_time: str = "2025-01-01T00:00:00.000+00:00",
    interrupted: bool = False,
    device_count: int | None = None,
    git_commit: str | None = None,
    header_extra: Mapping[str, Any] | None = None,
    end_extra: Mapping[str, Any] | None = None,
) -> Path:
    """Write one harness results file (header, records, and a ``run_end`` unless ``interrupted``);
    ``header_extra`` goes into the header's ``extra`` (fingerprint, profile, ...), ``end_extra`` into
    the ``run_end`` line (profile coverage, the test selection's fingerprint, ...)."""
    header = RunHeader(
        run_id=run_id, start_time=start_time, accel_version=accel_version, torch_version=torch_version,
        torch_build="cpu" if backend == "cpu" else {"cuda": "CUDA 12.6", "xpu": "XPU 2025.1"}.get(backend, backend),
        python="3.11.9", os="Linux-6.8.0-45-generic-x86_64-with-glibc2.39", kernel="6.8.0-45-generic",
        host=f"{backend}-lab-01", git_commit=git_commit or hashlib.sha1(f"accel {accel_version}".encode()).hexdigest(),
        backends=[backend], device_models={backend: [DEVICE_MODEL.get(backend, backend)] * (device_count or DEVICE_COUNT.get(backend, 1))},
        device_count={backend: device_count or DEVICE_COUNT.get(backend, 1)},
        driver_versions={backend: DRIVERS.get(backend, (None, None))[0]},
        runtime_versions={backend: DRIVERS.get(backend, (None, None))[1]},
        extra=dict(header_extra or {}),
    )
    writer = RecordWriter(path, header)
    for record in records:
        writer.write(record)
    if interrupted:
        writer._fh.close()  # what a killed run leaves: no run_end line
    else:
        writer.close(**dict(end_extra or {}))
    return Path(path)


def bench_entry(
    name: str,
    backend: str,
    times: Sequence[float],
    *,
    work_size: float | None = None,
    metric: str = "throughput",
    unit: str = "samples/s",
    torch_version: str | None = None,
    accel_version: str | None = None,
    dtype: str = "bf16",
    world_size: int = 1,
    device: str | None = None,
    group: str | None = None,
    keep_data: bool = True,
    host: tuple[str, float] | None = None,
    quick: bool | None = None,
    sizes: Mapping[str, Any] | None = None,
    work_unit: str | None = None,
) -> dict[str, Any]:
    """One pytest-benchmark entry with the ``extra_info`` keys :mod:`accel_reports.analyse.benchmarks` reads.

    ``host`` = (``host_bound`` kind, host probe figure) adds the host reference of that kind.
    """
    ordered = sorted(times)
    n = len(ordered)
    median = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
    mean = sum(ordered) / n
    stddev = (sum((t - mean) ** 2 for t in ordered) / (n - 1)) ** 0.5 if n > 1 else 0.0
    extra: dict[str, Any] = {"backend": backend, "device": device or DEVICE_MODEL.get(backend, backend),
                             "dtype": dtype, "world_size": world_size, "metric": metric, "unit": unit}
    if torch_version:
        extra["torch_version"] = torch_version
    if accel_version:
        extra["accel_version"] = accel_version
    if host is not None:
        kind, figure = host
        extra["host_bound"] = kind
        extra["host_reference"] = {{"compute": "compute_gflops", "memory": "memory_gbs"}[kind]: figure}
    if quick is not None:
        extra["quick"] = bool(quick)
    if sizes:
        extra["sizes"] = dict(sizes)
    if work_unit:
        extra["work_unit"] = work_unit
    if work_size is not None:
        extra["work_size"] = work_size
        extra["throughput"] = work_size / median
        extra["higher_is_better"] = True
    stats = {"min": ordered[0], "max": ordered[-1], "mean": mean, "stddev": stddev, "rounds": n, "median": median,
             "iterations": 1, "ops": 1.0 / mean, "total": sum(ordered)}
    if keep_data:
        stats["data"] = list(times)
    return {"group": group, "name": f"{name}[{dtype}-{backend}-ws{world_size}]",
            "fullname": f"suites/benchmarks/test_perf.py::{name}[{dtype}-{backend}-ws{world_size}]",
            "params": {"backend": backend}, "param": f"{dtype}-{backend}-ws{world_size}",
            "extra_info": extra, "options": {"min_rounds": n, "timer": "perf_counter"}, "stats": stats}


def write_benchmarks(path: str | Path, entries: Sequence[Mapping[str, Any]], *, when: str = "2025-01-01T00:00:00",
                     machine_info: Mapping[str, Any] | None = None) -> Path:
    """A pytest-benchmark JSON file holding ``entries``."""
    doc = {
        "machine_info": {"node": "lab-01", "processor": "x86_64", "machine": "x86_64", "python_version": "3.11.9",
                         **(machine_info or {})},
        "commit_info": {"id": "0" * 40, "dirty": False, "branch": "main"},
        "benchmarks": list(entries),
        "datetime": when,
        "version": "5.1.0",
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc, indent=1), encoding="utf-8")
    return Path(path)


_BENCHES = [("test_train_step", 256.0), ("test_all_reduce_bandwidth", 64.0 * 2**20), ("test_forward", 512.0),
            ("test_optimizer_step", 1.0), ("test_dataloader_throughput", 1024.0)]
#: problem sizes recorded with each generated benchmark (``extra_info["sizes"]``)
_BENCH_SIZES = {"test_train_step": {"batch": 256, "hidden": 4096, "layers": 8},
                "test_all_reduce_bandwidth": {"bytes": 64 * 2**20},
                "test_forward": {"batch": 512, "seq": 128}, "test_optimizer_step": {"params": 350_000_000},
                "test_dataloader_throughput": {"batch": 1024, "workers": 4}}


@dataclass
class Generated:
    runs: list[Path]
    benchmarks: list[Path]
    known_issues: Path
    cells: list[tuple[str, str, str]]


def generate(
    out: str | Path,
    *,
    runs: int = 50,
    tests: int = 2000,
    seed: int = 0,
    backends: Sequence[str] = BACKENDS,
    torch_versions: Sequence[str] = TORCH_VERSIONS,
    accel_versions: Sequence[str] = ACCEL_VERSIONS,
    benchmarks: bool = True,
    bench_samples: int = 15,
    slow_cell: tuple[str, str] | None = ("xpu", "2.9.0"),
    history: int = 1,
    cells: Sequence[tuple[str, str, str]] | None = None,
    quick_cells: Sequence[tuple[str, str]] = (),
) -> Generated:
    """Write ``runs`` results files of ``tests`` tests each (cells backend × torch × accel, cycled),
    a known-issues YAML and, with ``benchmarks``, one pytest-benchmark JSON per run (the
    ``slow_cell``'s ``test_train_step`` is 25 % slower with accel 0.2.0 than with 0.1.0).

    ``history`` > 1 writes that many consecutive runs of each cell, a day apart (a nightly
    history: trends and noise bands); the ``slow_cell``'s ``test_train_step`` is then 25 % slower
    in the newest run of its cell only, and the benchmarks drift slowly with a little noise.
    ``cells`` replaces the cycled backend × torch × accel cells; ``quick_cells`` (backend, torch)
    mark their benchmarks as ``--quick`` runs (``extra_info["quick"]``)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    known_path = out / "known_issues.yaml"
    known_path.write_text(KNOWN_ISSUES_YAML, encoding="utf-8")
    import yaml

    known = KnownIssues.from_data(yaml.safe_load(KNOWN_ISSUES_YAML), str(known_path))
    tests_list = catalogue(tests)
    if history < 1:
        raise ValueError(f"history must be at least 1, got {history}")
    cells = list(cells) if cells else [(b, t, a) for a in accel_versions for b in backends for t in torch_versions]
    start = datetime(2025, 6, 1, tzinfo=timezone.utc)
    run_paths, bench_paths, used_cells = [], [], []
    for index in range(runs):
        backend, torch_version, accel_version = cells[(index // history) % len(cells)]
        night = index % history  # 0 = the oldest run of this cell
        used_cells.append((backend, torch_version, accel_version))
        when = start + (timedelta(days=night, minutes=index) if history > 1 else timedelta(hours=index))
        run_id = when.strftime("%Y%m%dT%H%M%SZ") + f"-{index:08x}"
        records = []
        for test in tests_list:
            nodeid = test.nodeid(backend)
            outcome, text = _outcome(test, backend, torch_version, accel_version, rng)
            record = make_record(run_id=run_id, nodeid=nodeid, backend=backend, outcome=outcome,
                                 duration=round(rng.uniform(0.01, 2.0) * test.world_size, 3), world_size=test.world_size,
                                 text=text, message="known mps limitation" if outcome == "xfailed" else None)
            if outcome in ("failed", "error"):
                issue = known.match_failure(record.test_id, nodeid, backend, torch_version, text)
                record.known_issue = issue.id if issue else None
            elif outcome == "passed":
                tracked = known.match_test(record.test_id, nodeid, backend, torch_version)
                if tracked:
                    record.extra["tracked_pass"] = [i.id for i in tracked]
            records.append(record)
        path = write_run(out / f"{backend}-torch{torch_version}-accel{accel_version}-{index:03d}.jsonl", run_id=run_id,
                         backend=backend, torch_version=torch_version, accel_version=accel_version, records=records,
                         start_time=when.isoformat(timespec="milliseconds"))
        run_paths.append(path)
        if benchmarks:
            entries = []
            for name, work in _BENCHES:
                base = 0.05 * (1 + _BENCHES.index((name, work)) * 0.3) * {"cpu": 8.0, "mps": 3.0}.get(backend, 1.0)
                if slow_cell and (backend, torch_version) == slow_cell and name == "test_train_step":
                    if (history == 1 and accel_version != accel_versions[0]) or (history > 1 and night == history - 1):
                        base *= 1.25
                if history > 1:
                    base *= 1 + 0.004 * night + rng.gauss(0, 0.01)  # slow drift and night-to-night noise
                times = [base * rng.lognormvariate(0, 0.03) for _ in range(bench_samples)]
                unit = "B/s" if "bandwidth" in name else "samples/s"
                entries.append(bench_entry(name, backend, times, work_size=work, metric="bandwidth" if "bandwidth" in name else "throughput",
                                           unit=unit, torch_version=torch_version, accel_version=accel_version,
                                           quick=(backend, torch_version) in quick_cells or None, sizes=_BENCH_SIZES.get(name),
                                           work_unit="B" if unit == "B/s" else "samples"))
            bench_paths.append(write_benchmarks(out / f"bench-{backend}-torch{torch_version}-accel{accel_version}-{index:03d}.json",
                                                entries, when=when.strftime("%Y-%m-%dT%H:%M:%S")))
    return Generated(runs=run_paths, benchmarks=bench_paths, known_issues=known_path, cells=used_cells)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="write generated qualification results")
    parser.add_argument("out")
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--tests", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--history", type=int, default=1, help="consecutive runs of each cell (a nightly history)")
    args = parser.parse_args(argv)
    generated = generate(args.out, runs=args.runs, tests=args.tests, seed=args.seed, history=args.history)
    print(f"wrote {len(generated.runs)} runs, {len(generated.benchmarks)} benchmark files and {generated.known_issues}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
