#!/usr/bin/env bash
# The project's test command (README: "the tests"): the project's own tests, the conformance suites
# on the CPU backend (real 2- and 4-rank gloo runs), then, where the emulated device's plug-in is
# installed (plugins/accel-emu; .ci/run installs it), its own tests, the same suites on emu and the
# contract suite on a backend made from emu's device profile alone.
#
# Separate pytest runs (stages) because tests/, suites/ and the plug-in's tests/ are rootless folders
# whose module names overlap, and the emu stages load emu into every process. To keep both cores
# busy the stages run in two lanes at once: the project's tests in one, the suites and the plug-in's
# tests one after the other in the other. Each stage's output is printed when it ends; the last
# lines are one tally, counted from each stage's JUnit XML file: per stage and in all, passed,
# failed, skipped and errors, with wall times and CPU times (user + sys of every process the stage
# started: xdist workers, rank pools, fork servers, launched ranks), and emu's suites against cpu's.
# The exit status is non-zero when any stage failed.
#
# Arguments go to every stage (e.g. `bash ci/test.sh -x`). Slow tests (marker `slow`) run only with
# RUN_SLOW=1, as the nightly workflow does. ACCEL_TEST_WORKERS sets the project tests' workers (2).
set -uo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# bytecode of the repository's modules and pytest's rewritten test modules is kept (__pycache__, ignored
# by git): with PYTHONDONTWRITEBYTECODE every pytest process and command the tests start compiles them again
unset PYTHONDONTWRITEBYTECODE
PYTHON="${PYTHON:-python}"
# torch's C++ extension builds (DeepSpeed's ops) go into the environment's own folder, where ci/setup.sh
# built them, rather than the user's shared cache: a build killed in another project can leave a lock there
TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$("$PYTHON" -c 'import sys; print(sys.prefix)')/torch_extensions}"
export TORCH_EXTENSIONS_DIR
WORKERS="${ACCEL_TEST_WORKERS:-2}"

work=$(mktemp -d "${TMPDIR:-/tmp}/accel-test.XXXXXX")
# Inductor's compiled kernels go into this run's own folder, not the cache every job on the machine shares
# (/tmp/torchinductor_$USER): a kernel file cut short there by another job's killed compile failed a
# compiled model row here with "file too short"
TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$work/inductor}"
export TORCHINDUCTOR_CACHE_DIR
trap 'rm -rf "$work"' EXIT
lanes=()   # each lane runs in a process group of its own, so an interrupt reaches every pytest of it
stop() {
    trap - INT TERM
    for lane in "${lanes[@]}"; do
        kill "-$1" -- "-$lane" 2>/dev/null
    done
    wait
    exit 130
}
trap 'stop INT' INT
trap 'stop TERM' TERM

order=()   # stage names in the order the tally lists them
# cpu_time OUT CMD...: runs CMD and writes to OUT the CPU time (user and sys seconds) of every process below
# it, then exits with CMD's status. It is a child subreaper (Linux), so processes whose parent ended
# without waiting for them (a fork server and the ranks it forked) are waited for here and counted too;
# one still running a few seconds after CMD ended is left alone and not counted. A signal does not end it
# before CMD: the lane's process group gets it, CMD with it.
cpu_time='
import ctypes, os, resource, signal, subprocess, sys, time
out, cmd = sys.argv[1], sys.argv[2:]
for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, lambda *_: None)  # a handler, not SIG_IGN: the command gets default handling back
try:
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
except (OSError, AttributeError):
    pass
code = subprocess.Popen(cmd).wait()
deadline = time.monotonic() + 5
while True:
    try:
        pid, _ = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:  # nothing left below this process
        break
    if not pid:
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
with open(out, "w") as fh:
    fh.write(f"{usage.ru_utime:.2f} {usage.ru_stime:.2f}\n")
sys.exit(code if code >= 0 else 128 - code)
'
# stage NAME ARGS...: one pytest run; its output, exit status, start, end and CPU time go into $work; the
# output is printed (whole, under a header) as soon as the run ends
stage() {
    local name=$1
    shift
    date +%s.%N > "$work/$name.start"
    "$PYTHON" -c "$cpu_time" "$work/$name.cpu" "$PYTHON" -m pytest "$@" --junitxml="$work/$name.xml" > "$work/$name.log" 2>&1
    echo $? > "$work/$name.rc"
    date +%s.%N > "$work/$name.end"
    {
        echo "==================== ci/test.sh: $name: pytest $* (exit $(cat "$work/$name.rc"))"
        cat "$work/$name.log"
    } > "$work/$name.out"
    if command -v flock > /dev/null; then
        flock "$work/print.lock" cat "$work/$name.out"   # one stage's output at a time
    else
        cat "$work/$name.out"
    fi
}

# --timeout: a hung test fails with every thread's stack instead of stalling the run; --durations: each
# stage ends with its slowest tests, the list to cut from when the command grows
common=(-q --timeout 900 --durations 15 --durations-min 2)
if "$PYTHON" -c "import accel_emu" 2>/dev/null; then
    emu=1
else
    emu=0
    echo "ci/test.sh: the emulated device is not installed (pip install -e plugins/accel-emu): its tests and the emu suites did not run" >&2
fi

