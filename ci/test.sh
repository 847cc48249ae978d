#!/usr/bin/env bash
# The project's test command (README: "Run the tests"): the project's own tests, then the
# conformance suites on the CPU backend (real 2- and 4-rank gloo runs). Two pytest runs because
# tests/ and suites/ are separate rootless folders whose module names overlap.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
status=0
# --timeout: a test that hangs fails with every thread's stack instead of stalling the whole run
python -m pytest tests -q -n 2 --timeout 900 "$@" || status=$?
python -m pytest suites -m cpu -q -n 2 --timeout 900 --ignore=suites/benchmarks "$@" || status=$((status ? status : $?))
exit "$status"
