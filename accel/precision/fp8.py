"""fp8 training through torchao: whether it can run here, whether for real or emulated, and the conversion.

``mixed_precision="fp8"`` converts a model's ``nn.Linear`` layers to torchao's ``Float8Linear``
(Accelerate's defaults: the first and the last linear layer, and layers whose sizes are not
multiples of 16, stay in high precision) and runs the rest of the forward under bf16 autocast, as
Accelerate does. Where ``torch._scaled_mm`` (the scaled fp8 GEMM) runs on the device the matmuls
are real fp8; elsewhere torchao emulates them (fp8 casts, high-precision matmul) and the run is
labelled "fp8 (emulated)". :func:`fp8_refusal` is the one message the library, ``accel launch``
and ``accel env`` give when fp8 training cannot run at all.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Mapping

import torch

__all__ = ["EMULATED_LABEL", "Fp8Plan", "describe_fp8", "fp8_backend_name", "fp8_library_missing", "fp8_refusal",
           "plan_fp8", "scaled_mm_capability"]

#: how an emulated fp8 run is shown by ``Accelerator.state`` and ``accel env``
EMULATED_LABEL = "fp8 (emulated)"
_LIBRARIES = {"AO": "torchao", "TE": "Transformer Engine", "MSAMP": "MS-AMP"}


def fp8_backend_name(handler: Any = None, environ: Mapping[str, str] | None = None) -> str:
    """Which fp8 library a run asks for: "AO", "TE" or "MSAMP".

    From the recipe handler's type (``AORecipeKwargs``, ``TERecipeKwargs``, ``MSAMPRecipeKwargs``,
    ``FP8RecipeKwargs(backend=...)``), else ``ACCEL_FP8_BACKEND``/``ACCELERATE_FP8_BACKEND``, else
    Accelerate's automatic choice (torchao first).
    """
    if handler is not None:
        kind = type(handler).__name__
        if kind == "AORecipeKwargs":
            return "AO"
        if kind == "TERecipeKwargs":
            return "TE"
        if kind == "MSAMPRecipeKwargs":
            return "MSAMP"
        if getattr(handler, "backend", None):
            return str(handler.backend).upper()
        raise TypeError(f"{kind} is not an fp8 recipe handler (AORecipeKwargs, TERecipeKwargs, MSAMPRecipeKwargs)")
    environ = os.environ if environ is None else environ
    chosen = (environ.get("ACCEL_FP8_BACKEND") or environ.get("ACCELERATE_FP8_BACKEND") or "NO").strip().upper()
    if chosen not in ("NO", ""):
        return chosen
    from ..utils.imports import is_msamp_available, is_torchao_available, is_transformer_engine_available

    if is_torchao_available() or not (is_transformer_engine_available() or is_msamp_available()):
        return "AO"
    return "TE" if is_transformer_engine_available() else "MSAMP"


#: fp8 backend -> (the module its library installs, Accelerate's words when that module is missing)
_MISSING_WORDS = {
    "TE": ("transformer_engine", "TransformerEngine is not available. Please install it or use a different backend."),
    "MSAMP": ("msamp", "MS-AMP was not found on your system. Please ensure that MS-AMP is available "
                       "or choose `'te'` as the backend for FP8 mixed precision training."),
}


def fp8_library_missing(backend: str) -> ImportError | None:
    """The ``ImportError`` Accelerate raises when the library of fp8 ``backend`` ("TE", "MSAMP") is not installed,
    naming its module; None when it is installed (or for "AO", whose absence :func:`fp8_refusal` states)."""
    if backend not in _MISSING_WORDS:
        return None
    from ..utils import imports

    available = imports.is_transformer_engine_available if backend == "TE" else imports.is_msamp_available
    if available():
        return None
    module, words = _MISSING_WORDS[backend]
    return ImportError(f"{words} (the `{module}` module is not installed)", name=module)


def _deepspeed_launch(environ: Mapping[str, str]) -> bool:
    from ..facts.environment import env_flag

    return env_flag("ACCEL_USE_DEEPSPEED", "ACCELERATE_USE_DEEPSPEED", environ=environ)


def fp8_refusal(handler: Any = None, environ: Mapping[str, str] | None = None, deepspeed: bool | None = None) -> str | None:
    """Why ``mixed_precision="fp8"`` cannot run here, in the words every entry point uses; None when it can.

    A Transformer Engine or MS-AMP recipe whose library is missing gets Accelerate's words naming the module
    (:func:`fp8_library_missing`); installed, MS-AMP runs under DeepSpeed (``deepspeed``: a DeepSpeed run, read
    from ``ACCELERATE_USE_DEEPSPEED`` when not given), as in Accelerate, and the others are not integrated.
    """
    backend = fp8_backend_name(handler, environ)
    if backend != "AO":
        missing = fp8_library_missing(backend)
        if missing is not None:
            return str(missing)
        if deepspeed is None:
            deepspeed = _deepspeed_launch(os.environ if environ is None else environ)
        if backend == "MSAMP" and deepspeed:
            return None
        library = _LIBRARIES.get(backend, backend)
        where = " outside DeepSpeed" if backend == "MSAMP" else ""
        return (f"accel trains fp8 through torchao{' (and MS-AMP under DeepSpeed)' if backend == 'MSAMP' else ''}; "
                f"the {backend} fp8 backend ({library}) is not integrated{where} (use --fp8_backend ao or AORecipeKwargs)")
    from ..utils.imports import is_torchao_available

    if not is_torchao_available():
        return "fp8 training needs torchao >= 0.6.1, which is not installed (pip install torchao)"
    return None


@functools.lru_cache(maxsize=None)
def _scaled_mm_probe(backend: Any) -> tuple[bool, str]:
    if not backend.is_available():
        return False, f"backend unavailable: {backend.availability.reason}"
    dtype = getattr(torch, "float8_e4m3fn", None)
    if dtype is None or not hasattr(torch, "_scaled_mm"):
        return False, f"torch {torch.__version__} has no float8 GEMM (torch._scaled_mm)"
    device = backend.device(0 if backend.device_count() else None)
    try:
        a = torch.ones(16, 16, device=device).to(dtype)
        b = torch.ones(16, 16, device=device).to(dtype).t()  # the GEMM wants its second operand column-major
        one = torch.ones((), device=device)
        value = float(torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)[0, 0].float().item())
    except Exception as exc:
        return False, f"torch._scaled_mm fails on {device}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if value != 16.0:
        return False, f"torch._scaled_mm on {device} gave {value}, expected 16.0"
    return True, f"torch._scaled_mm runs on {device}"


def scaled_mm_capability(backend: Any) -> Any:
    """Whether fp8 GEMMs (``torch._scaled_mm``) run on ``backend``'s device: real fp8 if so, else emulation."""
    from ..backends import Capability

    return Capability(*_scaled_mm_probe(backend))


