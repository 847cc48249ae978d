"""Cost of one trivial multi-process test in the harness, pytest's own overhead included.

Generates a suite of N tests marked ``world_size(2)`` that each do one ``all_reduce`` and runs it
with pytest. A ``conftest.py`` next to the suite records when pytest starts each test: the median
gap between consecutive starts (the first test, which starts the pool, left out) is the cost of one
test once the rank pool is warm, measured inside one session, which a busy host disturbs far less
than the difference of two whole runs (``--whole-runs``: a 1-test run against an N+1-test run). It
also records the CPU time pytest and its ranks spend per test over the same tests: the work behind
the gap, without the time spent waiting for a CPU (a busy host still inflates it: caches, stolen time).

For a before/after comparison, ``--against DIR`` names a folder holding another copy of
``accel_harness`` (for instance ``git archive HEAD accel_harness | tar -x -C DIR``): runs then
alternate between the installed harness and that copy (put first on ``PYTHONPATH``), so both see
the same host. ``--floor`` adds the same number of plain one-line tests without the harness
(``-p no:accel``): pytest's own cost per test; ``--empty`` adds 2-rank tests whose body does nothing
(the harness's and pytest's cost without the collective); ``--pool`` times the rank pool alone,
outside pytest (an empty task at a time: dispatch, the ranks' hygiene, the outcome back), with the
CPU each rank and the controller spend per task. ``--results-dir`` has the harness write its result
records too. The load average and the number of processes on the host are printed with every
figure, as on a shared machine they move the figures more than most changes do. Last, unless
``--skip-hang``, a suite with one hanging test measures what a hang costs beyond its timeout.

    python suites/benchmarks/harness_overhead.py [--tests 100] [--repeats 3] [--against DIR] [--floor]
        [--empty] [--pool] [--results-dir] [--whole-runs] [--skip-hang] [--json out.json]
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
from typing import Any

TEST = textwrap.dedent(
    """
    @pytest.mark.world_size(2)
    def test_all_reduce_{i}(backend):
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == 2
    """
)
EMPTY = textwrap.dedent(
    """
    @pytest.mark.world_size(2)
    def test_empty_{i}(backend):
        pass
    """
)
PLAIN = textwrap.dedent(
    """
    def test_plain_{i}():
        assert torch.ones(1).item() == 1
    """
)
HEADER = "import pytest\nimport torch\nimport torch.distributed as dist\nimport time\n"
#: records the moment pytest starts each test, and the CPU time the session (pytest and its ranks)
#: spends from the second test's start to the end of the last one; written where ACCEL_BENCH_STARTS points
CONFTEST = textwrap.dedent(
    """
    import json
    import os
    import time

    _STARTS = []
    _CPU = {}


    def _cpu_seconds():
        # this process and every process below it (the harness's ranks), from /proc
        import psutil

        me = psutil.Process()
        total = sum(me.cpu_times()[:2])
        for child in me.children(recursive=True):
            try:
                total += sum(child.cpu_times()[:2])
            except psutil.Error:
                pass
        return total


    def pytest_runtest_logstart(nodeid, location):
        _STARTS.append(time.perf_counter())
        if len(_STARTS) == 2:
            _CPU["start"] = (_STARTS[-1], _cpu_seconds())


    def pytest_sessionfinish(session):
        path = os.environ.get("ACCEL_BENCH_STARTS")
        if path:
            if "start" in _CPU:
                _CPU["end"] = (time.perf_counter(), _cpu_seconds())
            import sys

            harness = getattr(sys.modules.get("accel_harness"), "__file__", None)
            with open(path, "w") as fh:
                json.dump({"starts": _STARTS, "cpu": _CPU, "tests": len(_STARTS) - 1, "harness": harness}, fh)
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


