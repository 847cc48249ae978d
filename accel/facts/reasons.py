"""Skip reason codes: why a test did not run, each with a one-line description.

Every skip the harness or ``accel.test_utils`` writes carries one of these codes as ``"[code] message"``;
the records keep the code and the reports group skips by it.
"""

from __future__ import annotations

__all__ = [
    "BACKEND_NOT_SELECTED", "BACKEND_UNAVAILABLE", "KNOWN_LIMITATION", "NEEDS_DEVICES", "NEEDS_MULTIPROCESS",
    "NEEDS_PACKAGE", "NOT_ON_BACKEND", "OPT_IN", "SKIP_CODES", "SKIP_REASONS", "TORCH_VERSION", "UNSPECIFIED",
    "UNSUPPORTED_DTYPE", "describe_reason",
]

BACKEND_UNAVAILABLE = "backend-unavailable"
BACKEND_NOT_SELECTED = "backend-not-selected"
NEEDS_DEVICES = "needs-devices"
NEEDS_PACKAGE = "needs-package"
UNSUPPORTED_DTYPE = "unsupported-dtype"
TORCH_VERSION = "torch-version"
KNOWN_LIMITATION = "known-limitation"
NOT_ON_BACKEND = "not-on-backend"
NEEDS_MULTIPROCESS = "needs-multiprocess"
OPT_IN = "opt-in"

#: code -> what the skipped test waits for (one line, used by the reports' skip tables)
SKIP_REASONS: dict[str, str] = {
    BACKEND_UNAVAILABLE: "the backend's device and torch support on this machine",
    BACKEND_NOT_SELECTED: "its backend selected (--backend)",
    NEEDS_DEVICES: "more devices than the machine has",
    NEEDS_PACKAGE: "a library that is not installed",
    UNSUPPORTED_DTYPE: "a dtype the backend does not support",
    TORCH_VERSION: "another torch version",
    KNOWN_LIMITATION: "a fix for a documented limitation",
    NOT_ON_BACKEND: "another backend (excluded here on purpose)",
    NEEDS_MULTIPROCESS: "several processes (a collective backend)",
    OPT_IN: "to be asked for (slow or opt-in tests)",
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
