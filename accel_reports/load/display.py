"""Text from result files made safe to print and to write into UTF-8 reports, and short quotes of values.

File names that are not valid UTF-8 (bytes ``os.listdir`` hands back as surrogate escapes) and text
holding lone surrogates (``"\\ud800"`` in JSON) are shown with U+FFFD, so nothing downstream meets a
string that cannot be encoded.
"""

from __future__ import annotations

import os
import re
from typing import Any

__all__ = ["display_deep", "display_path", "display_text", "line_of", "short"]

_SURROGATES = re.compile("[\ud800-\udfff]")


def display_text(text: Any) -> Any:
    """``text`` with what UTF-8 cannot encode (lone surrogates) replaced by U+FFFD; other values as given.

    Surrogate escapes of undecodable bytes (``os.fsdecode``) become one U+FFFD per byte, a lone
    surrogate from a JSON escape (``"\\ud800"``) one U+FFFD.
    """
    if not isinstance(text, str) or text.isascii():
        return text
    return _SURROGATES.sub("\ufffd", text)


def display_path(path: str | os.PathLike[str] | bytes) -> str:
    """A file name that can be printed and written into a UTF-8 report (see :func:`display_text`)."""
    return display_text(os.fsdecode(path))


def display_deep(value: Any, depth: int = 0) -> Any:
    """``value`` with every string in it (keys included, nested up to 32 levels) made displayable."""
    if isinstance(value, str):
        return display_text(value)
    if depth > 32:
        return value
    if isinstance(value, dict):
        return {display_text(k): display_deep(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [display_deep(v, depth + 1) for v in value]
    return value


def short(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, for a message that quotes a bad value."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def line_of(text: str, needle: str) -> int:
    """The 1-based line of ``needle``'s first occurrence in ``text`` (0: not there), for problem reports."""
    index = text.find(needle)
    return text.count("\n", 0, index) + 1 if index >= 0 else 0
