"""Skip reason codes: why a test did not run, each with a one-line description.

Every skip the harness or ``accel.test_utils`` writes carries one of these codes as ``"[code] message"``;
the records keep the code and the reports group skips by it.
"""

from __future__ import annotations

__all__ = ["SKIP_CODES", "SKIP_REASONS", "UNSPECIFIED", "describe_reason"]

#: code -> what the skipped test waits for (one line, used by the reports' skip tables)
SKIP_REASONS: dict[str, str] = {
    "backend-unavailable": "the backend's device and torch support on this machine",
    "backend-not-selected": "its backend selected (--backend)",
    "needs-devices": "more devices than the machine has",
    "needs-package": "a library that is not installed",
    "unsupported-dtype": "a dtype the backend does not support",
    "torch-version": "another torch version",
    "known-limitation": "a fix for a documented limitation",
    "not-on-backend": "another backend (excluded here on purpose)",
    "needs-multiprocess": "several processes (a collective backend)",
    "opt-in": "to be asked for (slow or opt-in tests)",
}

#: every code a skip may carry
SKIP_CODES: tuple[str, ...] = tuple(SKIP_REASONS)

#: the code of a skip whose text carries no known code (a plain ``pytest.skip("...")``)
UNSPECIFIED = "unspecified"


def describe_reason(code: str) -> str:
    """The one-line description of ``code`` (also for :data:`UNSPECIFIED`); KeyError naming the known codes."""
    if code == UNSPECIFIED:
        return "(no reason code given: plain pytest.skip)"
    try:
        return SKIP_REASONS[code]
    except KeyError:
        raise KeyError(f"unknown skip reason code {code!r}; known: {', '.join(SKIP_CODES)}") from None
