"""The script ``accel launch`` runs in the CLI tests: prints what each launched process sees.

Each process reports its rank, the world size the launcher set and the active backend with its
device count. With ``ACCEL_TEST_EXPECTED_WORLD_SIZE`` set, a different world size is an error, so a
launcher that starts fewer processes than asked fails instead of passing quietly.
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    """Print this process's view of the launch; exit 1 if the world size is not the expected one."""
    from accel.backends import get_backend

    backend = get_backend()
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    print(f"Successfully ran on {backend.device_count()} {backend.name} device(s) as process {rank} of {world}")
    expected = os.environ.get("ACCEL_TEST_EXPECTED_WORLD_SIZE")
    if expected is not None and int(expected) != world:
        print(f"expected {expected} processes, the launcher started {world}", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
