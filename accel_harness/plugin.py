"""The accel pytest plugin: backends as parameters, honest skips, multi-process tests, result records.

Loaded through the ``pytest11`` entry point, so any test suite in an environment with accel
installed can use it. A test takes part when it asks for the ``backend`` or ``device`` fixture or
carries ``@pytest.mark.world_size(...)``: it is then parametrized over every registered backend
(each instance marked with the backend's name, so ``-m xpu`` selects the xpu instances) and, for
``world_size``, over the requested world sizes, running its body inside that many ranks.
"""

from __future__ import annotations

import functools
import os
import pickle
import re
import sys
import time
import uuid
import warnings
from typing import Any

import pytest

from . import markers as harness_markers
from accel.names import BUILTIN_BACKENDS

from .params import BACKEND_PARAM, WORLD_SIZE_PARAM  # noqa: F401  (also imported from here by tests and suites)
from .params import item_backend as _item_backend

_STASH_CONTEXT = pytest.StashKey["HarnessContext"]()
_STASH_MARKER_LINES = pytest.StashKey[set]()
_STASH_PROJECT_MARKERS = pytest.StashKey[set]()


#: accel's built-in backends, from accel's torch-free name table (configuring pytest imports no torch)
BUILTIN_BACKEND_NAMES = BUILTIN_BACKENDS
PLUGIN_GROUP = "accel.backends"


def marker_backend_names() -> list[str]:
    """Backend names for marker registration, without importing torch: built-ins and plug-in entry points."""
    from importlib import metadata

    try:
        plugins = [ep.name.strip().lower() for ep in metadata.entry_points(group=PLUGIN_GROUP)]
    except Exception:  # a broken distribution must not break pytest's start-up
        plugins = []
    return list(dict.fromkeys([*BUILTIN_BACKEND_NAMES, *plugins]))


