"""Text helpers shared by the report's views: escaping for Markdown, safe links, numbers, units and
percentages as a person writes them, and a few list helpers (part of :mod:`accel_reports.render.report`)."""

from __future__ import annotations

import math
import re
from typing import Any, Iterable

import pandas as pd

from accel.facts import reasons

#: runs drawn in a trend line (the newest ones), so a long history keeps the page small; read at
#: call time (``render_text.TREND_POINTS``) so a caller may change it
TREND_POINTS = 30

GLYPHS = {"passed": ("", ""), "failed": ("f", "F"), "error": ("e", "E"), "xfailed": ("x", "x"),
          "xpassed": ("xp", "X"), None: ("n", "")}
#: skip reason code -> the letter shown in the grid
SKIP_LETTERS = {
    reasons.NEEDS_DEVICES: "d", reasons.NEEDS_PACKAGE: "p", reasons.NEEDS_MULTIPROCESS: "m", reasons.TORCH_VERSION: "v",
    reasons.UNSUPPORTED_DTYPE: "t", reasons.KNOWN_LIMITATION: "l", reasons.OPT_IN: "o", reasons.BACKEND_UNAVAILABLE: "b",
    reasons.BACKEND_NOT_SELECTED: "c", reasons.NOT_ON_BACKEND: "n", reasons.UNSPECIFIED: "s",
}


_MD_SPECIAL = re.compile(r"([\\|`*_\[\]$])")


def md_escape(value: Any) -> str:
    """``value`` as inert text for a GitHub Markdown table cell or list item."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    text = str(value)
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = _MD_SPECIAL.sub(r"\\\1", text)
    return re.sub(r"\s*[\r\n]+\s*", " ", text).strip()


def safe_url(value: Any) -> str | None:
    """``value`` when it is an http(s) URL without spaces or quotes, else None (never a link)."""
    if not isinstance(value, str):
        return None
    url = value.strip()
    if not re.match(r"\Ahttps?://[^\s\"'<>`]+\Z", url, re.IGNORECASE):
        return None
    return url


def _md_link(text: Any, url: Any) -> str:
    safe = safe_url(url)
    label = md_escape(text)
    if not safe:
        return label
    return f"[{label}](<{safe.replace('(', '%28').replace(')', '%29')}>)"


def _fmt_number(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    value = float(value)
    if value == 0:
        return "0"
    prefixes = [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1, ""), (1e-3, "m"), (1e-6, "µ"), (1e-9, "n")]
    for scale, prefix in prefixes:
        if abs(value) >= scale:
            return f"{value / scale:.{digits}g} {prefix}".rstrip()
    return f"{value:.{digits}g}"


_BASE_UNITS = ("s", "B/s", "B", "FLOP/s", "1/s", "samples/s", "steps/s", "tokens/s", "items/s", "it/s")


def _quantity(value: Any, unit: str) -> str:
    """``5.03 k samples/s``, ``1.2 GB/s`` (from B/s), ``12.5 ms`` (from s); a unit that already
    has a prefix (``TFLOP/s``, ``GB/s``) keeps the number as it is: ``0.00244 TFLOP/s``."""
    if unit not in _BASE_UNITS:
        if value is None or (isinstance(value, float) and not math.isfinite(value)):
            return "–"
        return f"{float(value):.3g} {unit}".strip()
    text = _fmt_number(value)
    if text == "–":
        return text
    if unit in ("s", "B/s", "B") and " " in text:  # an SI prefix joins these units
        number, prefix = text.split(" ")
        return f"{number} {prefix}{unit}"
    return f"{text} {unit}".strip()


def _pct(value: Any, signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{value:+.1%}" if signed else f"{value:.1%}"


def _clean(value: Any) -> Any:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [{k: _clean(v) for k, v in row.items()} for row in frame.to_dict("records")] if not frame.empty else []


def _version_sort_key(text: Any) -> tuple:
    from packaging.version import InvalidVersion, Version

    try:
        return (0, Version(str(text)), "")
    except InvalidVersion:
        return (1, Version("0"), str(text))


def _slug(text: Any) -> str:
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-")


def _short_time(value: Any) -> str:
    """``2025-06-01 00:24`` from an ISO-8601 time (the text itself when it is not one)."""
    text = str(value or "")
    match = re.match(r"(\d{4}-\d{2}-\d{2})[T ](\d{2}:\d{2})", text)
    return f"{match.group(1)} {match.group(2)}" if match else text


def _joined(values: Iterable[Any], most: int = 3) -> str:
    """Distinct non-empty ``values`` in first-seen order, ``a, b, c +2 more`` past ``most``."""
    seen = list(dict.fromkeys(str(v) for v in values if v not in (None, "") and not (isinstance(v, float) and math.isnan(v))))
    return ", ".join(seen[:most]) + (f" +{len(seen) - most} more" if len(seen) > most else "")


def _plural(count: int, word: str, many: str | None = None) -> str:
    return f"{count} {word if count == 1 else (many or word + 's')}"


def _present(rows: list[dict[str, Any]], key: str, empty: tuple = ("", "–", None)) -> bool:
    """Whether any row has a value for ``key`` (a column with none is left out of the table)."""
    return any(row.get(key) not in empty for row in rows)
