#!/usr/bin/env bash
# The one set-up behind the README's two commands (make qualify, make test) and CI's .ci/run: a
# virtual environment with torch, the project with its test extras, and the emulated device's
# plug-in. Run again, it reuses what is there and installs only when the project's requirements
# changed. Needs no root; the system packages a few tests use (Chromium, PostgreSQL) are optional.
#
# torch: a torch already in the environment (a vendor's CUDA, XPU or HPU build) is kept; otherwise
# ACCEL_TORCH (default torch==2.13.0, the CPU build) is installed. Every later install runs under a
# constraints file holding torch at the installed version, so no dependency can replace it.
#
#   ACCEL_VENV   the environment's folder (default .venv)
#   ACCEL_TORCH  the pip requirement for torch when none is installed (default torch==2.13.0)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${ACCEL_VENV:-.venv}"
TORCH_REQUIREMENT="${ACCEL_TORCH:-torch==2.13.0}"
PIP=(-m pip install --quiet --disable-pip-version-check)

if [ ! -x "$VENV/bin/python" ]; then
    echo "setup: creating the virtual environment $VENV"
    python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"

# the installed torch's version, read from its metadata (importing torch takes seconds)
torch_version() {
    "$PY" -c "import importlib.metadata as m; print('torch==' + m.version('torch').split('+')[0])" 2>/dev/null
}
if ! installed=$(torch_version); then
    echo "setup: installing $TORCH_REQUIREMENT"
    "$PY" "${PIP[@]}" "$TORCH_REQUIREMENT"
    installed=$(torch_version)
fi
CONSTRAINTS="$VENV/torch-constraints.txt"
echo "$installed" > "$CONSTRAINTS"

# what the installed project depends on: both pyproject files and the torch they were installed against
fingerprint=$(cat pyproject.toml plugins/accel-emu/pyproject.toml "$CONSTRAINTS" | sha256sum | cut -c1-16)
stamp="$VENV/.accel-setup"
if [ "$(cat "$stamp" 2>/dev/null)" = "$fingerprint" ] && "$PY" -c "import accel, accel_emu" 2>/dev/null; then  # both cheap to import
    echo "setup: $VENV is up to date ($(cat "$CONSTRAINTS"))"
else
    echo "setup: installing the project and the emu plug-in into $VENV ($(cat "$CONSTRAINTS"))"
    "$PY" "${PIP[@]}" -c "$CONSTRAINTS" -e '.[test,postgres]'
    # the emulated device, installed the way a vendor's plug-in is (its C++ extension is built against
    # this torch, below or at first use, into its cache folder)
    "$PY" "${PIP[@]}" -c "$CONSTRAINTS" -e plugins/accel-emu
    echo "$fingerprint" > "$stamp"
    "$PY" -c "import torch, accel; print('setup: torch', torch.__version__, '| accel', accel.__version__)"
fi

# The two C++ builds the tests and qualify runs need, built here rather than inside a test's time limit:
# the emu extension, and DeepSpeed's shared-memory collective op (DeepSpeed compiles it at its first
# init_distributed on cpu, into TORCH_EXTENSIONS_DIR; ci/test.sh points that at this environment's
# torch_extensions folder too). A build that fails here is built again, and reported, where it is used.
prebuilt="$VENV/.accel-prebuilt"
if [ "$(cat "$prebuilt" 2>/dev/null)" != "$fingerprint" ]; then
    echo "setup: building the emu extension and DeepSpeed's shared-memory op for this torch (first set-up, about 2 min)"
    # the environment's own tools first (its ninja): the tests run there, and a build log written by another
    # ninja version (a system one) is discarded by theirs, which then compiles every object again
    if PATH="$(cd "$VENV" && pwd)/bin:$PATH" \
        TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$(cd "$VENV" && pwd)/torch_extensions}" "$PY" -c "
import accel_emu._extension as emu
emu.load_extension()
from deepspeed.accelerator import get_accelerator
get_accelerator().create_op_builder('ShareMemCommBuilder').load(verbose=False)
" > "$VENV/prebuild.log" 2>&1 </dev/null; then
        echo "$fingerprint" > "$prebuilt"
    else
        echo "setup: warning: building the C++ extensions ahead failed (the tests build them again); the end of $VENV/prebuild.log:" >&2
        tail -n 20 "$VENV/prebuild.log" >&2
    fi
fi

for tool in chromium initdb; do
    if [ "$tool" = initdb ]; then
        found=$(ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null | head -n 1)
    else
        found=$(command -v chromium || true)
    fi
    [ -n "$found" ] || echo "setup: optional: $tool is not installed; the tests that need it skip with the reason (Debian: apt-get install ${tool/initdb/postgresql})"
done
