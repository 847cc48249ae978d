"""The skip table: a skip message without a harness reason code gets one from ``upstream_skips.yaml``."""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .common import UpstreamError

#: the skip-message table (one YAML file beside this package)
SKIP_TABLE = Path(__file__).resolve().parent.parent / "upstream_skips.yaml"


@dataclass(frozen=True)
class SkipRule:
    """One row of the skip table: a regular expression and the reason code it gives."""

    match: str
    code: str

    @functools.cached_property
    def pattern(self) -> re.Pattern[str]:
        return re.compile(self.match, re.IGNORECASE)


@functools.lru_cache(maxsize=8)
def _load_table(path: str) -> tuple[SkipRule, ...]:
    from accel.facts import yaml_safe
    from accel.facts.yaml_safe import preview

    from ..markers import SKIP_CODES

    try:
        data = yaml_safe.read(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise UpstreamError(f"skip table {path}: {exc}") from None
    except yaml_safe.YamlError as exc:
        where = f"line {exc.line}: " if exc.line else ""
        raise UpstreamError(f"skip table {path}: {where}{exc.problem}") from None
    rows = data.get("rules") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not rows:
        raise UpstreamError(f"skip table {path}: expected a mapping with a non-empty 'rules' list")
    rules = []
    for number, row in enumerate(rows, start=1):
        if not isinstance(row, dict) or set(row) != {"match", "code"}:
            raise UpstreamError(f"skip table {path}: rule {number} must have exactly the keys 'match' and 'code', got {preview(row)}")
        if row["code"] not in SKIP_CODES:
            raise UpstreamError(f"skip table {path}: rule {number} has unknown reason code {preview(row['code'])}; "
                                f"known codes: {', '.join(SKIP_CODES)}")
        try:
            re.compile(str(row["match"]), re.IGNORECASE)
        except re.error as exc:
            raise UpstreamError(f"skip table {path}: rule {number} has a bad regular expression: {exc}") from None
        rules.append(SkipRule(str(row["match"]), str(row["code"])))
    return tuple(rules)


def load_skip_table(path: str | os.PathLike[str] | None = None) -> tuple[SkipRule, ...]:
    """The rules of the skip table (default: :data:`SKIP_TABLE`), validated."""
    return _load_table(str(Path(path or SKIP_TABLE).resolve()))


def classify_skip(message: str | None, rules: Sequence[SkipRule] | None = None) -> str:
    """The reason code for an upstream skip message: the first matching rule's, else ``"unspecified"``."""
    from ..markers import UNSPECIFIED

    text = (message or "").strip()
    if text.startswith("Skipped:"):
        text = text[len("Skipped:"):].strip()
    for rule in rules if rules is not None else load_skip_table():
        if rule.pattern.search(text):
            return rule.code
    return UNSPECIFIED
