"""Compare the kernel census of two benchmark runs: which operators, kernels and allocations per
training step changed.

The train-step benchmark stores a census in each entry's ``extra_info["census"]`` (what one step
dispatches, launches and allocates, per step: ``operators``, ``kernels``, ``allocations``, each a
mapping name -> count per step). :func:`load_census` reads the censuses of a pytest-benchmark JSON
file, keyed by the benchmark's full name; :func:`diff_census` lists what changed between the last
run and this one, so a nightly run can say "aten::copy_ went from 4 to 6 per step" where the timing
noise hides a change of that size.

    python -m accel_reports.census LAST.json THIS.json     # prints the changes; exit 1 if any
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["CENSUS_KEY", "CENSUS_SCHEMA", "CATEGORIES", "CensusChange", "census_of_run", "diff_census",
           "format_changes", "load_census"]

#: where a benchmark entry keeps its census
CENSUS_KEY = "census"
#: the census format this module reads
CENSUS_SCHEMA = 1
#: the counted things, in the order changes are listed
CATEGORIES = ("operators", "kernels", "allocations")


@dataclass(frozen=True)
class CensusChange:
    """One count that differs between two runs (``before``/``after`` are per step; None: absent)."""

    benchmark: str
    category: str
    name: str
    before: float | None
    after: float | None

    @property
    def delta(self) -> float:
        """``after - before``, an absent count read as 0."""
        return (self.after or 0.0) - (self.before or 0.0)

    def describe(self) -> str:
        """One line for a log or a report."""
        if self.before is None:
            return f"{self.benchmark}: {self.category} {self.name}: new, {self.after:g} per step"
        if self.after is None:
            return f"{self.benchmark}: {self.category} {self.name}: gone (was {self.before:g} per step)"
        return f"{self.benchmark}: {self.category} {self.name}: {self.before:g} -> {self.after:g} per step ({self.delta:+g})"


def _checked(census: Any, where: str) -> dict[str, dict[str, float]]:
    if not isinstance(census, Mapping):
        raise ValueError(f"{where}: the census must be a mapping, got {type(census).__name__}")
    schema = census.get("schema")
    if schema != CENSUS_SCHEMA:
        raise ValueError(f"{where}: census schema {schema!r} is not one this reader knows ({CENSUS_SCHEMA})")
    out: dict[str, dict[str, float]] = {}
    for category in CATEGORIES:
        counts = census.get(category, {})
        if not isinstance(counts, Mapping) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in counts.values()):
            raise ValueError(f"{where}: census {category!r} must map names to counts per step, got {counts!r}")
        out[category] = {str(name): float(count) for name, count in counts.items()}
    return out


def census_of_run(document: Mapping[str, Any], where: str = "benchmark JSON") -> dict[str, dict[str, dict[str, float]]]:
    """The censuses of one pytest-benchmark JSON document: benchmark full name -> category -> name -> count."""
    benchmarks = document.get("benchmarks") if isinstance(document, Mapping) else None
    if not isinstance(benchmarks, list):
        raise ValueError(f"{where}: not a pytest-benchmark JSON document (no 'benchmarks' list)")
    out = {}
    for entry in benchmarks:
        census = (entry.get("extra_info") or {}).get(CENSUS_KEY) if isinstance(entry, Mapping) else None
        if census is None:
            continue
        name = str(entry.get("fullname") or entry.get("name"))
        out[name] = _checked(census, f"{where}: {name}")
    return out


def load_census(path: str | os.PathLike[str]) -> dict[str, dict[str, dict[str, float]]]:
    """:func:`census_of_run` of a pytest-benchmark JSON file."""
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    return census_of_run(document, str(path))


def diff_census(before: Mapping[str, Mapping[str, Mapping[str, float]]],
                after: Mapping[str, Mapping[str, Mapping[str, float]]],
                tolerance: float = 1e-9) -> list[CensusChange]:
    """Every per-step count that changed between two runs' censuses (as :func:`census_of_run` returns them).

    Only benchmarks with a census in both runs are compared (a benchmark new in this run has nothing
    to compare with). Changes are listed by benchmark, then category (operators, kernels,
    allocations), then the size of the change, largest first.
    """
    changes: list[CensusChange] = []
    for bench in sorted(set(before) & set(after)):
        for category in CATEGORIES:
            old, new = before[bench].get(category, {}), after[bench].get(category, {})
            found = []
            for name in set(old) | set(new):
                a, b = old.get(name), new.get(name)
                if a is None or b is None or abs(a - b) > tolerance:
                    found.append(CensusChange(bench, category, name, a, b))
            changes.extend(sorted(found, key=lambda c: (-abs(c.delta), c.name)))
    return changes


def format_changes(changes: list[CensusChange]) -> str:
    """The changes one per line, or a line saying there were none."""
    if not changes:
        return "census: no operator, kernel or allocation count per step changed"
    return "\n".join(change.describe() for change in changes)


def main(argv: list[str] | None = None) -> int:
    """``python -m accel_reports.census LAST.json THIS.json``: print the changes; 1 if any, 2 on bad input."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m accel_reports.census LAST.json THIS.json", file=sys.stderr)
        return 2
    try:
        changes = diff_census(load_census(args[0]), load_census(args[1]))
    except (OSError, ValueError) as exc:
        print(f"census: {exc}", file=sys.stderr)
        return 2
    print(format_changes(changes))
    return 1 if changes else 0


if __name__ == "__main__":
    raise SystemExit(main())