started=$(date +%s.%N)
order+=(tests)
set -m   # job control while the lanes start: a process group each (no job notices afterwards)
# worksteal: an idle worker takes tests queued for a busy one, so one long test does not hold a queue
stage tests tests -n "$WORKERS" --dist worksteal "${common[@]}" "$@" &
lanes+=($!)
order+=(suites-cpu)
[ "$emu" = 1 ] && order+=(emu-plugin suites-emu contract-emu)
# one worker each: the other lane has two. The suites run in an xdist worker as the harness expects
(
    # the operator sweep of the host against itself is the nightly cpu cell's (its full sweep); here the
    # quick sweep runs on emu, where a plug-in's kernels can differ from the host's
    stage suites-cpu suites -m cpu -n 1 "${common[@]}" --ignore=suites/benchmarks \
        -k "not test_quick_operator_sweep" "$@"
    if [ "$emu" = 1 ]; then
        stage emu-plugin plugins/accel-emu/tests "${common[@]}" "$@"
        # every difference from cpu is either fixed or named in the plug-in's known-issues file (xfail);
        # four emu devices (the plug-in's default is two), so the 4-rank tests run as they do on cpu
        ACCEL_EMU_DEVICES=4 stage suites-emu suites -m emu --backend emu -n 1 "${common[@]}" --ignore=suites/benchmarks \
            --known-issues plugins/accel-emu/known-issues.yaml --known-issues-xfail "$@"
        # a backend made from the device profile alone (no plug-in Backend class) passes the contract suite
        stage contract-emu suites/test_backend_contract.py -m emu --backend emu "${common[@]}" \
            --profile plugins/accel-emu/profile.yaml "$@"
    fi
) &
lanes+=($!)
set +m
wait "${lanes[@]}"
lanes=()
ended=$(date +%s.%N)

# the tally: counted from each stage's JUnit file; a stage without one (it crashed, or was killed)
# counts as an error, and so does a stage whose pytest exited non-zero with no failure recorded
"$PYTHON" - "$work" "$started" "$ended" "${order[@]}" <<'EOF'
import os
import sys
import xml.etree.ElementTree as ET

work, started, ended, names = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]
KEYS = ("passed", "failed", "skipped", "errors", "xfailed")


def read(path):
    with open(path) as fh:
        return fh.read().strip()


def count(xml_path):
    counts = dict.fromkeys(KEYS, 0)
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        if "failure" in kinds:
            counts["failed"] += 1
        if "error" in kinds:
            counts["errors"] += 1
        if "skipped" in kinds:
            skipped = next(child for child in case if child.tag == "skipped")
            counts["xfailed" if skipped.get("type") == "pytest.xfail" else "skipped"] += 1
        if not kinds:
            counts["passed"] += 1
    return counts


def line(counts, seconds, cpu=None):
    parts = [f"{counts[key]} {key}" for key in ("passed", "failed", "skipped", "errors")]
    if counts["xfailed"]:
        parts.append(f"{counts['xfailed']} xfailed")
    text = ", ".join(parts) + f" in {seconds:.1f}s"
    if cpu is not None:
        text += f", CPU {sum(cpu):.1f}s (user {cpu[0]:.1f}s + sys {cpu[1]:.1f}s)"
    return text


def cpu_of(name):
    """(user, sys) seconds of the stage's whole process tree, or None when it wrote none."""
    try:
        user, system = read(os.path.join(work, f"{name}.cpu")).split()
        return float(user), float(system)
    except (OSError, ValueError):
        return None


total = dict.fromkeys(KEYS, 0)
total_cpu = [0.0, 0.0]
status = 0
rows = []
walls, cpus = {}, {}
for name in names:
    rc = int(read(os.path.join(work, f"{name}.rc"))) if os.path.exists(os.path.join(work, f"{name}.rc")) else None
    seconds = float(read(os.path.join(work, f"{name}.end"))) - float(read(os.path.join(work, f"{name}.start"))) \
        if os.path.exists(os.path.join(work, f"{name}.end")) else 0.0
    note = ""
    try:
        counts = count(os.path.join(work, f"{name}.xml"))
    except (OSError, ET.ParseError) as exc:
        counts = dict.fromkeys(KEYS, 0)
        counts["errors"] = 1
        note = f"  (no results: {type(exc).__name__})"
    if rc and not counts["failed"] and not counts["errors"]:
        counts["errors"] += 1
        note = f"  (pytest exit {rc} with no failure recorded)"
    if rc is None or rc or counts["failed"] or counts["errors"]:
        status = 1
    for key in KEYS:
        total[key] += counts[key]
    cpu = cpu_of(name)
    walls[name], cpus[name] = seconds, cpu
    if cpu is not None:
        total_cpu = [total_cpu[0] + cpu[0], total_cpu[1] + cpu[1]]
    rows.append(f"  {name:<14} {line(counts, seconds, cpu)}  [exit {rc}]{note}")
print("==================== ci/test.sh: tally (stages ran in two lanes at once; the total is the wall time of all)")
print("\n".join(rows))
print(line(total, ended - started, total_cpu))
if walls.get("suites-cpu") and walls.get("suites-emu"):  # the emulated device's cost against the host's
    ratio = f"  suites-emu / suites-cpu: wall {walls['suites-emu'] / walls['suites-cpu']:.2f}x"
    if cpus.get("suites-cpu") and cpus.get("suites-emu"):
        ratio += f", CPU {sum(cpus['suites-emu']) / sum(cpus['suites-cpu']):.2f}x"
    print(ratio)
sys.exit(status)
EOF