def describe_fp8(backend: Any, handler: Any = None) -> dict[str, Any]:
    """What ``mixed_precision="fp8"`` runs on ``backend``, without importing torchao (``accel env``):
    ``{"mode": "fp8" | "fp8 (emulated)", "reason": ...}`` or ``{"mode": None, "refused": <fp8_refusal's words>}``."""
    refusal = fp8_refusal(handler)
    if refusal is not None:
        return {"mode": None, "refused": refusal}
    if getattr(getattr(handler, "config", None), "emulate", False):
        return {"mode": EMULATED_LABEL, "reason": "Float8LinearConfig(emulate=True) asks for emulation"}
    gemm = scaled_mm_capability(backend)
    if not gemm:
        return {"mode": EMULATED_LABEL, "reason": f"torchao emulates the fp8 matmuls: {gemm.reason}"}
    return {"mode": "fp8", "reason": f"torchao Float8Linear; {gemm.reason}"}


@dataclasses.dataclass(frozen=True)
class Fp8Plan:
    """How fp8 training runs: torchao's config (``emulate`` decided here), the layer filter and why."""

    emulated: bool
    reason: str
    config: Any
    module_filter_func: Any = None
    #: parameter a converted model gave up -> the one that took its place (for optimizers built before prepare)
    replaced: dict = dataclasses.field(default_factory=dict, compare=False)

    @property
    def label(self) -> str:
        """"fp8" or "fp8 (emulated)"."""
        return EMULATED_LABEL if self.emulated else "fp8"

    def convert(self, model: torch.nn.Module) -> None:
        """Give ``model`` torchao's ``Float8Linear`` layers, in place (once; a converted model is left alone)."""
        from ..utils.ao import convert_model_to_fp8_ao, has_ao_layers

        if has_ao_layers(model):
            return
        before = dict(model.named_parameters())
        convert_model_to_fp8_ao(model, config=self.config, module_filter_func=self.module_filter_func)
        for name, param in model.named_parameters():
            if name in before and before[name] is not param:
                self.replaced[before[name]] = param


def without_float8_all_gather(fp8: Fp8Plan, engine: str) -> tuple[Fp8Plan, str]:
    """``fp8`` with torchao's float8 all-gather turned off for ``engine`` (FSDP1, DeepSpeed), and the note for
    the plan's reason ("" when it was off already). The option is FSDP2's: it wraps each weight in a tensor
    subclass that the other engines' ``module.to()`` cannot swap ("Couldn't swap Float8Linear.weight")."""
    if not getattr(fp8.config, "enable_fsdp_float8_all_gather", False):
        return fp8, ""
    config = dataclasses.replace(fp8.config, enable_fsdp_float8_all_gather=False)
    return dataclasses.replace(fp8, config=config), f" (enable_fsdp_float8_all_gather is FSDP2's and is off under {engine})"


def plan_fp8(backend: Any, handler: Any = None) -> Fp8Plan:
    """The fp8 plan for ``backend`` and the recipe ``handler`` (an ``AORecipeKwargs``, default: Accelerate's).

    Raises the ``ImportError`` of :func:`fp8_library_missing` where a Transformer Engine or MS-AMP recipe's library
    is missing, and ``UnsupportedFeatureError`` with :func:`fp8_refusal`'s words where fp8 cannot run otherwise.
    """
    from ..backends import UnsupportedFeatureError

    missing = fp8_library_missing(fp8_backend_name(handler))
    if missing is not None:
        raise missing  # Accelerate's type and words: the recipe's library is not installed
    refusal = fp8_refusal(handler, deepspeed=False)
    if refusal is not None:
        raise UnsupportedFeatureError(backend.name, "mixed_precision='fp8'", refusal)
    if handler is None:
        from ..utils.dataclasses import AORecipeKwargs

        handler = AORecipeKwargs()
    described = describe_fp8(backend, handler)
    emulated = described["mode"] == EMULATED_LABEL
    config = handler.config
    if emulated and not getattr(config, "emulate", False):
        config = dataclasses.replace(config, emulate=True)
    return Fp8Plan(emulated, described["reason"], config, handler.module_filter_func)
