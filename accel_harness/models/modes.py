"""The model suite's modes: how the Accelerator under test is built for each, and what each needs.

Why: a model that trains on one device can still fail in bf16, sharded over ranks or compiled. Each
:class:`Mode` names one way of training (its id in test ids and records, its report label), the
ranks it runs on, the Accelerator arguments that select it, and what the backend must claim for it
(checked by harness markers the suite attaches, so a mode the backend does not claim is "not run"
with the backend's reason). The gate factors per mode are one table, ``accel.facts.model_gates``
(a device profile may override them); :func:`gate_factors` reads it with the profile's on top.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from accel.facts.model_gates import MODE_GATES, MODE_LABELS, MODEL_MODES

__all__ = ["MODES", "Mode", "gate_factors"]


@dataclass(frozen=True)
class Mode:
    """One training mode of the model suite."""

    name: str
    world_size: int
    #: harness marker names (with keyword arguments) the mode's tests carry: what the backend must claim
    needs: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()
    #: ``mixed_precision`` of the Accelerator
    precision: str = "no"

    @property
    def label(self) -> str:
        """How reports name the mode (accel.facts.model_gates.MODE_LABELS)."""
        return MODE_LABELS[self.name]

    def accelerator_kwargs(self, backend: Any) -> dict[str, Any]:
        """The Accelerator's arguments for this mode on ``backend`` (built in the rank, after the markers passed)."""
        kwargs: dict[str, Any] = {}
        if self.precision != "no":
            kwargs["mixed_precision"] = self.precision
        if self.name == "compile":
            kwargs["dynamo_backend"] = backend.compile_backend
        elif self.name == "fsdp2":
            from accel.utils import FullyShardedDataParallelPlugin

            kwargs["fsdp_plugin"] = FullyShardedDataParallelPlugin(fsdp_version=2)
        elif self.name in ("zero2", "zero3"):
            from accel.utils import DeepSpeedPlugin

            from .train import MAX_NORM

            kwargs["deepspeed_plugin"] = DeepSpeedPlugin(zero_stage=int(self.name[-1]), gradient_clipping=MAX_NORM)
        elif self.name == "fp8":
            from accel.utils import AORecipeKwargs

            kwargs["kwargs_handlers"] = [AORecipeKwargs()]
        return kwargs


def _table() -> dict[str, Mode]:
    rows = [
        Mode("single", 1),
        Mode("ddp", 2),
        Mode("fsdp2", 2, needs=(("require_fsdp2", ()),)),
        Mode("zero2", 2, needs=(("require_deepspeed", ()),)),
        Mode("zero3", 2, needs=(("require_deepspeed", ()),)),
        Mode("compile", 1),
        Mode("bf16", 1, needs=(("require_bf16", (("amp", True),)),), precision="bf16"),
        Mode("fp16", 1, needs=(("require_fp16", (("amp", True),)),), precision="fp16"),
        Mode("fp8", 1, needs=(("require_fp8", (("training", True),)),), precision="fp8"),
    ]
    table = {row.name: row for row in rows}
    if tuple(table) != MODEL_MODES:
        raise RuntimeError(f"the modes {tuple(table)} and the gate table's {MODEL_MODES} differ")
    return table


#: mode name -> :class:`Mode`, in report column order
MODES: dict[str, Mode] = _table()


def gate_factors(mode: str, overrides: Mapping[str, Mapping[str, float]] | None = None) -> dict[str, float]:
    """``{"quality", "steps"}`` for ``mode``: the table's, with ``overrides[mode]`` (a device profile's) on top."""
    if mode not in MODE_GATES:
        raise ValueError(f"unknown model suite mode {mode!r} (known: {', '.join(MODEL_MODES)})")
    return {**MODE_GATES[mode], **dict((overrides or {}).get(mode, {}))}
