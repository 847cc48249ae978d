"""Does the history regression rule hold on a shared machine? Real `accel bench` runs, judged run by run.

    python suites/benchmarks/history_noise.py --run 6 --quick-run -k "matmul or train_step" -o OUT
    python suites/benchmarks/history_noise.py -o OUT          # analyse runs already in OUT

``--run N`` makes N full ``accel bench --backend cpu`` runs (same code, one after the other) into
``OUT/full`` and ``--quick-run`` one ``--quick`` run into ``OUT/quick``. Then, with the runs sorted
by time, three experiments, each on its own fresh history database (:mod:`accel_reports.history.store`):

1. **identical code**: each full run is ingested in turn and compared with the runs stored before
   it (``compare_benchmarks(run, history=...)``, what ``accel report --history`` does); every
   status is counted. The target is 0 regressions.
2. **planted slowdown**: the last two full runs are copied with one benchmark's raw round times
   scaled by ``--slowdown`` (1.2: 20 % longer rounds, i.e. -16.7 % throughput); the runs before
   them are the history. The first planted run should be ``suspect`` (outside the band, not yet
   confirmed) and the second a ``regression`` (confirmed). Done for every benchmark and every
   factor (``--slowdown 1.2,1.5,2``) in turn, so the table says how large a slowdown each
   benchmark can show on this machine today.
3. **quick against full**: the quick run ingested on top of the full history: every benchmark
   must be ``quick: not compared``, never a regression.

Prints per-run medians, the band each benchmark ends with and all statuses; ``--json`` writes them.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from accel_reports.analyse.benchmarks import compare_benchmarks  # noqa: E402
from accel_reports.history.store import History  # noqa: E402
from accel_reports.load.loaders import load_results  # noqa: E402


def run_bench(out: Path, count: int, keyword: str | None, quick: bool, threads: int | None = None) -> None:
    for i in range(count):
        cmd = [sys.executable, "-m", "accel.commands.cli", "bench", "--backend", "cpu", "--results-dir", str(out)]
        if keyword:
            cmd += ["-k", keyword]
        if threads:
            cmd += ["--threads", str(threads)]
        if quick:
            cmd.append("--quick")
        print(f"history_noise: {'quick' if quick else 'full'} run {i + 1} of {count}", flush=True)
        subprocess.run(cmd, check=False, cwd=REPO)


def _files(folder: Path) -> list[Path]:
    def when(path: Path) -> str:
        return str(json.loads(path.read_text()).get("datetime") or "")
    return sorted(folder.glob("bench-*.json"), key=when)


def judge_in_turn(files: list[Path], db: Path) -> list[dict]:
    """Ingest each file in turn and compare it with the history before it; one row per benchmark and run."""
    rows = []
    with History(db) as history:
        for index, path in enumerate(files):
            loaded = load_results([path])
            history.ingest(loaded)
            table = compare_benchmarks(loaded.benchmarks, history=history.benchmarks_frame())
            for row in table.to_dict("records"):
                rows.append({"run": index + 1, "file": path.name, "name": row["name"], "value": row["value"],
                             "unit": row["unit"], "status": row["status"], "band_low": row["band_low"],
                             "band_high": row["band_high"], "history_runs": row["history_runs"],
                             "spread": row["spread"], "change": row["change"], "evidence": row["evidence"]})
    return rows


def plant(source: Path, target: Path, name: str, factor: float) -> None:
    """A copy of ``source`` with benchmark ``name``'s round times multiplied by ``factor``."""
    doc = json.loads(source.read_text())
    doc = copy.deepcopy(doc)
    found = False
    for bench in doc["benchmarks"]:
        if bench.get("name") != name:
            continue
        found = True
        stats = bench["stats"]
        stats["data"] = [t * factor for t in stats["data"]]
        for key in ("min", "max", "mean", "median", "q1", "q3", "iqr", "stddev", "total"):
            if isinstance(stats.get(key), (int, float)):
                stats[key] *= factor
        extra = bench.get("extra_info") or {}
        if isinstance(extra.get("throughput"), (int, float)):
            extra["throughput"] /= factor
        if isinstance(extra.get("median_s"), (int, float)):
            extra["median_s"] *= factor
    if not found:
        raise SystemExit(f"history_noise: {name} is not in {source}")
    target.write_text(json.dumps(doc))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--out", required=True, help="folder for the runs (full/, quick/) and the databases")
    parser.add_argument("--run", type=int, default=0, metavar="N", help="make N full accel bench runs first")
    parser.add_argument("--quick-run", action="store_true", help="make one --quick run first")
    parser.add_argument("-k", dest="keyword", help="benchmarks to run (accel bench -k)")
    parser.add_argument("--threads", type=int, help="torch threads in each accel bench run (accel bench --threads)")
    parser.add_argument("--slowdown", default="1.2", help="round-time factors of the planted slowdown, comma-separated (1.2)")
    parser.add_argument("--json", help="write every row here")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.run:
        run_bench(out / "full", args.run, args.keyword, quick=False, threads=args.threads)
    if args.quick_run:
        run_bench(out / "quick", 1, args.keyword, quick=True, threads=args.threads)
    full = _files(out / "full")
    if len(full) < 3:
        raise SystemExit(f"history_noise: need at least 3 full runs in {out / 'full'}, found {len(full)}")
    result: dict = {}
    # 0. the old rule, for comparison: every later run against the first as --baseline
    base = load_results([full[0]]).benchmarks
    old = Counter()
    for path in full[1:]:
        old.update(compare_benchmarks(load_results([path]).benchmarks, base)["status"])
    print(f"0. without a history (each run against run 1 as --baseline, Mann-Whitney rule): {dict(sorted(old.items()))}; "
          f"regressions: {old.get('regression', 0)}")
    result["baseline_rule"] = dict(old)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        # 1. identical code
        rows = judge_in_turn(full, tmp / "identical.db")
        result["identical"] = rows
        names = sorted({r["name"] for r in rows})
        print(f"\n1. identical code: {len(full)} full runs, each compared with the runs before it")
        print(f"{'benchmark':<46} " + " ".join(f"{'run ' + str(i + 1):>9}" for i in range(len(full)))
              + f" {'band (last run)':>22} {'width':>7}")
        for name in names:
            mine = [r for r in rows if r["name"] == name]
            values = {r["run"]: r["value"] for r in mine}
            last = mine[-1]
            band = (f"{last['band_low']:.4g}–{last['band_high']:.4g}" if last["band_low"] is not None else "-")
            width = (f"±{(last['band_high'] / last['band_low']) ** 0.5 - 1:.0%}" if last["band_low"] else "-")
            print(f"{name:<46} " + " ".join(f"{values.get(i + 1, float('nan')):>9.4g}" for i in range(len(full)))
                  + f" {band:>22} {width:>7}")
        print("statuses per run:")
        for i in range(len(full)):
            counts = Counter(r["status"] for r in rows if r["run"] == i + 1)
            print(f"  run {i + 1}: " + ", ".join(f"{s} {n}" for s, n in sorted(counts.items())))
        total = Counter(r["status"] for r in rows)
        print(f"  all runs: {dict(sorted(total.items()))}; regressions: {total.get('regression', 0)}")
        for r in rows:
            if r["status"] in ("suspect", "too noisy", "regression", "improvement"):
                print(f"    run {r['run']} {r['name']}: {r['status']}: {r['evidence']}")

        # 2. planted slowdown in the last two runs, each benchmark and factor in turn
        factors = [float(f) for f in str(args.slowdown).split(",")]
        print(f"\n2. planted slowdown: round times x factor in copies of runs {len(full) - 1} and {len(full)} "
              f"(history: runs 1-{len(full) - 2}); status of planted run {len(full) - 1} / run {len(full)}")
        print(f"{'benchmark':<46} " + " ".join(f"{'x' + format(f, 'g'):>24}" for f in factors))
        planted_rows = []
        for name in names:
            cells = []
            for factor in factors:
                folder = tmp / f"planted-{names.index(name)}-{factor}"
                folder.mkdir()
                files = []
                for i, path in enumerate(full):
                    if i >= len(full) - 2:
                        target = folder / f"{path.stem}-planted.json"
                        plant(path, target, name, factor)
                        files.append(target)
                    else:
                        files.append(path)
                rows2 = [r for r in judge_in_turn(files, folder / "h.db") if r["name"] == name]
                first, second = rows2[-2], rows2[-1]
                planted_rows.append({"name": name, "factor": factor, "first": first["status"], "second": second["status"],
                                     "change": second["change"], "band_low": second["band_low"],
                                     "band_high": second["band_high"], "value": second["value"]})
                cells.append(f"{first['status']} / {second['status']}")
            print(f"{name:<46} " + " ".join(f"{c:>24}" for c in cells), flush=True)
        for factor in factors:
            mine = [r for r in planted_rows if r["factor"] == factor]
            caught = sum(r["second"] == "regression" for r in mine)
            flagged = sum(r["first"] != "unchanged" or r["second"] != "unchanged" for r in mine)
            print(f"  x{factor:g}: a confirmed regression in {caught} of {len(mine)} benchmarks; flagged (suspect or more) "
                  f"in {flagged}")
        result["planted"] = planted_rows

        # 3. a quick run against the full history
        quick = _files(out / "quick") if (out / "quick").is_dir() else []
        if quick:
            rows3 = [r for r in judge_in_turn(full + quick[-1:], tmp / "quick.db") if r["run"] == len(full) + 1]
            counts = Counter(r["status"] for r in rows3)
            print(f"\n3. quick run against {len(full)} full runs: {dict(counts)}")
            result["quick"] = rows3
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
