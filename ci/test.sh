#!/usr/bin/env bash
# The project's test command (README: "the tests"): the project's own tests, the conformance suites
# on the CPU backend (real 2- and 4-rank gloo runs), then, where the emulated device's plug-in is
# installed (plugins/accel-emu; .ci/run installs it), its own tests and the same suites on emu.
# Separate pytest runs because tests/, suites/ and the plug-in's tests/ are rootless folders whose
# module names overlap.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
status=0
note() { status=$((status ? status : $1)); }
# --timeout: a test that hangs fails with every thread's stack instead of stalling the whole run
python -m pytest tests -q -n 2 --timeout 900 "$@" || note $?
python -m pytest suites -m cpu -q -n 2 --timeout 900 --ignore=suites/benchmarks "$@" || note $?
if python -c "import accel_emu" 2>/dev/null; then
    python -m pytest plugins/accel-emu/tests -q -n 2 --timeout 900 "$@" || note $?
    # every difference from cpu is either fixed or named in the plug-in's known-issues file (xfail)
    python -m pytest suites -m emu --backend emu -q -n 2 --timeout 900 --ignore=suites/benchmarks \
        --known-issues plugins/accel-emu/known-issues.yaml --known-issues-xfail "$@" || note $?
    # a backend made from the device profile alone (no plug-in Backend class) passes the contract suite
    python -m pytest suites/test_backend_contract.py -m emu --backend emu -q --timeout 900 \
        --profile plugins/accel-emu/profile.yaml "$@" || note $?
else
    echo "ci/test.sh: the emulated device is not installed (pip install -e plugins/accel-emu): its tests and the emu suites did not run" >&2
fi
exit "$status"
