"""Harness markers: the table the plugin registers, Accelerate-style aliases, and skip reasons.

A test declares what it needs with markers (``@pytest.mark.require_devices(2)``,
``@pytest.mark.require_bf16``, ...). Unlike Accelerate's ``unittest.skipUnless`` decorators, which
are evaluated at import time against a guessed device, these are evaluated per *test instance*
(one backend, one world size) by :func:`evaluate`, so ``-m`` can select them and every skip carries
a machine-readable reason code. The plugin turns a :class:`SkipReason` into pytest's skip text with
:func:`format_skip`; the result recorder gets the code back with :func:`parse_skip`.

This module evaluates; the marker table and aliases live in :mod:`accel_harness.marker_table`, the
skip text in :mod:`accel_harness.skip_reasons` and the per-marker checks in
:mod:`accel_harness.marker_checks`. Every name stays importable from here.

Semantics worth knowing:

* ``require_devices(n)`` counts *physical* devices of the instance's backend
  (``backend.device_count()``). The CPU backend has exactly one device, so ``require_devices(2)``
  always skips on cpu, while ``world_size(n)`` tests do run on cpu: several processes share the
  one host device (see :func:`ranks_share_device`).
* On a backend whose ranks cannot share a device (every backend but cpu, unless the backend sets a
  boolean ``ranks_share_device`` attribute), a world size ``n > 1`` also needs ``n`` devices.
* ``require_fsdp2`` means: torch >= the FSDP2 floor of :mod:`accel.facts.versions` (``fully_shard``
  is public there) and a backend with a collective backend (``backend.comm_backend`` is not None).
* The Accelerate-style aliases (``require_cuda``, ``require_multi_gpu``, ...) are generated from
  :data:`accel.facts.requirements.REQUIREMENT_TABLE`, the table ``accel.test_utils`` evaluates too,
  so the two decorator sets cannot disagree.
* ``require_package`` never imports anything: a plain name is looked up with
  ``importlib.util.find_spec`` (dotted names without importing their parents); a name with a
  version specifier (``"deepspeed>=0.14"``) is checked against installed distribution metadata.
* Reason codes (:data:`SKIP_CODES`) come from :mod:`accel.facts.reasons`; ``accel.test_utils``'
  decorators write the same ``"[code] message"`` skip text.
* Bad usage (``require_devices("two")``, ``require_torch("banana")``) raises
  :class:`MarkerUsageError` (a ``ValueError``) naming the test, the marker and the argument, for
  every instance alike, so the plugin can report it as a collection error.
"""

from __future__ import annotations

from typing import Any, Iterable

from packaging.version import InvalidVersion, Version

from accel.facts.backends import BUILTIN_BACKENDS
from accel.facts.requirements import NOT_IN_TABLE, REQUIREMENT_TABLE, Need, package_problem  # noqa: F401
from .marker_checks import (  # noqa: F401
    MarkerUsageError, CheckContext, backend_name, _deepspeed_accelerators, parse_marks, world_size_checks, ranks_share_device,
)
from .marker_table import ACCELERATE_ALIASES, MARKERS, Alias, as_decorator, is_harness_mark, require_torch_min_version
from .skip_reasons import (  # noqa: F401
    BACKEND_NOT_SELECTED, BACKEND_UNAVAILABLE, KNOWN_LIMITATION, NEEDS_DEVICES, NEEDS_MULTIPROCESS, NEEDS_PACKAGE,
    NOT_ON_BACKEND, OPT_IN, SKIP_CODES, TORCH_VERSION, UNSPECIFIED, UNSUPPORTED_DTYPE, SkipReason, format_skip,
    parse_skip,
)

# packaging.requirements/specifiers, importlib.metadata and difflib load on first use: the plugin imports
# this module in every pytest session of the environment, most of which never evaluate a mark

__all__ = [
    "ACCELERATE_ALIASES",
    "Alias",
    "BUILTIN_BACKENDS",
    "MARKERS",
    "SKIP_CODES",
    "UNSPECIFIED",
    "MarkerUsageError",
    "SkipReason",
    "as_decorator",
    "evaluate",
    "format_skip",
    "is_harness_mark",
    "parse_skip",
    "ranks_share_device",
    "require_torch_min_version",
    "validate",
]


def __getattr__(name: str) -> Any:  # PEP 562: ``from accel_harness.markers import require_cuda``
    if name in ACCELERATE_ALIASES or name in MARKERS:
        return as_decorator(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def validate(marks: Iterable[Any], where: str | None = None) -> None:
    """Raise :class:`MarkerUsageError` if any harness mark in ``marks`` is used wrongly."""
    parse_marks(marks, where)


def _resolve_torch_version(backend: Any, given: Any) -> Version:
    value = given
    if value is None:
        value = getattr(backend, "torch_version", None)
    if value is None:
        from accel.backends.base import torch_version

        value = torch_version()
    try:
        return Version(Version(str(value)).base_version)
    except InvalidVersion:
        raise ValueError(f"not a torch version: {value!r}") from None


def _availability(backend: Any) -> tuple[bool, str]:
    availability = getattr(backend, "availability", None)
    if availability is not None:
        return bool(getattr(availability, "available", availability)), str(getattr(availability, "reason", "") or "")
    probe = getattr(backend, "is_available", None)
    if callable(probe):
        return bool(probe()), ""
    return True, ""


def evaluate(
    marks: Iterable[Any],
    backend: Any,
    world_size: int | None = None,
    torch_version: Any = None,
    *,
    where: str | None = None,
) -> SkipReason | None:
    """The first reason for this test instance to skip, or None to run it.

    ``marks`` are the item's marks (pytest ``Mark`` objects or anything with ``name``, ``args`` and
    ``kwargs``; non-harness marks are ignored), ``backend`` the Backend the instance runs on and
    ``world_size`` its world size (default: the ``world_size`` mark's value when it names a single
    size, else 1). ``torch_version`` defaults to the backend's (``backend.torch_version``).
    ``where`` (the nodeid) is put into usage errors.

    Every mark is validated before anything is evaluated, so a usage error is raised on every
    backend alike. Checks run in a fixed order: backend availability, backend restrictions
    (``require_backend``, ``require_non_*``), known limitations, torch version, packages,
    multi-process support, device count, and last the dtype probes (which run a tiny kernel).
    """
    checks, sizes = parse_marks(marks, where)
    if world_size is None:
        world_size = sizes[0] if sizes and len(sizes) == 1 else 1
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")

    available, why = _availability(backend)
    if not available:
        return SkipReason(BACKEND_UNAVAILABLE, f"{backend_name(backend)}: {why or 'not available'}")
    if world_size > 1:
        checks.extend(world_size_checks(world_size))
    ctx = CheckContext(backend, world_size, _resolve_torch_version(backend, torch_version))
    for check in sorted(checks, key=lambda c: c.rank):  # stable: mark order within a rank
        reason = check.run(ctx)
        if reason is not None:
            return reason
    return None
