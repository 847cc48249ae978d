"""The harness marker table and the Accelerate-style decorator names that stand for its marks.

What the plugin registers (:data:`MARKERS`) and what ``from accel_harness.markers import require_cuda``
returns (:func:`as_decorator`); evaluating a mark is :mod:`accel_harness.markers`' job.
"""

from __future__ import annotations

from typing import Any

from accel.facts import versions
from accel.facts.backends import BUILTIN_BACKENDS
from accel.facts.requirements import NOT_IN_TABLE, REQUIREMENT_TABLE, Need


# each built-in backend (accel.facts.backends.BUILTIN_BACKENDS) gets a ``require_non_<name>`` marker registered

# ---------------------------------------------------------------------------- marker table
#: marker name -> description; the plugin registers each as ``f"{name}: {description}"``
MARKERS: dict[str, str] = {
    "require_backend": "run only on the named backend(s), e.g. require_backend('cuda', 'xpu'); other instances skip [not-on-backend]",
    **{
        f"require_non_{name}": f"skip the instances that run on the {name} backend [not-on-backend]"
        for name in BUILTIN_BACKENDS
    },
    "require_devices": "require_devices(n, exact=False, of=()): skip unless the backend has at least n physical devices (exactly n with exact=True; cpu has 1) and, with of=('cuda', ...), is one of those backends [needs-devices]",
    "require_multi_device": "same as require_devices(2) [needs-devices]",
    "require_fp16": "skip unless the backend computes in float16; require_fp16(amp=True) asks for fp16 autocast instead [unsupported-dtype]",
    "require_bf16": "skip unless the backend computes in bfloat16; require_bf16(amp=True) asks for bf16 autocast instead [unsupported-dtype]",
    "require_fp8": "skip unless the backend runs float8 (e4m3) matmuls; require_fp8(training=True) also asks that accel can train in fp8 here [unsupported-dtype]",
    "require_package": "require_package(name, ..., any_of=False): skip unless each package (any_of=True: at least one) is installed; 'name>=1.2' also checks its version [needs-package]",
    "require_torch": "require_torch(spec): skip unless the installed torch matches the specifier, e.g. require_torch('>=2.5') [torch-version]",
    "require_no_package": "require_no_package(name): skip when the package is installed [known-limitation]",
    "require_deepspeed": "skip unless deepspeed is installed with an accelerator for the backend [needs-package, not-on-backend]",
    "require_fsdp2": f"skip unless torch >= {versions.TORCH_FSDP2} (fully_shard) and the backend has a collective backend [torch-version, needs-multiprocess]",
    "require_opt_in": "require_opt_in(VARIABLE): skip unless the yes/no environment variable is true, e.g. require_opt_in('RUN_SLOW') [opt-in]",
    "slow": "takes more than a few seconds",
    "models": "the validated-models suite: real architectures trained to a target, judged against the host fp32 run (a label: no condition)",
    "rank_timeout": "rank_timeout(scale): this test's ranks may run scale times --dist-timeout (from 1 to 10: a long training run on a slow device; no condition)",
    "fork_server_imports": "fork_server_imports(module, ...): modules the session's fork server imports before it forks, for a test that forks its own workers from that server (the operator sweep); the server then starts as the tests begin (no condition)",
    "world_size": "world_size(n) or world_size([1, 2, 4]): run the body in n processes, one test instance per size [needs-multiprocess, needs-devices]",
    "known_limitation": "known_limitation('mps', ..., reason='...', torch='<2.8'): skip on the named backends (optionally only in a torch range) [known-limitation]",
}

# ---------------------------------------------------------------------------- Accelerate aliases
#: an Accelerate decorator's condition as a harness mark: ``pytest.mark.<marker>(*args, **kwargs)``
Alias = Need

#: Accelerate ``accelerate.test_utils`` decorator name -> the harness marks it stands for, generated
#: from accel.facts.requirements.REQUIREMENT_TABLE (the table accel.test_utils evaluates). "The backend"
#: is the instance's: ``require_cuda`` means only the cuda instance runs, ``require_multi_gpu`` means a
#: cuda instance with two devices.
ACCELERATE_ALIASES: dict[str, tuple[Alias, ...]] = {name: row.needs for name, row in REQUIREMENT_TABLE.items()}


def _mark_of(need: Alias) -> Any:
    import pytest

    decorator = getattr(pytest.mark, need.marker)
    return decorator(*need.args, **dict(need.kwargs)) if need.args or need.kwargs else decorator


def as_decorator(name: str) -> Any:
    """A pytest mark decorator for a harness marker or an Accelerate-style alias.

    ``as_decorator("require_cuda")`` is ``pytest.mark.require_backend("cuda")``;
    ``as_decorator("require_devices")`` is ``pytest.mark.require_devices`` (call it with ``n``).
    The same names can be imported directly: ``from accel_harness.markers import require_cuda``.
    """
    import pytest

    if name in ACCELERATE_ALIASES:
        marks = [_mark_of(need) for need in ACCELERATE_ALIASES[name]]
        if len(marks) == 1:
            return marks[0]

        def apply_all(test: Any) -> Any:
            for mark_decorator in marks:
                test = mark_decorator(test)
            return test

        apply_all.__name__ = apply_all.__qualname__ = name
        apply_all.__doc__ = f"The harness marks of Accelerate's {name}: " + ", ".join(m.mark.name for m in marks)
        apply_all.marks = marks  # type: ignore[attr-defined]
        return apply_all
    if name in MARKERS or (name.startswith("require_non_") and len(name) > len("require_non_")):
        return getattr(pytest.mark, name)
    known = sorted(set(MARKERS) | set(ACCELERATE_ALIASES) | set(NOT_IN_TABLE))
    import difflib

    close = difflib.get_close_matches(name, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise AttributeError(f"no harness marker or Accelerate-style decorator named {name!r}{hint}")


def require_torch_min_version(test_case: Any = None, version: str | None = None) -> Any:
    """Accelerate's ``require_torch_min_version(version="2.5")``: ``require_torch(">=2.5")``."""
    if version is None:
        raise ValueError("require_torch_min_version needs version=, e.g. require_torch_min_version(version='2.5')")
    decorator = _mark_of(Need("require_torch", (f">={version}",)))
    return decorator(test_case) if test_case is not None else decorator


def is_harness_mark(name: str) -> bool:
    """True for the marker names :func:`evaluate` understands (the plugin may parametrize on it)."""
    return name in MARKERS or (name.startswith("require_non_") and len(name) > len("require_non_"))