class HarnessContext:
    """Session-wide harness settings.

    The backend registry (which imports torch, about a second) is built on first use: when a
    test asks for a backend, when ``--backend`` or a backend named in ``-m`` is given, or when a
    results file is written. A pytest session in the same environment that uses none of it does
    not pay for torch.
    """

    def __init__(self, config: pytest.Config):
        self.config = config
        self.world_sizes = _parse_world_sizes(config.getoption("accel_world_sizes"))
        self.timeout = float(config.getoption("accel_dist_timeout"))
        self.pools = None  # PoolManager, created on first multi-process test
        self.run_id = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:8]
        self.known_issues = None
        self.writer = None
        self._marked = set(marker_backend_names())  # registered at configure
        #: what the results file's header ``extra`` carries (the profile's summary, ...)
        self.header_extra: dict[str, Any] = {}
        self.saved_profile_env: tuple[str, str | None] | None = None
        self.profile = None  # accel.backends.profile.DeviceProfile, from --profile
        self.profile_session = None  # accel_harness.profile.ProfileSession
        self.selection = None  # accel_harness.fingerprint.TestSelection, when results are written
        self._verdicts: dict[tuple, Any] = {}  # see evaluate()
        path = config.getoption("accel_profile")
        if path:
            from accel.backends.profile import ProfileError, load_profile
            from accel.backends.registry import PROFILE_ENV

            try:
                self.profile = load_profile(path)
            except ProfileError as exc:
                raise pytest.UsageError(f"--profile: {exc}") from None
            # ranks and launched processes build their registry from this variable (restored at unconfigure)
            self.saved_profile_env = (PROFILE_ENV, os.environ.get(PROFILE_ENV))
            os.environ[PROFILE_ENV] = str(self.profile.path.resolve())

    @functools.cached_property
    def registry(self) -> Any:
        from accel.backends import get_registry

        registry = get_registry()
        if self.profile is not None:  # a registry built before --profile was read lacks it
            from accel.backends.profile import ProfileBackend

            try:
                current = registry.get(self.profile.name)
            except KeyError:
                current = None
            if not isinstance(current, ProfileBackend):
                registry.register(ProfileBackend(self.profile), replace=True)
        return registry

    @functools.cached_property
    def names(self) -> list[str]:
        names = self.registry.names()
        # backends registered in code (a conftest's register_backend, a plug-in whose entry-point
        # name differs from its Backend.name) get their marker now, before any test is marked
        for name in names:
            if name not in self._marked:
                self.config.addinivalue_line("markers", f"{name}: test instances that run on the {name} backend")
                self._marked.add(name)
        return names

    @functools.cached_property
    def selected(self) -> list[str]:
        from accel.backends import BackendError

        try:
            return self._select_backends(self.config)
        except BackendError as exc:  # e.g. ACCEL_DEVICE names no backend: one clear error, not one per test
            override = os.environ.get("ACCEL_DEVICE", "").strip()
            where = f" (ACCEL_DEVICE={override})" if override else ""
            raise pytest.UsageError(f"accel harness: {exc}{where}") from None

    def explicitly_requested(self) -> bool:
        """``--backend`` or ``ACCEL_DEVICE`` asked for a backend: the selection is checked at start-up."""
        return bool(self.config.getoption("accel_backends") or os.environ.get("ACCEL_DEVICE", "").strip()
                    or self.profile is not None)

    #: set once collection shows harness tests: only then does ``-m <backend>`` select backends
    markexpr_counts = False

    def markexpr_backends(self) -> list[str]:
        """Backends the ``-m`` expression asks for, leaving out marker names the project registered itself."""
        markexpr = self.config.getoption("markexpr") or ""
        if not markexpr:
            return []
        mine = project_markers(self.config)
        # with accel.backends already imported (a conftest registered a backend), the registry is cheap
        names = self.names if "accel.backends.registry" in sys.modules else marker_backend_names()
        return _backends_named_in_markexpr(markexpr, [n for n in names if n not in mine])

    def _select_backends(self, config: pytest.Config) -> list[str]:
        requested: list[str] = []
        for value in config.getoption("accel_backends") or []:
            requested.extend(v.strip().lower() for v in value.split(",") if v.strip())
        if not requested and self.profile is not None:
            requested = [self.profile.name]  # --profile selects its backend unless --backend says otherwise
        explicit = list(requested)
        # ``-m xpu`` selects a backend when the session uses the harness (always when --backend is given)
        requested_by_mark = self.markexpr_backends() if (self.explicitly_requested() or self.markexpr_counts) else []
        if not requested:
            requested = ["auto"] if requested_by_mark else [self.registry.select().name]
        if "auto" in requested:
            requested = [b.name for b in self.registry.available()]
        allow_missing = config.getoption("accel_allow_missing_backends")
        missing = []
        for name in dict.fromkeys(explicit + requested_by_mark):
            if name == "auto":
                continue
            if name not in self.names:
                raise pytest.UsageError(f"unknown backend {name!r}; known backends: {', '.join(self.names)}")
            backend = self.registry.get(name)
            backend.request()
            if not backend.is_available():
                missing.append(f"{name}: {backend.availability.reason}")
        if missing and not allow_missing:  # a usage error: pytest prints it as its own "ERROR:" line
            raise pytest.UsageError(
                "requested backend(s) not available on this machine:\n  " + "\n  ".join(missing)
                + "\n(pass --allow-missing-backends to run anyway and record them as skipped)")
        return [n for n in dict.fromkeys(requested + requested_by_mark) if self.registry.get(n).is_available()]

    def judge_plain(self, marks: list[Any], where: str) -> Any:
        """The skip reason for a test with requirement marks that is not parametrized over backends.

        It is judged against the session's selected backend(s) (default: the detected one) at world
        size 1: it runs when one of them meets every requirement, and otherwise skips with the first
        selected backend's reason (its code), naming the others' reasons too when several are selected.
        """
        reasons = []
        for name in self.selected:
            reason = harness_markers.evaluate(marks, self.backend(name), world_size=1, where=where)
            if reason is None:
                return None
            reasons.append((name, reason))
        if not reasons:
            return harness_markers.SkipReason(harness_markers.BACKEND_UNAVAILABLE, "no selected backend is available")
        if len(reasons) == 1:
            return reasons[0][1]
        text = "; ".join(f"{name}: {reason.message}" for name, reason in reasons)
        return harness_markers.SkipReason(reasons[0][1].code, f"on every selected backend: {text}")

    def backend(self, name: str) -> Any:
        """The registered backend called ``name``."""
        return self.registry.get(name)

    def evaluate(self, marks: list[Any], backend: Any, world: int | None, where: str) -> Any:
        """:func:`accel_harness.markers.evaluate` for one test instance, remembered for the session.

        Instances with the same harness marks on the same backend and world size get the same
        answer (the checks read the session's environment, not the test), so it is worked out once:
        every pooled test would otherwise pay for parsing its marks and the torch version again.
        A usage error is never remembered: each test with the wrong mark raises it."""
        key = _marks_key(marks, backend.name, world)
        if key is None:
            return harness_markers.evaluate(marks, backend, world_size=world, where=where)
        try:
            return self._verdicts[key]
        except KeyError:
            reason = self._verdicts[key] = harness_markers.evaluate(marks, backend, world_size=world, where=where)
            return reason

    def run_end_extra(self) -> dict[str, Any]:
        """What the results file's ``run_end`` line carries besides counts: facts known only at the end."""
        extra: dict[str, Any] = {}
        if self.profile_session is not None:
            extra["profile_coverage"] = self.profile_session.coverage()
        if self.selection is not None:
            extra["fingerprint_tests"] = self.selection.summary()
        return extra

    def pool_manager(self):
        if self.pools is None:
            from .distributed import PoolManager

            self.pools = PoolManager(self.timeout, env={"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
        return self.pools


def _marks_key(marks: list[Any], backend_name: str, world: int | None) -> tuple | None:
    """What :func:`accel_harness.markers.evaluate`'s answer depends on: the harness marks (name and
    arguments), the backend and the world size; None when an argument cannot be told apart safely."""
    found = []
    for mark in marks:
        name = getattr(mark, "name", None)
        if not isinstance(name, str) or not harness_markers.is_harness_mark(name):
            continue
        args = _frozen(tuple(getattr(mark, "args", ())))
        kwargs = getattr(mark, "kwargs", None)
        options = _frozen(tuple(sorted(kwargs.items()))) if kwargs else ()
        if args is _UNKEYED or options is _UNKEYED:
            return None
        found.append((name, args, options))
    return backend_name, world, tuple(found)


_UNKEYED = object()
_SCALARS = frozenset({str, int, float, bool, type(None)})


def _frozen(value: Any) -> Any:
    """``value`` as a hashable key that equals another only for the same requirement (its type kept),
    or ``_UNKEYED`` for anything other than text, numbers, torch dtypes and lists/tuples of those."""
    kind = type(value)
    if kind in _SCALARS:
        return kind, value
    if kind is tuple and all(type(v) in _SCALARS for v in value):  # the common case: world_size(2), ("numpy",)
        return tuple, value, tuple(map(type, value))
    if isinstance(value, (list, tuple)):
        items = [_frozen(v) for v in value]
        return _UNKEYED if any(i is _UNKEYED for i in items) else (kind, tuple(items))
    if type(value).__module__ == "torch" and type(value).__name__ == "dtype":
        return "dtype", str(value)
    return _UNKEYED


def _parse_world_sizes(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        sizes = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise pytest.UsageError(f"--world-sizes takes comma-separated integers, got {text!r}") from None
    if not sizes or sizes[0] < 1:
        raise pytest.UsageError(f"--world-sizes must be positive integers, got {text!r}")
    return sizes


def _backends_named_in_markexpr(expr: str, names: list[str]) -> list[str]:
    """Backends a ``-m`` expression asks for (``-m xpu``, ``-m "xpu and not slow"``; not ``not xpu``)."""
    tokens = re.findall(r"\w+", expr)
    found = []
    for i, token in enumerate(tokens):
        if token in names and (i == 0 or tokens[i - 1] != "not"):
            found.append(token)
    return found


# ---------------------------------------------------------------------- pytest hooks
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
_GROUP = "accel"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup(_GROUP, "accel qualification harness (short forms give way to a project's own options)")
    for prefixed, short, settings in OPTIONS:
        group.addoption(prefixed, short, **settings)


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]):
    """Let the project's conftests define options named like our short forms.

    pytest has already read the command line once with our short forms (so ``--backend cpu`` did not
    leave ``cpu`` among the paths that decide which conftests load). They are taken out while the
    initial conftests add their options, then put back where no project option took the name.
    """
    actions = _short_form_actions(parser)
    table = parser.optparser._option_string_actions
    for short, action in actions:
        if table.get(short) is action:
            del table[short]
            action.option_strings.remove(short)
    try:
        return (yield)
    finally:
        for short, action in actions:
            if short not in table:
                table[short] = action
                action.option_strings.append(short)


def _short_form_actions(parser: pytest.Parser) -> list[tuple[str, Any]]:
    """(short form, the argparse action it names) for each short form registered by this plugin."""
    shorts = {short: prefixed for prefixed, short, _ in OPTIONS}
    table = parser.optparser._option_string_actions
    found = []
    for short, prefixed in shorts.items():
        action = table.get(prefixed)
        if action is not None and short in action.option_strings:
            found.append((short, action))
    return found


@pytest.hookimpl(trylast=True)  # after the project's conftests registered their own markers
def pytest_configure(config: pytest.Config) -> None:
    for name, description in harness_markers.MARKERS.items():
        _add_marker_line(config, f"{name}: {description}")
    for name in marker_backend_names():
        _add_marker_line(config, _backend_marker_line(name))
    if config.option.help or getattr(config.option, "markers", False):
        return
    ctx = HarnessContext(config)
    config.stash[_STASH_CONTEXT] = ctx
    if ctx.explicitly_requested():
        _ = ctx.selected  # resolving it stops the session now on unknown or unavailable requested backends
    elif _is_xdist_controller(config) and any(n != "cpu" for n in ctx.markexpr_backends()):
        # the xdist controller collects nothing, so ``-m xpu`` is checked here (workers cannot stop a
        # session cleanly); cpu is always available and needs no check (nor torch)
        ctx.markexpr_counts = True
        _ = ctx.selected
    from .reporting import ResultReporter

    reporter = ResultReporter(ctx)
    if ctx.profile is not None:
        _start_profile_session(ctx, reporter)
    if reporter.known is not None:
        _note_expired_issues(ctx, reporter.known)
    runs = config.getoption("accel_flake_runs") or 0
    if runs:
        from .flake_runs import FlakeRuns

        try:
            config.pluginmanager.register(FlakeRuns(runs), "accel-flake-runs")
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None
    if config.getoption("accel_results_dir"):
        from .fingerprint import TestSelection, environment_fingerprint

        ctx.header_extra["fingerprint"] = environment_fingerprint(ctx.profile)
        ctx.selection = TestSelection()
        config.pluginmanager.register(ctx.selection, "accel-test-selection")
    config.pluginmanager.register(reporter, "accel-result-reporter")


def _start_profile_session(ctx: HarnessContext, reporter: Any) -> None:
    """Merge the profile's known issues into the run's, warn about expired ones, check its claims."""
    from .known_issues import KnownIssuesError
    from .profile import ProfileSession, load_profile_known_issues

    try:
        reporter.known = load_profile_known_issues(ctx.profile, reporter.known)
    except KnownIssuesError as exc:
        raise pytest.UsageError(f"--profile: {exc}") from None
    ctx.profile_session = ProfileSession(ctx.profile, reporter.known)
    ctx.profile_session.probe(ctx.backend(ctx.profile.name))
    ctx.header_extra["profile"] = ctx.profile_session.header(reporter.known.expired())
    ctx.config.pluginmanager.register(ctx.profile_session, "accel-profile")


def _note_expired_issues(ctx: HarnessContext, known: Any) -> None:
    """Warn about each known issue past its ``expires`` date and list them in the run header."""
    expired = known.expired()
    for issue in expired:
        warnings.warn(ExpiredKnownIssueWarning(
            f"known issue {issue.id!r} expired on {issue.expires.isoformat()} ({issue.source}): "
            "it no longer covers its tests; their failures count as untracked"))
    if expired:
        ctx.header_extra["expired_known_issues"] = [
            {"id": i.id, "expires": i.expires.isoformat(), "issue": i.issue or i.url, "source": i.source} for i in expired]


class ExpiredKnownIssueWarning(pytest.PytestWarning):
    """A known issue's ``expires`` date has passed: it covers nothing any more."""


def _is_xdist_controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput") and getattr(config.option, "dist", "no") not in (None, "no")


def _backend_marker_line(name: str) -> str:
    return f"{name}: test instances that run on the {name} backend"


def _add_marker_line(config: pytest.Config, line: str) -> None:
    """Register a marker line, remembering it as ours (a project's own line of that name stays the project's)."""
    config.stash.setdefault(_STASH_MARKER_LINES, set()).add(line)
    config.addinivalue_line("markers", line)


def project_markers(config: pytest.Config) -> set[str]:
    """Marker names the project registered itself (ini ``markers`` or its conftest), not this plugin."""
    ours = config.stash.get(_STASH_MARKER_LINES, set())
    names = set()
    for line in config.getini("markers"):
        if line in ours:
            continue
        name = re.split(r"[:(]", line, maxsplit=1)[0].strip()
        if name:
            names.add(name)
    return names


def uses_harness(item: pytest.Item) -> bool:
    """Whether this collected test takes part in the harness: a backend instance or a requirement mark on it."""
    if _item_backend(item)[0] is not None:
        return True
    return bool(_requirement_marks(item))


#: harness marks that are not requirements (``slow`` is everyone's; ``world_size`` parametrizes instead)
_NOT_REQUIREMENTS = frozenset({"slow", "world_size"})


def _requirement_marks(item: pytest.Item) -> list[Any]:
    mine = item.config.stash.get(_STASH_PROJECT_MARKERS, None)
    if mine is None:
        mine = item.config.stash[_STASH_PROJECT_MARKERS] = project_markers(item.config)
    return [m for m in item.iter_markers()
            if harness_markers.is_harness_mark(m.name) and m.name not in _NOT_REQUIREMENTS and m.name not in mine]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """A backend named in ``-m`` is checked once the collected tests show the harness is used.

    ``-m cuda`` in a project that never uses the harness (or that registered its own ``cuda``
    marker) is that project's business: no torch import, no availability check.
    """
    ctx = config.stash.get(_STASH_CONTEXT, None)
    if ctx is None or ctx.explicitly_requested() or not (config.getoption("markexpr") or ""):
        return
    if not any(uses_harness(item) for item in items):
        return
    ctx.markexpr_counts = True
    if ctx.markexpr_backends():
        _ = ctx.selected


def pytest_unconfigure(config: pytest.Config) -> None:
    ctx = config.stash.get(_STASH_CONTEXT, None)
    if ctx is not None and ctx.pools is not None:
        ctx.pools.close()
    if ctx is not None and ctx.saved_profile_env is not None:
        name, value = ctx.saved_profile_env
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _context(config: pytest.Config) -> HarnessContext:
    return config.stash[_STASH_CONTEXT]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    ctx = metafunc.config.stash.get(_STASH_CONTEXT, None)
    if ctx is None:
        return
    ws_marker = metafunc.definition.get_closest_marker("world_size")
    # a test that parametrizes these names itself, or whose suite defines its own fixtures of these
    # names (``device`` is a common one), means its own values, not the harness's
    own = {name for mark in metafunc.definition.iter_markers("parametrize") for name in _argnames(mark)}
    ours = {name for name in ("backend", "device", "rank", "world_size")
            if name not in own and name in metafunc.fixturenames and _is_harness_fixture(metafunc, name)}
    wants_backend = bool(ours) or ws_marker is not None
    if not wants_backend:
        return
    if BACKEND_PARAM not in metafunc.fixturenames:
        metafunc.fixturenames.append(BACKEND_PARAM)
    metafunc.parametrize(
        BACKEND_PARAM,
        [pytest.param(name, marks=getattr(pytest.mark, name), id=name) for name in ctx.names],
        scope="function",
    )
    sizes = _marker_world_sizes(ws_marker, metafunc.definition.nodeid) if ws_marker is not None else [1]
    if ctx.world_sizes is not None and ws_marker is not None:
        sizes = [s for s in sizes if s in ctx.world_sizes]
    if WORLD_SIZE_PARAM not in metafunc.fixturenames:
        metafunc.fixturenames.append(WORLD_SIZE_PARAM)
    metafunc.parametrize(WORLD_SIZE_PARAM, sizes, ids=[f"ws{n}" for n in sizes], scope="function")


def _is_harness_fixture(metafunc: pytest.Metafunc, name: str) -> bool:
    """Whether ``name`` resolves to this plugin's fixture (the closest definition wins in pytest)."""
    defs = metafunc._arg2fixturedefs.get(name)
    return bool(defs) and getattr(defs[-1].func, "__module__", None) == __name__


def _argnames(mark: Any) -> list[str]:
    names = mark.args[0] if mark.args else mark.kwargs.get("argnames", ())
    if isinstance(names, str):
        return [n.strip() for n in names.split(",") if n.strip()]
    return list(names)


def _marker_world_sizes(marker: Any, nodeid: str) -> list[int]:
    values: list[Any] = list(marker.args) or [marker.kwargs.get("n", marker.kwargs.get("sizes"))]
    if len(values) == 1 and isinstance(values[0], (list, tuple)):
        values = list(values[0])
    if not values or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values):
        raise pytest.UsageError(f"{nodeid}: @pytest.mark.world_size takes positive integers, got {marker.args or marker.kwargs}")
    return sorted(set(values))


