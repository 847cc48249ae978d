"""The sweep's plan, made from torch's own test databases for one device type.

Which databases, entries, dtypes, variants and directions: every OpInfo, ModuleInfo and OptimInfo
entry of the installed torch (a vendor's torch brings its own), the dtypes the device claims that
torch lists for the entry on that device type, and the variants each entry has. What torch's
metadata already decides (a dtype it does not list, a skip) becomes a row without running; the
rest becomes tasks for the workers.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from . import outcomes as oc
from .execute import op_variants
from .metadata import declaration
from .plan import ALL_DTYPES, DATABASES, Row, Selection, Task

__all__ = ["claimed_dtypes", "database", "entry_name", "make_plan"]

#: the dtypes modules and optimizers are swept in (torch's ModuleInfo lists more; these carry training)
_NN_DTYPES = ("float64", "float32", "float16", "bfloat16")


def database(kind: str, source: str | None = None) -> list[Any]:
    """torch's database of ``kind`` (imported on first use; it needs the ``expecttest`` package), or the
    list of entries ``source`` (``module:attribute``) names."""
    if source is not None:
        module, _, name = source.partition(":")
        entries = getattr(importlib.import_module(module), name) if name else None
        if not isinstance(entries, (list, tuple)):
            raise ValueError(f"{source!r} must name a list of OpInfo entries as 'module:attribute'")
        return list(entries)
    module, name = DATABASES[kind]
    return getattr(importlib.import_module(module), name)


def entry_name(kind: str, entry: Any) -> str:
    """How a row names an entry: ``fft.ifft``, ``as_strided.partial_views``, ``nn.Linear``, ``optim.Adam``."""
    if kind == "op":
        return f"{entry.name}.{entry.variant_test_name}" if entry.variant_test_name else entry.name
    if kind == "optim":
        return f"optim.{entry.name}"
    return entry.name


def claimed_dtypes(backend: Any, device: torch.device) -> dict[str, str]:
    """dtype name -> why it is not claimed ('' when the device claims it): the backend's dtype probe,
    and for bool a tensor made and compared on the device."""
    answers: dict[str, str] = {}
    for name in ALL_DTYPES:
        dtype = getattr(torch, name)
        if dtype is torch.bool:
            try:
                ok = bool((torch.ones(2, dtype=dtype, device=device) & torch.ones(2, dtype=dtype, device=device)).all())
                answers[name] = "" if ok else "bool and-reduction gave the wrong answer"
            except Exception as exc:
                answers[name] = f"{type(exc).__name__}: {exc}"
            continue
        capability = backend.dtype_capability(dtype)
        answers[name] = "" if capability else capability.reason
    return answers


def _wanted_dtypes(selection: Selection, claimed: list[str], kind: str) -> list[str]:
    names = [d for d in (selection.dtypes or ALL_DTYPES) if d in claimed]
    return [d for d in names if d in _NN_DTYPES] if kind != "op" else names


def _rows_for(kind: str, name: str, dtype: str, pairs: list[tuple[str, str]], reason: str, message: str) -> list[Row]:
    outcome = oc.OP_REASONS[reason][0]
    return [Row(kind, name, variant, dtype, direction, outcome, reason, message=message) for variant, direction in pairs]


def _op_pairs(entry: Any, selection: Selection, device_type: str, dtype: torch.dtype) -> list[tuple[str, str]]:
    variants = [v for v in op_variants(entry) if selection.variants is None or v in selection.variants]
    backward = ("backward" in selection.directions and entry.supports_autograd
                and dtype in entry.supported_backward_dtypes(device_type))
    pairs = [(v, "forward") for v in variants if "forward" in selection.directions]
    pairs += [(v, "backward") for v in variants if backward and v in ("function", "noncontiguous")]
    return pairs


def _nn_pairs(kind: str, entry: Any, selection: Selection) -> list[tuple[str, str]]:
    if kind == "optim":
        if getattr(entry, "only_supports_sparse_grads", False) or "step" not in selection.directions:
            return []
        return [("step", "step")]
    modes = [m for m in ("train", "eval") if selection.variants is None or m in selection.variants]
    return [(m, d) for m in modes for d in ("forward", "backward") if d in selection.directions]


def make_plan(selection: Selection, device_type: str, claimed: list[str], device_threads: int = 0) -> tuple[list[Task], list[Row]]:
    """The tasks to run and the rows torch's metadata already decides, for ``device_type``."""
    tasks: list[Task] = []
    rows: list[Row] = []
    sources = [(kind, None) for kind in selection.kinds] + [("op", extra) for extra in selection.extra_opinfos]
    for kind, source in sources:
        for index, entry in enumerate(database(kind, source)):
            name = entry_name(kind, entry)
            if not selection.wants(name):
                continue
            listed = (set(entry.supported_dtypes(device_type)) if kind != "optim"
                      else {torch.float32, torch.float64, torch.float16, torch.bfloat16})
            for dtype_name in _wanted_dtypes(selection, claimed, kind):
                dtype = getattr(torch, dtype_name)
                pairs = _op_pairs(entry, selection, device_type, dtype) if kind == "op" else _nn_pairs(kind, entry, selection)
                if not pairs:
                    continue
                if dtype not in listed:
                    rows += _rows_for(kind, name, dtype_name, pairs, oc.TORCH_DTYPE,
                                      f"torch lists {dtype_name} as unsupported for {name} on {device_type}")
                    continue
                said = declaration(entry, kind, device_type, dtype)
                if said.skip:
                    rows += _rows_for(kind, name, dtype_name, pairs, oc.TORCH_SKIP, said.skip)
                    continue
                variants = tuple(dict.fromkeys(v for v, _ in pairs))
                directions = tuple(dict.fromkeys(d for _, d in pairs))
                tasks.append(Task(tid=len(tasks), kind=kind, index=index, name=name, dtype=dtype_name, variants=variants,
                                  directions=directions, limit=selection.limit, xfail=said.xfail, atol=said.atol,
                                  rtol=said.rtol, pairs=tuple(pairs), source=source,
                                  device_threads=device_threads))
    return tasks, rows
