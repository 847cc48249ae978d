"""The harness's command-line options: prefixed ``--accel-*`` names with short forms that give way.

The plugin adds them in ``pytest_addoption`` and, while a project's initial conftests load, takes
the short forms out so the project may define options of those names itself.
"""

from __future__ import annotations

from typing import Any

import pytest


#: (prefixed option, short form, argparse settings). The prefixed ``--accel-*`` names are always
#: there; the short forms (``--backend``, ``--results-dir``, ...) are kept for the conformance suites,
#: CI and ``accel qualify`` unless the project under test defines an option of that name itself, in
#: which case the project's option wins and the harness answers to its prefixed name only.
OPTIONS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("--accel-backend", "--backend", dict(
        action="append", dest="accel_backends", metavar="NAME",
        help="backend(s) to run on (repeatable or comma-separated; 'auto' = every available one; "
             "default: the detected backend)")),
    ("--accel-world-sizes", "--world-sizes", dict(
        dest="accel_world_sizes", metavar="N,N", help="only run multi-process tests at these world sizes")),
    ("--accel-results-dir", "--results-dir", dict(
        dest="accel_results_dir", metavar="DIR", help="write a JSON Lines result file for this run into DIR")),
    ("--accel-known-issues", "--known-issues", dict(
        dest="accel_known_issues", metavar="YAML", help="known-issues file: matching failures are recorded with the issue id")),
    ("--accel-known-issues-xfail", "--known-issues-xfail", dict(
        dest="accel_known_issues_xfail", action="store_true",
        help="report failures matching a known issue (with xfail: true) as xfailed")),
    ("--accel-dist-timeout", "--dist-timeout", dict(
        dest="accel_dist_timeout", type=float, default=120.0, metavar="SECONDS",
        help="a multi-process test that runs longer is ended with every rank's stack (default 120)")),
    ("--accel-profile", "--profile", dict(
        dest="accel_profile", metavar="FILE",
        help="device profile (YAML, TOML or a transformers-style spec.py): its backend is selected, its claims "
             "are checked against skips, its tolerances and known issues apply")),
    ("--accel-flake-runs", "--flake-runs", dict(
        dest="accel_flake_runs", type=int, default=0, metavar="N",
        help="re-run each failing test N more times and record its flake rate (the outcome stays failed)")),
    ("--accel-allow-missing-backends", "--allow-missing-backends", dict(
        dest="accel_allow_missing_backends", action="store_true",
        help="record tests of requested but unavailable backends as skipped instead of stopping")),
)
#: the option group's name in ``pytest --help``
OPTION_GROUP = "accel"


def short_form_actions(parser: pytest.Parser) -> list[tuple[str, Any]]:
    """(short form, the argparse action it names) for each short form registered by this plugin."""
    shorts = {short: prefixed for prefixed, short, _ in OPTIONS}
    table = parser.optparser._option_string_actions
    found = []
    for short, prefixed in shorts.items():
        action = table.get(prefixed)
        if action is not None and short in action.option_strings:
            found.append((short, action))
    return found
