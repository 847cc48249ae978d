"""The sweep's work items and their results as plain data (torch-free, so the parent never imports torch).

A :class:`Task` is one database entry x dtype, with the call variants and directions to run on
each of its samples; its worker answers with one :class:`SampleResult` per sample x variant x
direction. A :class:`Row` is what the tables show: one entry x variant x dtype x direction, its
samples folded into one outcome.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ALL_DTYPES", "DATABASES", "DIRECTIONS", "KINDS", "QUICK", "VARIANTS", "Row", "SampleResult", "Selection", "Task", "row_key"]

#: kind -> (module of torch's test database, its list)
DATABASES = {
    "op": ("torch.testing._internal.common_methods_invocations", "op_db"),
    "module": ("torch.testing._internal.common_modules", "module_db"),
    "optim": ("torch.testing._internal.common_optimizers", "optim_db"),
}

#: how an operator is called: torch's function, the Tensor method, in place, with ``out=``, on
#: non-contiguous copies of the samples; modules run in training or eval mode; optimizers per input
VARIANTS = ("function", "method", "inplace", "out", "noncontiguous", "train", "eval", "step")
#: forward compares outputs, backward compares gradients, step compares parameters after optimizer steps
DIRECTIONS = ("forward", "backward", "step")
#: the databases: torch's OpInfo (operators), ModuleInfo (torch.nn modules), OptimInfo (optimizers)
KINDS = ("op", "module", "optim")
#: every dtype the sweep knows, in the order tables show them
ALL_DTYPES = ("float64", "float32", "float16", "bfloat16", "complex128", "complex64", "int64", "int32", "int16", "int8",
              "uint8", "bool")


@dataclass(frozen=True)
class Selection:
    """What a sweep covers: databases, dtypes (None: every dtype the device claims), directions,
    call variants (None: every variant an entry has), samples per entry and dtype, name patterns."""

    kinds: tuple[str, ...] = KINDS
    dtypes: tuple[str, ...] | None = None
    directions: tuple[str, ...] = ("forward", "backward", "step")
    variants: tuple[str, ...] | None = None
    limit: int = 4
    pattern: str | None = None
    #: a device profile's tolerance rules (accel_harness.ops.profile_rules.tolerance_rules), or None
    tolerance_rules: dict | None = None
    #: more OpInfo entries beside torch's, as ``module:attribute`` naming a list (a vendor's own operators)
    extra_opinfos: tuple[str, ...] = ()

    def wants(self, name: str) -> bool:
        """Whether an entry's name is selected by the pattern: comma-separated glob patterns (``fft.*``,
        ``*norm*``); a part without wildcards names one entry exactly."""
        if not self.pattern:
            return True
        import fnmatch

        return any(fnmatch.fnmatchcase(name, part.strip()) for part in self.pattern.split(",") if part.strip())


#: the quick sweep: every operator entry, float32 and bfloat16, forward, torch's function, three samples
QUICK = Selection(kinds=("op",), dtypes=("float32", "bfloat16"), directions=("forward",), variants=("function",), limit=3)


@dataclass
class Task:
    """One entry x dtype for a worker: which variants and directions to run on how many samples."""

    tid: int
    kind: str
    index: int
    name: str
    dtype: str
    variants: tuple[str, ...]
    directions: tuple[str, ...]
    #: samples per entry and dtype (0: all of them)
    limit: int
    #: (sample, variant, direction) -> (reason, message) already decided: a crash or a timeout in an
    #: earlier attempt; the worker does not run those again
    decided: dict[tuple[int, str, str], tuple[str, str]] = field(default_factory=dict)
    #: torch's metadata expects this entry to fail here (the row's outcome becomes xfailed or xpassed)
    xfail: bool = False
    #: tolerance from torch's metadata (None: the dtype's default)
    atol: float | None = None
    rtol: float | None = None
    #: the (variant, direction) rows this task fills
    pairs: tuple[tuple[str, str], ...] = ()
    #: where the entry comes from: None for torch's database of ``kind``, else ``module:attribute``
    source: str | None = None
    #: threads the device side runs with (0: as the host side); a CPU swept as a device uses another
    #: thread count than its reference, so the two must agree across thread counts
    device_threads: int = 0


@dataclass
class SampleResult:
    """One sample x variant x direction of a task."""

    variant: str
    direction: str
    sample: int
    reason: str
    max_abs: float | None = None
    max_rel: float | None = None
    message: str | None = None
    tolerance: str | None = None
    seconds: float = 0.0


@dataclass
class Row:
    """One line of ``op_support.csv``: an entry x variant x dtype x direction and its folded outcome."""

    kind: str
    op: str
    variant: str
    dtype: str
    direction: str
    outcome: str
    reason_code: str
    samples: int = 0
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    message: str | None = None
    tolerance: str | None = None
    known_issue: str | None = None
    seconds: float = 0.0


def row_key(kind: str, op: str, variant: str, dtype: str, direction: str) -> tuple[str, str, str, str, str]:
    """The identity of a row (kind, op, variant, dtype, direction)."""
    return (kind, op, variant, dtype, direction)
