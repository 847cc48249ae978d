"""Upstream test suites: run a project's own tests (Accelerate's, say) with the harness's records.

For ``accel qualify --upstream``: get the suite (``source``), install its test dependencies with the
vendor's torch pinned (``install``), run it per backend under pytest (``run``), and complete its records
with backends, skip reasons (``skips``) and the run's status (``results``).
"""

from __future__ import annotations

from .common import UpstreamError
from .install import _IMPORT_CHECK, PINNED_DISTRIBUTIONS, InstallResult, install_requirements, pinned_constraints  # noqa: F401
from .results import STATUSES, SuiteRun, complete_records, junit_collection_errors, summary_line, write_summary
from .run import (
    CALLER_PREFIXES,
    CALLER_VARIABLES,
    OFFLINE_ENV,
    backend_env,
    caller_free_environment,
    harness_option,
    run_suite,
)
from .skips import SKIP_TABLE, SkipRule, classify_skip, load_skip_table
from .source import (
    REWRITE_SUFFIXES,
    TEST_EXTRAS,
    Spec,
    Suite,
    fetch_sdist,
    locate_tests,
    parse_spec,
    prepare_suite,
    rewrite_imports,
    test_requirements,
    unpack_sdist,
)

__all__ = [
    "CALLER_PREFIXES",
    "CALLER_VARIABLES",
    "OFFLINE_ENV",
    "PINNED_DISTRIBUTIONS",
    "REWRITE_SUFFIXES",
    "SKIP_TABLE",
    "STATUSES",
    "TEST_EXTRAS",
    "InstallResult",
    "SkipRule",
    "Spec",
    "Suite",
    "SuiteRun",
    "UpstreamError",
    "backend_env",
    "caller_free_environment",
    "classify_skip",
    "complete_records",
    "fetch_sdist",
    "harness_option",
    "install_requirements",
    "junit_collection_errors",
    "load_skip_table",
    "locate_tests",
    "parse_spec",
    "pinned_constraints",
    "prepare_suite",
    "rewrite_imports",
    "run_suite",
    "summary_line",
    "test_requirements",
    "unpack_sdist",
    "write_summary",
]