@pytest.fixture
def accel_backend_name(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def accel_world_size(request: pytest.FixtureRequest) -> int:
    return request.param


@pytest.fixture
def backend(accel_backend_name: str, request: pytest.FixtureRequest):
    """The accel Backend this test instance runs on."""
    return _context(request.config).backend(accel_backend_name)


@pytest.fixture
def device(backend):
    """The torch device of this test instance (inside ranks: the rank's own device)."""
    return backend.device(0)


@pytest.fixture
def tolerance(request: pytest.FixtureRequest):
    """``tolerance(dtype, kind, default)`` -> ``{"rtol": ..., "atol": ...}`` for ``torch.testing.assert_close``.

    On the instances of a ``--profile`` backend, the profile's ``tolerances[dtype][kind]`` when it
    sets one; everywhere else ``default``, so a suite keeps its own bound for the built-in backends.
    """
    ctx = request.config.stash.get(_STASH_CONTEXT, None)
    profile = ctx.profile if ctx is not None else None
    callspec = getattr(request.node, "callspec", None)
    name = callspec.params.get(BACKEND_PARAM) if callspec is not None else None

    def lookup(dtype: Any, kind: str, default: dict[str, float]) -> dict[str, float]:
        if profile is not None and name == profile.name:
            return profile.tolerance(dtype, kind, default)
        return dict(default)

    return lookup


@pytest.fixture
def world_size(accel_world_size: int) -> int:
    return accel_world_size


@pytest.fixture
def rank() -> int:
    """The rank inside a multi-process test (0 in a single-process test)."""
    return 0


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    ctx = item.config.stash.get(_STASH_CONTEXT, None)
    name, world = _item_backend(item)
    if ctx is None:
        return
    if name is None:
        marks = _requirement_marks(item)
        reason = ctx.judge_plain(marks, item.nodeid) if marks else None
        if reason is not None:  # reported at the test's own line, as pytest's skipif marks are
            raise pytest.skip.Exception(harness_markers.format_skip(reason), _use_item_location=True)
        return
    backend = ctx.backend(name)
    reason = None
    if not backend.is_available():
        reason = harness_markers.SkipReason("backend-unavailable", f"{name}: {backend.availability.reason}")
    elif name not in ctx.selected:
        reason = harness_markers.SkipReason(
            "backend-not-selected", f"{name} is available but not selected (selected: {', '.join(ctx.selected)}; use --backend)")
    else:
        reason = ctx.evaluate(list(item.iter_markers()), backend, world, item.nodeid)
        if reason is not None and ctx.profile_session is not None and name == ctx.profile.name:
            reason = ctx.profile_session.judge_setup_skip(item, world, reason)  # None: fails as claim-contradicted
    if reason is not None:  # reported at the test's own line, not inside the plugin
        raise pytest.skip.Exception(harness_markers.format_skip(reason), _use_item_location=True)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    ctx = pyfuncitem.config.stash.get(_STASH_CONTEXT, None)
    name, world = _item_backend(pyfuncitem)
    if ctx is None or name is None or pyfuncitem.get_closest_marker("world_size") is None:
        return None
    _run_in_ranks(ctx, pyfuncitem, name, world)
    return True


class LeftoverProcessWarning(pytest.PytestWarning):
    """A multi-process test left processes running in a rank; the harness killed them after the test."""


def _run_in_ranks(ctx: HarnessContext, item: pytest.Function, backend_name: str, world: int) -> None:
    from .distributed import RANK_LOCAL_ARGS, Task

    argnames = item._fixtureinfo.argnames
    kwargs = {arg: item.funcargs[arg] for arg in argnames}
    sendable = {k: (None if k in RANK_LOCAL_ARGS else v) for k, v in kwargs.items()}
    try:
        payload = pickle.dumps(sendable)
    except Exception as exc:
        bad = [k for k, v in sendable.items() if not _picklable(v)]
        pytest.fail(f"multi-process test arguments must be picklable to reach the ranks; not picklable: {bad} ({exc})",
                    pytrace=False)
    function = item.obj
    module = function.__module__
    task = Task(module, getattr(item.module, "__file__", None), function.__qualname__, payload)
    backend = ctx.backend(backend_name)
    env = _visible_devices_env(backend, world)
    pool = ctx.pool_manager().get(backend_name, world, backend.start_method, env=env)
    result = pool.run(task)
    for rank, leftovers in sorted(result.leftovers.items()):
        warnings.warn(LeftoverProcessWarning(
            f"rank {rank} of {world}: the test left {len(leftovers)} process(es) running; killed: " + "; ".join(leftovers)))
    if result.status == "passed":
        return
    if result.status == "skipped":
        pytest.skip(result.message)
    if result.status == "xfailed":
        pytest.xfail(result.message)
    if result.status == "failed":
        failing = next(o for o in result.outcomes if o.rank == result.rank)
        pytest.fail(f"rank {result.rank} of {world} failed: {result.message}\n\n{failing.traceback}", pytrace=False)
    if result.status == "crashed":
        stacks = "\n".join(f"--- rank {r} ---\n{text}" for r, text in sorted(result.stacks.items()))
        pytest.fail(f"{result.message} (world size {world}, backend {backend_name})" + (f"\n{stacks}" if stacks else ""),
                    pytrace=False)
    stacks = "\n".join(f"--- rank {r} ---\n{text}" for r, text in sorted(result.stacks.items()))
    pytest.fail(f"timeout: {result.message} (--dist-timeout={ctx.timeout:g})\n{stacks}", pytrace=False)


def _picklable(value: Any) -> bool:
    try:
        pickle.dumps(value)
        return True
    except Exception:
        return False


def _visible_devices_env(backend: Any, world: int) -> dict[str, str]:
    """Give each pytest-xdist worker its own slice of the devices (device backends only), when the slice
    holds a device for each of the test's ``world`` ranks; otherwise the worker sees every device (its
    ranks then share them with the other workers' rather than several ranks asking for one device)."""
    var = backend.visible_devices_env
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if not var or not worker or workers < 2 or var in os.environ:
        return {}
    count = backend.device_count()
    per_worker = count // workers
    if per_worker < max(world, 1):
        return {}
    index = int(worker.removeprefix("gw") or 0)
    first = index * per_worker
    return {var: ",".join(str(i) for i in range(first, first + per_worker))}
