"""The accel pytest plugin: backends as parameters, honest skips, multi-process tests, result records.

Loaded through the ``pytest11`` entry point, so any test suite in an environment with accel
installed can use it. A test takes part when it asks for the ``backend`` or ``device`` fixture or
carries ``@pytest.mark.world_size(...)``: it is then parametrized over every registered backend
(each instance marked with the backend's name, so ``-m xpu`` selects the xpu instances) and, for
``world_size``, over the requested world sizes, running its body inside that many ranks.

This module holds the hooks and fixtures; the session context is :mod:`accel_harness.harness_context`,
the options :mod:`accel_harness.harness_options`, the marker lines :mod:`accel_harness.marker_lines`
and running a body in ranks :mod:`accel_harness.rank_runs`.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import pytest

from accel.facts.backends import HOST_BACKEND

from . import markers as harness_markers
# every name once defined here stays importable from here
from .harness_context import (  # noqa: F401
    STASH_CONTEXT as _STASH_CONTEXT, HarnessContext, _backends_named_in_markexpr, _frozen, _marks_key, _parse_world_sizes,
    context as _context,
)
from .harness_options import OPTION_GROUP as _GROUP, OPTIONS, short_form_actions as _short_form_actions
from .marker_lines import (  # noqa: F401
    BUILTIN_BACKEND_NAMES, PLUGIN_GROUP, STASH_MARKER_LINES as _STASH_MARKER_LINES, add_marker_line as _add_marker_line,
    backend_marker_line as _backend_marker_line, marker_backend_names, project_markers,
)
from .session_freeze import freeze_collected_session, freeze_new_imports
from .params import BACKEND_PARAM, WORLD_SIZE_PARAM  # noqa: F401  (also imported from here by tests and suites)
from .params import item_backend as _item_backend
from .rank_runs import (  # noqa: F401
    LeftoverProcessWarning, _picklable, prestart_fork_server as _prestart_fork_server, run_in_ranks as _run_in_ranks,
    visible_devices_env as _visible_devices_env,
)

_STASH_PROJECT_MARKERS = pytest.StashKey[set]()


# ---------------------------------------------------------------------- pytest hooks
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
    controller = _is_xdist_controller(config)
    if ctx.explicitly_requested():
        # resolving it stops the session on unknown or unavailable requested backends: now, or in xdist's
        # controller once its workers are starting (``pytest_collection`` below)
        _select_now_or_after_the_workers_start(ctx, controller)
    elif controller and any(n != HOST_BACKEND for n in ctx.markexpr_backends()):
        # the xdist controller collects nothing, so ``-m xpu`` is checked here (workers cannot stop a
        # session cleanly); cpu is always available and needs no check (nor torch)
        ctx.markexpr_counts = True
        _select_now_or_after_the_workers_start(ctx, controller)
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


def _select_now_or_after_the_workers_start(ctx: HarnessContext, controller: bool) -> None:
    """Resolve the session's backends now; xdist's controller, which runs no test, resolves them on a thread
    once it has started its workers (``pytest_sessionstart`` below), so neither torch's import nor the
    thread's hold on the interpreter delays them, and waits for the verdict at collection."""
    if controller and ctx.profile is None:  # a profile's session probes the backend at configure
        ctx.select_once_workers_start = True
    else:
        _ = ctx.selected


@pytest.hookimpl(wrapper=True)
def pytest_sessionstart(session: pytest.Session) -> Any:
    """After every other start-up (xdist's controller starts its workers there), the controller's deferred
    backend check begins on its thread."""
    result = yield
    ctx = session.config.stash.get(_STASH_CONTEXT, None)
    if ctx is not None and ctx.select_once_workers_start:
        ctx.select_in_background()
    return result


@pytest.hookimpl(tryfirst=True)
def pytest_collection(session: pytest.Session) -> None:
    """xdist's controller, whose workers are starting by now, stops the session here when its backend
    check failed (``pytest.UsageError``); its workers are then shut down with the session. Otherwise what
    the check imported (torch) is frozen out of the controller's garbage collections, the interpreter's
    last ones at exit among them (with torch, the larger part of half a second)."""
    ctx = session.config.stash.get(_STASH_CONTEXT, None)
    if ctx is not None and ctx.selection_pending():
        _ = ctx.selected
        freeze_collected_session()


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


def uses_harness(item: pytest.Item) -> bool:
    """Whether this collected test takes part in the harness: a backend instance or a requirement mark on it."""
    if _item_backend(item)[0] is not None:
        return True
    return bool(_requirement_marks(item))


#: harness marks that are not requirements (``slow`` is everyone's; ``world_size`` parametrizes instead;
#: ``rank_timeout`` sets a time limit)
_NOT_REQUIREMENTS = frozenset({"slow", "world_size", "rank_timeout"})


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


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Once a harness session has collected its tests, what it holds is frozen out of garbage collection
    (:mod:`accel_harness.session_freeze`); rank pools forked from this process keep the freeze. When a
    collected test forks its ranks from a fork server, the server starts now, importing while the tests
    before it run."""
    ctx = session.config.stash.get(_STASH_CONTEXT, None)
    if ctx is None or not any(uses_harness(i) for i in session.items):
        return
    freeze_collected_session()
    if not session.config.option.collectonly:
        _prestart_fork_server(ctx, session.items)


def pytest_runtest_logfinish(nodeid: str, location: tuple) -> None:
    """After a test's teardown, a session that froze what it collected freezes what the test imported
    (:func:`accel_harness.session_freeze.freeze_new_imports`); any other session is left alone."""
    freeze_new_imports()


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
        reason = harness_markers.SkipReason(harness_markers.BACKEND_UNAVAILABLE, f"{name}: {backend.availability.reason}")
    elif name not in ctx.selected:
        reason = harness_markers.SkipReason(
            harness_markers.BACKEND_NOT_SELECTED, f"{name} is available but not selected (selected: {', '.join(ctx.selected)}; use --backend)")
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
