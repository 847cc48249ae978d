"""The session-wide harness context: options read once, backends selected, mark verdicts remembered.

One :class:`HarnessContext` per pytest session, kept in the config's stash; the plugin's hooks and
fixtures ask it for backends, skip verdicts and the rank pools. Torch is imported only when a
backend is first needed.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import time
import uuid
from typing import Any

import pytest

from . import markers as harness_markers
from .marker_lines import marker_backend_names, project_markers

STASH_CONTEXT = pytest.StashKey["HarnessContext"]()


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

    @property
    def selected(self) -> list[str]:
        """The session's backends, resolved on first use (importing torch and probing them); an unknown or
        unavailable requested backend raises ``pytest.UsageError``, at every use. Waits for a resolution
        :meth:`select_in_background` started."""
        thread, self._selecting = self._selecting, None
        if thread is not None:
            thread.join()
        if self._selection is None:
            self._selection = self._resolve_selection()
        return self._selection

    def select_in_background(self) -> None:
        """Resolve :attr:`selected` on a thread of its own: xdist's controller, which only checks the
        request, starts its workers meanwhile instead of after a second of torch's import; the first use
        of :attr:`selected` waits for the thread and raises what the resolution raised."""
        import threading

        if self._selection is not None or self._selecting is not None:
            return

        def resolve() -> None:
            try:
                self._selection = self._resolve_selection()
            except BaseException:  # raised again by the first use of ``selected``, which resolves anew
                pass

        self._selecting = threading.Thread(target=resolve, name="accel-harness-select", daemon=True)
        self._selecting.start()

    def selection_pending(self) -> bool:
        """Whether a resolution :meth:`select_in_background` started has not been waited for yet."""
        return self._selecting is not None

    #: xdist's controller: start :meth:`select_in_background` once the workers have been started
    select_once_workers_start = False
    _selection: list[str] | None = None
    _selecting: Any = None  # the thread select_in_background started, until ``selected`` joins it

    def _resolve_selection(self) -> list[str]:
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


def context(config: pytest.Config) -> HarnessContext:
    """The session's harness context (set at configure)."""
    return config.stash[STASH_CONTEXT]
