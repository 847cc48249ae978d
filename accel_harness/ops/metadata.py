"""What torch's own test databases declare for an entry on a device type and dtype.

OpInfo, ModuleInfo and OptimInfo entries carry ``DecorateInfo`` objects: skips, expected failures
and tolerance overrides, each aimed at a test class, test name, device type and dtypes. The sweep
is torch's "compare the device against the host" test, so it honours what torch aims at that test
(``TestCommon.test_compare_cpu`` for operators, ``TestModule.test_cpu_gpu_parity`` for modules) and
at every test of the entry. A declaration is found by applying the decorator to a stand-in function
and reading the marks ``unittest`` and torch's override decorators leave on it, so any decorator of
those kinds is understood without a list of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Declaration", "TARGETS", "declaration"]

#: database kind -> (test class, test name) whose declarations the sweep honours
TARGETS: dict[str, tuple[str, str]] = {
    "op": ("TestCommon", "test_compare_cpu"),
    "module": ("TestModule", "test_cpu_gpu_parity"),
    "optim": ("TestOptimRenewed", "test_step_is_noop_when_params_have_no_grad"),
}


@dataclass(frozen=True)
class Declaration:
    """Torch's word on one entry x device type x dtype: a skip (with its reason), an expected failure,
    and tolerance overrides as ``(atol, rtol)`` (either may be None: keep the default)."""

    skip: str | None = None
    xfail: bool = False
    atol: float | None = None
    rtol: float | None = None
    #: decorators that were active but are none of the above (named, so a report can show them)
    other: tuple[str, ...] = ()


def declaration(entry: Any, kind: str, device_type: str, dtype: Any) -> Declaration:
    """The :class:`Declaration` of ``entry`` (an OpInfo, ModuleInfo or OptimInfo) for ``device_type`` and ``dtype``."""
    test_class, test_name = TARGETS[kind]
    try:
        decorators = entry.get_decorators(test_class, test_name, device_type, dtype, {})
    except TypeError:  # OptimInfo's get_decorators has no param_kwargs
        decorators = entry.get_decorators(test_class, test_name, device_type, dtype)
    skip: str | None = None
    xfail = False
    atol = rtol = None
    other: list[str] = []
    for decorator in decorators:
        def stand_in() -> None:
            """A fresh function per decorator: some decorators mark the function they are given."""

        try:
            marked = decorator(stand_in)
        except Exception as exc:  # a decorator that needs a real test method: named, not applied
            other.append(f"{getattr(decorator, '__name__', type(decorator).__name__)} ({type(exc).__name__})")
            continue
        if getattr(marked, "__unittest_skip__", False):
            skip = skip or str(getattr(marked, "__unittest_skip_why__", "") or "skipped by torch's metadata")
        elif getattr(marked, "__unittest_expecting_failure__", False):
            xfail = True
        elif isinstance(getattr(marked, "tolerance_overrides", None), dict):
            tol = marked.tolerance_overrides.get(dtype)
            if tol is not None:
                atol, rtol = float(tol.atol), float(tol.rtol)
        elif isinstance(getattr(marked, "precision_overrides", None), dict):
            precision = marked.precision_overrides.get(dtype)
            if precision is not None:
                atol = float(precision)
        else:
            other.append(getattr(decorator, "__name__", type(decorator).__name__))
    return Declaration(skip=skip, xfail=xfail, atol=atol, rtol=rtol, other=tuple(other))