#: the pool alone, outside pytest: one empty task after another; prints a JSON line
POOL_SCRIPT = textwrap.dedent(
    """
    import json, os, pickle, statistics, sys, time
    import psutil
    from accel_harness.distributed import RankPool, Task

    count, module_file = int(sys.argv[1]), sys.argv[2]
    pool = RankPool("cpu", 2, "fork", 120.0, env={"OMP_NUM_THREADS": "1"})
    pool.start()
    try:
        task = Task("harness_overhead_empty", module_file, "empty", pickle.dumps({}))
        for _ in range(20):
            pool.run(task)
        ranks = [psutil.Process(pid) for pid in pool.pids()]
        before = [sum(r.cpu_times()[:2]) for r in ranks], time.process_time()
        times = []
        for _ in range(count):
            start = time.perf_counter()
            result = pool.run(task)
            times.append(time.perf_counter() - start)
            assert result.status == "passed", result
        after = [sum(r.cpu_times()[:2]) for r in ranks], time.process_time()
    finally:
        pool.close()
    print(json.dumps({"wall": statistics.median(times), "controller_cpu": (after[1] - before[1]) / count,
                      "rank_cpu": [(b - a) / count for a, b in zip(before[0], after[0])]}))
    """
)


def _pool_round_trip(folder: str, count: int, harness_tree: str | None) -> dict[str, Any]:
    """Median seconds per empty task through a warm 2-rank pool, with the CPU seconds per task it cost."""
    module = os.path.join(folder, "harness_overhead_empty.py")
    with open(module, "w") as fh:
        fh.write("def empty(**kwargs):\n    pass\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if harness_tree:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (harness_tree, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-c", POOL_SCRIPT, str(count), module], capture_output=True, text=True,
                          env=env, cwd=folder)
    if proc.returncode:
        raise SystemExit(f"the pool round trip failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _suite(folder: str, count: int, hang: bool = False, plain: bool = False, empty: bool = False) -> str:
    kind = "plain" if plain else "empty" if empty else "bench"
    path = os.path.join(folder, f"test_{kind}_{count}{'_hang' if hang else ''}.py")
    body = PLAIN if plain else EMPTY if empty else TEST
    with open(path, "w") as fh:
        fh.write(HEADER + "".join(body.format(i=i) for i in range(count)) + (HANG if hang else ""))
    return path


def _session(starts_file: str) -> tuple[list[float], float | None, str | None]:
    """(seconds between consecutive test starts, the first test left out; CPU seconds per test over
    them; the accel_harness the session imported).

    The CPU figure covers pytest and its ranks from the second test's start to the session's end,
    divided by the tests run in that window; None when the clock did not move (too few tests)."""
    with open(starts_file) as fh:
        data = json.load(fh)
    starts = data["starts"]
    gaps = [b - a for a, b in zip(starts[1:], starts[2:])]
    cpu = data.get("cpu", {})
    per_test = None
    if "start" in cpu and "end" in cpu and data["tests"] > 0:
        spent = cpu["end"][1] - cpu["start"][1]
        per_test = spent / data["tests"] if spent > 0 else None
    return gaps, per_test, data.get("harness")


def host_load() -> str:
    """The host's 1-minute load average and process count, as printed next to every figure."""
    try:
        load = f"{os.getloadavg()[0]:.1f}"
    except OSError:
        load = "?"
    try:
        procs = str(sum(1 for entry in os.listdir("/proc") if entry.isdigit()))
    except OSError:
        procs = "?"
    return f"load {load}, {procs} processes"


def _run(path: str, *extra: str, starts_file: str | None = None, harness_tree: str | None = None,
         harness: bool = True) -> tuple[float, int, str]:
    """Run pytest on ``path``; (seconds, exit code, its output)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if starts_file:
        env["ACCEL_BENCH_STARTS"] = starts_file
    if harness_tree:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (harness_tree, env.get("PYTHONPATH")) if p)
    args = ["--backend", "cpu", "-m", "cpu"] if harness else ["-p", "no:accel"]
    start = time.perf_counter()
    # run from the suite's folder: ``python -m`` puts the working directory first on sys.path, where a
    # checkout's own accel_harness would win over the one under test
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, path, *extra],
                          capture_output=True, text=True, env=env, cwd=os.path.dirname(path))
    return time.perf_counter() - start, proc.returncode, proc.stdout + proc.stderr


def _check_tree(folder: str) -> str:
    folder = os.path.abspath(folder)
    if not os.path.isfile(os.path.join(folder, "accel_harness", "plugin.py")):
        raise SystemExit(f"--against {folder}: no accel_harness/plugin.py there (give the folder that holds accel_harness)")
    return folder


def _ms(values: list[float]) -> str:
    return ", ".join(f"{v * 1000:.2f}" for v in values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--against", metavar="DIR", help="folder with another accel_harness copy: alternate runs with it")
    parser.add_argument("--floor", action="store_true", help="also time plain tests without the harness (-p no:accel)")
    parser.add_argument("--pool", action="store_true",
                        help="also time the pool alone, outside pytest: 1000 empty tasks through a warm 2-rank pool")
    parser.add_argument("--empty", action="store_true",
                        help="also time 2-rank tests with an empty body: the harness and pytest without gloo")
    parser.add_argument("--results-dir", action="store_true", help="have the harness write result records too")
    parser.add_argument("--whole-runs", action="store_true",
                        help="also time a 1-test run each round: per test = difference of the two whole runs / N")
    parser.add_argument("--hang-timeout", type=float, default=3.0)
    parser.add_argument("--skip-hang", action="store_true", help="leave out the hung-test measurement")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if args.tests < 2 or args.repeats < 1:
        parser.error("--tests needs at least 2 and --repeats at least 1")
    variants: list[tuple[str, str | None, bool]] = [("harness", None, True)]
    if args.against:
        variants.append(("against", _check_tree(args.against), True))
    if args.empty:
        variants.append(("empty body", None, True))
        if args.against:
            variants.append(("empty body, against", _check_tree(args.against), True))
    if args.floor:
        variants.append(("pytest alone", None, False))

    results_tree = os.path.join(os.path.abspath(args.against), "accel_harness") if args.against else ""
    results: dict[str, dict[str, list]] = {name: {"gap": [], "cpu": [], "per_test": [], "small": [], "large": [], "load": []}
                                          for name, _, _ in variants}
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "conftest.py"), "w") as fh:
            fh.write(CONFTEST)
        starts_file = os.path.join(tmp, "starts.txt")
        small, large = _suite(tmp, 1), _suite(tmp, args.tests + 1)
        plain_small, plain_large = _suite(tmp, 1, plain=True), _suite(tmp, args.tests + 1, plain=True)
        empty_small, empty_large = _suite(tmp, 1, empty=True), _suite(tmp, args.tests + 1, empty=True)
        extra = ["--results-dir", os.path.join(tmp, "results")] if args.results_dir else []
        for _ in range(args.repeats):
            for name, tree, harness in variants:
                suite_small, suite_large = ((empty_small, empty_large) if name.startswith("empty body") else
                                            (small, large) if harness else (plain_small, plain_large))
                load = host_load()
                t1, rc1, out1 = (_run(suite_small, *(extra if harness else []), harness_tree=tree, harness=harness)
                                 if args.whole_runs else (0.0, 0, ""))
                tn, rcn, outn = _run(suite_large, *(extra if harness else []), starts_file=starts_file,
                                     harness_tree=tree, harness=harness)
                if rc1 or rcn:
                    print(f"{name}: suite failed (exit codes {rc1}, {rcn})\n{(out1 if rc1 else outn)[-3000:]}",
                          file=sys.stderr)
                    return 1
                gaps, cpu, imported = _session(starts_file)
                if harness:
                    expected = os.path.join(tree, "accel_harness") if tree else None
                    if imported is None or (expected and not imported.startswith(expected + os.sep)) \
                            or (not expected and args.against and imported.startswith(results_tree + os.sep)):
                        print(f"{name}: the session imported the wrong accel_harness ({imported})", file=sys.stderr)
                        return 1
                gap = statistics.median(gaps)
                entry = results[name]
                entry["gap"].append(gap)
                if cpu is not None:
                    entry["cpu"].append(cpu)
                if args.whole_runs:
                    entry["per_test"].append((tn - t1) / args.tests)
                    entry["small"].append(t1)
                entry["large"].append(tn)
                entry["load"].append(f"{load} / {host_load()}")
                cpu_text = f", CPU {cpu * 1000:.2f} ms" if cpu is not None else ""
                print(f"  {name}: {gap * 1000:.2f} ms per test{cpu_text} ({load} before, {host_load()} after)", flush=True)
        pool_trips: dict[str, list[dict[str, Any]]] = {}
        if args.pool:
            trees = [("harness", None)] + ([("against", _check_tree(args.against))] if args.against else [])
            for _ in range(args.repeats):
                for name, tree in trees:
                    load = host_load()
                    trip = _pool_round_trip(tmp, 1000, tree)
                    trip["host"] = load
                    pool_trips.setdefault(name, []).append(trip)
                    print(f"  pool alone, {name}: {trip['wall'] * 1000:.3f} ms per empty task ({load})", flush=True)
        hang_extra, rc = None, None
        if not args.skip_hang:
            hang_path = _suite(tmp, 1, hang=True)
            base, _, _ = _run(small)
            hung, rc, _ = _run(hang_path, "--dist-timeout", str(args.hang_timeout))
            hang_extra = hung - base - args.hang_timeout

    print(f"{args.tests} trivial 2-rank tests (one all_reduce each) on cpu/gloo"
          f"{' with result records' if args.results_dir else ''}, {args.repeats} run(s) each:")
    for name, _, harness in variants:
        entry = results[name]
        what = {"harness": "this harness", "against": "the copy in --against", "pytest alone": "plain tests, no harness",
                "empty body": "this harness, tests that do nothing",
                "empty body, against": "the copy in --against, tests that do nothing"}[name]
        print(f"  {name} ({what}): median gap between test starts {statistics.median(entry['gap']) * 1000:.2f} ms "
              f"(per run: {_ms(entry['gap'])})")
        if entry["cpu"]:
            print(f"    CPU time per test (pytest and its ranks): {statistics.median(entry['cpu']) * 1000:.2f} ms "
                  f"(per run: {_ms(entry['cpu'])})")
        if entry["per_test"]:
            print(f"    difference of whole runs per test: {statistics.median(entry['per_test']) * 1000:.1f} ms "
                  f"(per run: {_ms(entry['per_test'])}); whole run of 1 test {statistics.median(entry['small']):.2f} s")
        print(f"    whole run of {args.tests + 1} tests: {statistics.median(entry['large']):.2f} s")
        print(f"    host before / after each run: {'; '.join(entry['load'])}")
    for name, trips in pool_trips.items():
        walls = [t["wall"] for t in trips]
        ranks = [sum(t["rank_cpu"]) / len(t["rank_cpu"]) for t in trips]
        controller = [t["controller_cpu"] for t in trips]
        print(f"  pool alone, {name} (an empty task through a warm 2-rank pool, no pytest): median "
              f"{statistics.median(walls) * 1000:.3f} ms (per run: {_ms(walls)}); CPU per task: each rank "
              f"{statistics.median(ranks) * 1000:.3f} ms, controller {statistics.median(controller) * 1000:.3f} ms")
        print(f"    host before each run: {'; '.join(t['host'] for t in trips)}")
    if hang_extra is not None:
        print(f"  a hung test (--dist-timeout {args.hang_timeout:g}s) cost {hang_extra:+.2f} s beyond its timeout (exit code {rc})")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"tests": args.tests, "hang_extra_s": hang_extra,
                       "variants": {name: {"in_session_ms": statistics.median(e["gap"]) * 1000,
                                           "in_session_samples_ms": [g * 1000 for g in e["gap"]],
                                           "cpu_ms": statistics.median(e["cpu"]) * 1000 if e["cpu"] else None,
                                           "cpu_samples_ms": [c * 1000 for c in e["cpu"]],
                                           "per_test_ms": statistics.median(e["per_test"]) * 1000 if e["per_test"] else None,
                                           "samples_ms": [p * 1000 for p in e["per_test"]],
                                           "small_run_s": e["small"], "large_run_s": e["large"], "host": e["load"]}
                                    for name, e in results.items()},
                       "pool_alone": pool_trips}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
