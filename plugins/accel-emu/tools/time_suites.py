"""Times the conformance suites on emu against cpu: the two suite stages of ``ci/test.sh``, alternating.

Each round runs the cpu stage, then the emu stage (or the other way round on odd rounds, so a machine
that grows busier or quieter during the run weighs on both alike), and records each run's wall time and
CPU time. CPU time is user + sys of every process the stage started: this tool is a child subreaper
(Linux), so fork servers and the ranks they forked, which no process of the stage waits for, are
reaped and counted here as ``ci/test.sh``'s tally counts them. Prints every run, the medians and the
emu / cpu ratios of the medians, with the machine's load average, and exits non-zero when a stage
failed (its ratio would compare unequal work).

    python plugins/accel-emu/tools/time_suites.py [--rounds 3] [-- extra pytest arguments]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

PR_SET_CHILD_SUBREAPER = 36
COMMON = ["-n", "1", "-q", "-p", "no:cacheprovider", "--timeout", "900", "--ignore=suites/benchmarks"]
# the two stages as ci/test.sh runs them (cpu leaves the quick operator sweep to the nightly cell)
STAGES = {
    "cpu": (["suites", "-m", "cpu", *COMMON, "-k", "not test_quick_operator_sweep"], {}),
    "emu": (["suites", "-m", "emu", "--backend", "emu", *COMMON,
             "--known-issues", "plugins/accel-emu/known-issues.yaml", "--known-issues-xfail"],
            {"ACCEL_EMU_DEVICES": "4"}),
}


@dataclass
class Run:
    """One stage run: wall and CPU seconds, pytest's exit status and its summary line."""

    stage: str
    wall: float
    cpu: float
    code: int
    summary: str


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _reap_orphans(grace: float = 5.0) -> None:
    """Waits for descendants left behind by the stage (re-parented here), for at most `grace` seconds."""
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if not pid:
            time.sleep(0.05)


def run_stage(stage: str, extra: list[str]) -> Run:
    """Runs one stage's pytest command from the repository root and measures it."""
    args, env = STAGES[stage]
    cpu_before = _children_cpu()
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", *args, *extra], env={**os.environ, **env},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    wall = time.monotonic() - started
    _reap_orphans()
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    return Run(stage, wall, _children_cpu() - cpu_before, proc.returncode, lines[-1] if lines else "(no output)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="cpu and emu runs per stage (default 3)")
    parser.add_argument("extra", nargs="*", help="more pytest arguments for both stages (after --)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        print("warning: not a child subreaper here; ranks forked by fork servers are not counted", file=sys.stderr)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
    runs: list[Run] = []
    print(f"load average at the start: {os.getloadavg()}", flush=True)
    for i in range(args.rounds):
        for stage in ("cpu", "emu") if i % 2 == 0 else ("emu", "cpu"):
            run = run_stage(stage, args.extra)
            runs.append(run)
            print(f"round {i + 1} {stage}: wall {run.wall:.1f} s, CPU {run.cpu:.1f} s, exit {run.code}: {run.summary}",
                  flush=True)
    print(f"load average at the end: {os.getloadavg()}")
    median = {s: (statistics.median(r.wall for r in runs if r.stage == s),
                  statistics.median(r.cpu for r in runs if r.stage == s)) for s in STAGES}
    for stage, (wall, cpu) in median.items():
        print(f"{stage}: median wall {wall:.1f} s, CPU {cpu:.1f} s over {args.rounds} runs")
    print(f"emu / cpu: wall {median['emu'][0] / median['cpu'][0]:.2f}x, CPU {median['emu'][1] / median['cpu'][1]:.2f}x")
    failed = [r for r in runs if r.code != 0]
    if failed:
        print(f"{len(failed)} run(s) failed; the ratios compare unequal work", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
