"""Time every YAML reader of accel on an anchor bomb (the figures of docs/limits.md's YAML item).

For each reader of tests/project/test_yaml_safety.py (profile, known issues, launch config, ...) writes that test's
bomb (nine anchored lists of nine aliases each: 9**9 strings once expanded) and loads it in a subprocess
whose address space may grow by at most 1 GiB; prints, per reader and run, the error, the seconds the
load took and the growth of the process's peak RSS.

    python tests/scripts/time_yaml_bomb.py [--runs 3] [--keep DIR]

``--keep DIR`` writes the bombs into DIR (``profile.yaml``, ``known-issues.yaml``, ...) and leaves them there,
for a command to be timed on them (``accel qualify --profile DIR/profile.yaml``).
"""

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS.parent), str(TESTS / "support")]  # the YAML safety tests' bomb and runner, and their helpers

from tests.project.test_yaml_safety import READERS, _bomb_file, _load_bounded  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--keep", type=Path, metavar="DIR", help="write the bombs here and keep them")
    args = parser.parse_args()
    seconds, growth = [], []
    with tempfile.TemporaryDirectory(prefix="accel_yaml_bomb_") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for kind in sorted(READERS):
            path, _ = _bomb_file(folder, kind)
            for run in range(args.runs):
                result = _load_bounded(kind, path)
                seconds.append(result["seconds"])
                growth.append(result["rss_growth_kib"])
                print(f"{kind}, run {run + 1}: {result['error']} after {result['seconds'] * 1000:.0f} ms, "
                      f"peak RSS +{result['rss_growth_kib'] / 1024:.1f} MiB", flush=True)
    print(f"all readers: {min(seconds) * 1000:.0f}\u2013{max(seconds) * 1000:.0f} ms "
          f"(median {statistics.median(seconds) * 1000:.0f}), peak RSS +{min(growth) / 1024:.1f}\u2013"
          f"{max(growth) / 1024:.1f} MiB (median {statistics.median(growth) / 1024:.1f})")


if __name__ == "__main__":
    main()
