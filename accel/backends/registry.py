"""The one place that decides which backend is used: probe order, override, plug-ins.

Every caller (state, seeding, `accel env`, the harness) asks this registry, so the probe order is
defined once. ``ACCEL_DEVICE=<name>`` overrides detection; an unknown or unavailable name is an
error that says why. Out-of-tree backends register through the entry-point group
``accel.backends``: each entry point names a :class:`Backend` subclass (or a zero-argument callable
returning an instance).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from importlib import metadata
from typing import Iterable

from .base import Backend, BackendError, BackendUnavailableError
from .builtin import BackendFactory, builtin_factories as _builtin_factories

ENTRY_POINT_GROUP = "accel.backends"
OVERRIDE_ENV = "ACCEL_DEVICE"
#: a device profile file (see ``accel.backends.profile``) whose backend joins the registry
PROFILE_ENV = "ACCEL_PROFILE"


class UnknownBackendError(BackendError, KeyError):
    """A backend name that no built-in or plug-in backend has."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


@dataclass(frozen=True)
class PluginError:
    """An entry point that could not be loaded; shown by `accel env` instead of crashing."""

    entry_point: str
    error: str


class BackendRegistry:
    """Known backends, in probe order (by ``priority``, then registration order)."""

    def __init__(self, factories: Iterable[BackendFactory] = (), load_plugins: bool = True):
        self._backends: dict[str, Backend] = {}
        self.plugin_errors: list[PluginError] = []
        for factory in factories:
            self.register(factory)
        if load_plugins:
            self._load_entry_points()

    def register(self, factory: BackendFactory | Backend, replace: bool = False) -> Backend:
        backend = factory if isinstance(factory, Backend) else factory()
        if not isinstance(backend, Backend):
            raise TypeError(f"{factory!r} did not produce an accel Backend (got {type(backend).__name__})")
        if not backend.name or not backend.device_type:
            raise ValueError(f"backend {type(backend).__name__} must set both `name` and `device_type`")
        if backend.name != backend.name.strip().lower():
            raise ValueError(f"backend names are lower-case without spaces (they are pytest markers): got {backend.name!r}")
        if backend.name in self._backends and not replace:
            raise ValueError(f"a backend named {backend.name!r} is already registered ({self._backends[backend.name]!r})")
        self._backends[backend.name] = backend
        return backend

    def _load_entry_points(self) -> None:
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            label = f"{ep.name} = {ep.value}"
            try:
                factory = ep.load()
                existing = self._backends.get(getattr(factory, "name", None) or "")
                if isinstance(factory, type) and type(existing) is factory:
                    continue  # the plug-in registered itself while being imported
                self.register(factory)
            except Exception as exc:
                self.plugin_errors.append(PluginError(label, f"{type(exc).__name__}: {exc}"))

    # ------------------------------------------------------------------ queries
    def names(self) -> list[str]:
        return [b.name for b in self.probe_order()]

    def probe_order(self) -> list[Backend]:
        order = list(self._backends.values())
        return sorted(order, key=lambda b: (b.priority, order.index(b)))

    def get(self, name: str) -> Backend:
        try:
            return self._backends[name.strip().lower()]
        except KeyError:
            raise UnknownBackendError(
                f"unknown backend {name!r}; known backends: {', '.join(self.names())}"
            ) from None

    def available(self) -> list[Backend]:
        return [b for b in self.probe_order() if b.is_available()]

    def select(self, name: str | None = None) -> Backend:
        """The backend to use: ``name`` if given, else ``$ACCEL_DEVICE``, else the first available."""
        source = "requested"
        if name is None:
            name = os.environ.get(OVERRIDE_ENV, "").strip() or None
            source = OVERRIDE_ENV
        if name is not None:
            backend = self.get(name)
            backend.request()
            if not backend.is_available():
                raise BackendUnavailableError(
                    f"backend {backend.name!r} ({source}) is not available: {backend.availability.reason}"
                )
            return backend
        for backend in self.probe_order():
            if backend.is_available():
                return backend
        raise BackendUnavailableError("no backend is available (not even cpu)")


_registry: BackendRegistry | None = None
_lock = threading.RLock()  # a plug-in may call register_backend() while being loaded


def get_registry() -> BackendRegistry:
    """The process-wide registry (built-ins plus installed plug-ins), built on first use."""
    global _registry
    with _lock:
        if _registry is None:
            # publish before loading plug-ins, so a plug-in that registers itself on import sees it
            _registry = BackendRegistry(_builtin_factories(), load_plugins=False)
            _registry._load_entry_points()
            profile = os.environ.get(PROFILE_ENV, "").strip()
            if profile:
                try:
                    _register_profile(_registry, profile)
                except Exception:
                    _registry = None  # a bad profile is an error every time, not once
                    raise
        return _registry


def _register_profile(registry: BackendRegistry, path: str) -> None:
    """Register the backend of the profile at ``path``; it replaces a backend of the same name."""
    from .profile import ProfileBackend, load_profile

    registry.register(ProfileBackend(load_profile(path)), replace=True)


def reset_registry() -> None:
    """Forget the registry and every cached probe (tests, or after changing the environment)."""
    global _registry
    with _lock:
        _registry = None


def get_backend(name: str | None = None) -> Backend:
    """The selected backend (see :meth:`BackendRegistry.select`)."""
    return get_registry().select(name)


def available_backends() -> list[Backend]:
    return get_registry().available()


def register_backend(factory: BackendFactory | Backend, replace: bool = False) -> Backend:
    """Register a backend in-process (an alternative to the entry point)."""
    return get_registry().register(factory, replace=replace)
