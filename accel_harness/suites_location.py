"""Where the conformance suites are: one answer for ``accel qualify``, ``accel bench`` and the tests.

The suites live in the repository's ``suites/`` folder, and the wheel carries a copy as
``accel_harness/suites`` (``setup.py`` maps it there), so a plain ``pip install accel[harness]``
can qualify a machine without a checkout. Importing this module imports nothing heavy.
"""

from __future__ import annotations

import os
from pathlib import Path

#: environment variable that points at a suites folder (a vendor's fork, a patched copy)
SUITES_ENV = "ACCEL_SUITES_DIR"

_PACKAGE_DIR = Path(__file__).resolve().parent


class SuitesNotFound(LookupError):
    """No suites folder was found; the message lists every place that was looked at."""


def candidate_roots() -> list[Path]:
    """The places looked at, in order: ``$ACCEL_SUITES_DIR``, the wheel's copy, the checkout's ``suites/``."""
    configured = os.environ.get(SUITES_ENV)
    roots = [Path(configured).expanduser().resolve()] if configured else []
    roots.append(_PACKAGE_DIR / "suites")
    roots.append(_PACKAGE_DIR.parent / "suites")
    return roots


def suites_root() -> Path:
    """The conformance suites folder (it holds ``test_*.py`` and ``benchmarks/``)."""
    roots = candidate_roots()
    for root in roots:
        if root.is_dir() and any(root.glob("test_*.py")):
            return root
    raise SuitesNotFound(
        "cannot find the conformance suites (looked in: " + ", ".join(str(p) for p in roots)
        + f"); reinstall accel (the wheel ships them as accel_harness/suites), run from an accel checkout, "
        f"or set {SUITES_ENV}"
    )


def benchmarks_root() -> Path:
    """The benchmark suites: ``benchmarks/`` inside :func:`suites_root`."""
    path = suites_root() / "benchmarks"
    if not (path / "conftest.py").is_file():
        raise SuitesNotFound(f"the benchmark suites are missing from {path.parent} (no benchmarks/conftest.py)")
    return path
