"""Skip reasons: the reason codes a harness skip carries and the ``"[code] message"`` skip text.

The plugin writes the text with :func:`format_skip`; the result recorder and the reports read the
code back with :func:`parse_skip`. Torch-free and marker-free, so readers of results need nothing else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from accel.facts import reasons

from accel.facts.reasons import (  # noqa: E402 - the codes under their names here
    BACKEND_NOT_SELECTED, BACKEND_UNAVAILABLE, KNOWN_LIMITATION, NEEDS_DEVICES, NEEDS_MULTIPROCESS, NEEDS_PACKAGE,
    NOT_ON_BACKEND, OPT_IN, TORCH_VERSION, UNSUPPORTED_DTYPE,
)

#: every reason code a harness skip may carry (the table in accel.facts.reasons)
SKIP_CODES: tuple[str, ...] = reasons.SKIP_CODES
#: the code of a skip whose text carries no (known) code, e.g. a plain ``pytest.skip("...")``
UNSPECIFIED = reasons.UNSPECIFIED


@dataclass(frozen=True)
class SkipReason:
    """Why a test instance skips: a reason code from :data:`SKIP_CODES` (or ``"unspecified"``)."""

    code: str
    message: str

    def __post_init__(self) -> None:
        if self.code not in SKIP_CODES and self.code != UNSPECIFIED:
            raise ValueError(f"unknown skip reason code {self.code!r}; known codes: {', '.join(SKIP_CODES)}")

    def __str__(self) -> str:
        return format_skip(self)


def format_skip(reason: SkipReason) -> str:
    """The text given to ``pytest.skip``: ``"[code] message"``."""
    return f"[{reason.code}] {reason.message}".rstrip()


_SKIP_TEXT = re.compile(r"\[(?P<code>[a-z][a-z0-9-]*)\][ \t]*(?P<message>.*)\Z", re.DOTALL)


def parse_skip(text: Any) -> SkipReason:
    """The :class:`SkipReason` inside a skip text, such as pytest's ``"Skipped: [code] message"``.

    Also accepts pytest's skip ``longrepr`` tuple ``(path, lineno, text)``. Text without a known
    ``[code]`` prefix gives code ``"unspecified"`` and the text as message.
    """
    if isinstance(text, (tuple, list)) and len(text) == 3:
        text = text[2]
    text = "" if text is None else str(text)
    body = text.strip()
    if body.startswith("Skipped:"):
        body = body[len("Skipped:"):].strip()
    match = _SKIP_TEXT.match(body)
    if match and match.group("code") in SKIP_CODES:
        return SkipReason(match.group("code"), match.group("message").strip())
    return SkipReason(UNSPECIFIED, body)
