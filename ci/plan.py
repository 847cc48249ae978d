"""Turn the matrix file into the cells to run: the GitHub Actions job matrix, JSON or a table.

    python -m ci.plan [--matrix ci/matrix.yaml] [--only cpu,cuda] [--torch 2.13.0] [--python 3.11]
                      [--include-disabled] [--profile NAME] [--format github|json|table]

``--format github`` (the default) prints ``{"include": [...]}`` on one line, ready for
``strategy.matrix: ${{ fromJSON(needs.plan.outputs.matrix) }}``, one entry per cell with the keys
``id``, ``backend``, ``torch``, ``python``, ``runner`` (labels for ``runs-on``), ``setup_python``
and ``timeout_minutes``. When ``$GITHUB_OUTPUT`` is set (in a workflow step) it also writes the
step outputs ``matrix`` (that JSON), ``count`` (number of cells) and ``ids`` (space-separated).
``--format json`` prints every cell in full; ``--format table`` a readable list with the exclusions.
Empty filter values (``--only ""``) mean no filter, so a workflow can pass dispatch inputs as they are.

Exit status: 0, also for an empty plan (``count=0``); 2 for a broken matrix file or an unknown
backend/torch/python name in a filter (the message names the file, line and key).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Sequence

from accel.facts.environment import env_flag  # torch-free: usable before accel's dependencies are installed
from ci.matrix import DEFAULT_MATRIX, PROFILE_ENV, Cell, Matrix, MatrixError, load_matrix

#: the step output the workflow's cells job reads (ci.validate_workflow checks the workflow uses it)
OUTPUT_NAME = "matrix"
#: every step output ci.plan writes to $GITHUB_OUTPUT
PLAN_OUTPUTS = (OUTPUT_NAME, "count", "ids")
#: GitHub's limit of jobs per matrix
GITHUB_MAX_JOBS = 256


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ci.plan", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--matrix", default=str(DEFAULT_MATRIX), metavar="YAML", help="matrix file (default: ci/matrix.yaml)")
    parser.add_argument("--only", action="append", metavar="BACKENDS", help="only these backends (comma-separated, repeatable)")
    parser.add_argument("--torch", action="append", metavar="VERSIONS", help="only these torch versions (comma-separated, repeatable)")
    parser.add_argument("--python", action="append", metavar="VERSIONS", help="only these python versions (comma-separated)")
    parser.add_argument("--include-disabled", action="store_true", help="also plan disabled backends and torch versions (e.g. nightly)")
    parser.add_argument("--profile", metavar="NAME", help=f"install profile (shown in json/table; default ${PROFILE_ENV})")
    parser.add_argument("--format", choices=("github", "json", "table"), default="github", help="output format (default: github)")
    return parser


def github_matrix(cells: Sequence[Cell]) -> dict[str, list[dict]]:
    return {"include": [cell.github() for cell in cells]}


def table(matrix: Matrix, cells: Sequence[Cell]) -> str:
    rows = [("cell", "runner", "world sizes", "suites", "bench", "ops", "torch install")]
    for cell in cells:
        ws = ",".join(map(str, cell.world_sizes))
        if cell.removed_world_sizes:
            ws += f" (-{','.join(map(str, cell.removed_world_sizes))})"
        rows.append((cell.id + ("" if cell.enabled else " [disabled]"), ",".join(cell.runner), ws,
                     "all" if cell.suites is None else ",".join(cell.suites), cell.bench, cell.ops, cell.install.describe()))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append(f"{len(cells)} cell{'s' if len(cells) != 1 else ''} from {matrix.path}")
    for rule in matrix.exclusions:
        lines.append(f"excluded: {rule.describe()}")
    return "\n".join(lines)


def write_github_output(path: str, cells: Sequence[Cell]) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(f"{OUTPUT_NAME}={json.dumps(github_matrix(cells), separators=(',', ':'))}\n")
        fh.write(f"count={len(cells)}\n")
        fh.write(f"ids={' '.join(c.id for c in cells)}\n")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        include_disabled = args.include_disabled or env_flag("ACCEL_CI_INCLUDE_DISABLED")
    except ValueError as exc:  # a value that is no yes/no word
        print(f"ci.plan: error: {exc}", file=sys.stderr)
        return 2
    try:
        matrix = load_matrix(args.matrix)
        cells = matrix.cells(only=args.only, torch=args.torch, python=args.python, include_disabled=include_disabled,
                             profile=args.profile or os.environ.get(PROFILE_ENV) or None)
    except MatrixError as exc:
        print(f"ci.plan: error: {exc}", file=sys.stderr)
        return 2
    if len(cells) > GITHUB_MAX_JOBS:
        print(f"ci.plan: error: {len(cells)} cells; a GitHub Actions matrix holds at most {GITHUB_MAX_JOBS} jobs "
              "(filter with --only/--torch/--python)", file=sys.stderr)
        return 2
    if not cells:
        print("ci.plan: warning: no cell matches the filters (count=0)", file=sys.stderr)
    if args.format == "github":
        print(json.dumps(github_matrix(cells), separators=(",", ":")))
        if os.environ.get("GITHUB_OUTPUT"):
            write_github_output(os.environ["GITHUB_OUTPUT"], cells)
    elif args.format == "json":
        print(json.dumps([cell.to_dict() for cell in cells], indent=2))
    else:
        print(table(matrix, cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
