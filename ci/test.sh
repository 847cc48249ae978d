#!/usr/bin/env bash
# The project's test command (README: "Run the tests"): the project's own tests.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python -m pytest -q -n 2 "$@"
