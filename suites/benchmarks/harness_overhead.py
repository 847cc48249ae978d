"""Cost of one trivial multi-process test in the harness, pytest's own overhead included.

Generates a suite of N tests marked ``world_size(2)`` that each do one ``all_reduce``, and runs it
with pytest twice: with 1 test and with N+1 tests. The difference divided by N is the per-test cost
once the rank pool is warm (interpreter start, collection and the pool start cancel out). The long
run also records when pytest starts each test (a ``conftest.py`` next to the suite): the median gap
between consecutive starts is the per-test cost measured inside one session, which a busy host
disturbs far less than the difference of two whole runs. Then a suite with one hanging test
measures what a hang costs beyond its ``--dist-timeout``.

    python suites/benchmarks/harness_overhead.py [--tests 100] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

TEST = textwrap.dedent(
    """
    @pytest.mark.world_size(2)
    def test_all_reduce_{i}(backend):
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == 2
    """
)
HEADER = "import pytest\nimport torch\nimport torch.distributed as dist\nimport time\n"
#: records the moment pytest starts each test; written where ACCEL_BENCH_STARTS points
CONFTEST = textwrap.dedent(
    """
    import os
    import time

    _STARTS = []


    def pytest_runtest_logstart(nodeid, location):
        _STARTS.append(time.perf_counter())


    def pytest_sessionfinish(session):
        path = os.environ.get("ACCEL_BENCH_STARTS")
        if path:
            with open(path, "w") as fh:
                fh.write("\\n".join(repr(t) for t in _STARTS))
    """
)
HANG = textwrap.dedent(
    """
    @pytest.mark.world_size(2)
    def test_hang(backend):
        if dist.get_rank() == 0:
            time.sleep(600)
        dist.barrier()
    """
)


def _suite(folder: str, count: int, hang: bool = False) -> str:
    path = os.path.join(folder, f"test_bench_{count}{'_hang' if hang else ''}.py")
    with open(path, "w") as fh:
        fh.write(HEADER + "".join(TEST.format(i=i) for i in range(count)) + (HANG if hang else ""))
    return path


def _gaps(starts_file: str) -> list[float]:
    """Seconds between consecutive test starts, the first test (which starts the pool) left out."""
    with open(starts_file) as fh:
        starts = [float(line) for line in fh.read().split()]
    return [b - a for a, b in zip(starts[1:], starts[2:])]


def _run(path: str, *extra: str, starts_file: str | None = None) -> tuple[float, int]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if starts_file:
        env["ACCEL_BENCH_STARTS"] = starts_file
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--backend", "cpu",
                           "-m", "cpu", path, *extra], capture_output=True, text=True, env=env)
    return time.perf_counter() - start, proc.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hang-timeout", type=float, default=3.0)
    parser.add_argument("--skip-hang", action="store_true", help="leave out the hung-test measurement")
    parser.add_argument("--json")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "conftest.py"), "w") as fh:
            fh.write(CONFTEST)
        starts_file = os.path.join(tmp, "starts.txt")
        small, large = _suite(tmp, 1), _suite(tmp, args.tests + 1)
        per_test, small_s, large_s, in_session = [], [], [], []
        for _ in range(args.repeats):
            t1, rc1 = _run(small)
            tn, rcn = _run(large, starts_file=starts_file)
            if rc1 or rcn:
                print(f"suite failed (exit codes {rc1}, {rcn})", file=sys.stderr)
                return 1
            small_s.append(t1)
            large_s.append(tn)
            per_test.append((tn - t1) / args.tests)
            in_session.append(statistics.median(_gaps(starts_file)))
        hang_extra, rc = None, None
        if not args.skip_hang:
            hang_path = _suite(tmp, 1, hang=True)
            base, _ = _run(small)
            hung, rc = _run(hang_path, "--dist-timeout", str(args.hang_timeout))
            hang_extra = hung - base - args.hang_timeout

    med = statistics.median(per_test) * 1000
    gap = statistics.median(in_session) * 1000
    print(f"{args.tests} trivial 2-rank tests (one all_reduce each) on cpu/gloo, median of {args.repeats}:")
    print(f"  per test, pool warm, pytest included: {med:.1f} ms (samples: {', '.join(f'{p * 1000:.1f}' for p in per_test)})")
    print(f"  per test inside one session (median gap between test starts): {gap:.2f} ms "
          f"(per run: {', '.join(f'{g * 1000:.2f}' for g in in_session)})")
    print(f"  whole run of 1 test: {statistics.median(small_s):.2f} s; of {args.tests + 1} tests: {statistics.median(large_s):.2f} s")
    if hang_extra is not None:
        print(f"  a hung test (--dist-timeout {args.hang_timeout:g}s) cost {hang_extra:+.2f} s beyond its timeout (exit code {rc})")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"per_test_ms": med, "samples_ms": [p * 1000 for p in per_test], "hang_extra_s": hang_extra,
                       "in_session_ms": gap, "in_session_samples_ms": [g * 1000 for g in in_session],
                       "small_run_s": small_s, "large_run_s": large_s}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
