"""The fp8 recipe kwargs handlers (TransformerEngine, MS-AMP, torchao) and their option types,
re-exported by :mod:`accel.utils.dataclasses` under Accelerate's names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ._base import KwargsHandler, StrValueEnum, env_bool, env_suffix

#: the fp8 libraries MS-AMP and Transformer Engine, as ``FP8RecipeKwargs(backend=...)`` spells them
Backend = Literal["MSAMP", "TE"]
#: MS-AMP optimisation levels
OptLevel = Literal["O1", "O2"]
#: Transformer Engine fp8 formats
FP8Format = Literal["HYBRID", "E4M3", "E5M2"]
#: how Transformer Engine derives the scaling factor from the amax history
AmaxComputeAlgorithm = Literal["max", "most_recent"]


class FP8BackendType(StrValueEnum):
    """Which library runs fp8 training: TransformerEngine, MS-AMP or torchao."""

    NO = "NO"
    TE = "TE"
    MSAMP = "MSAMP"
    AO = "AO"


def _fp8_package_missing(backend: str, package: str, install: str) -> ImportError:
    return ImportError(
        f"fp8 training with the {backend} backend needs {package}, which is not installed ({install}); "
        "choose another fp8 backend or mixed_precision='bf16'/'fp16'"
    )


@dataclass
class AORecipeKwargs(KwargsHandler):
    """fp8 training through torchao's ``Float8Linear`` (``config``: a ``torchao.float8.Float8LinearConfig``).

    Unset options come from ``ACCEL_FP8_*``/``ACCELERATE_FP8_*`` (``PAD_INNER_DIM``,
    ``ENABLE_FSDP_FLOAT8_ALL_GATHER``, both default true). ImportError when torchao >= 0.6.1 is
    missing; whether the device can run fp8 is checked when the Accelerator is built.
    """

    config: Any = None
    module_filter_func: Any = None
    pad_inner_dim: bool | None = None
    enable_fsdp_float8_all_gather: bool | None = None

    def __post_init__(self) -> None:
        from ..imports import is_torchao_available

        if not is_torchao_available():
            raise _fp8_package_missing("AO", "torchao >= 0.6.1", "pip install torchao")
        if self.config is None:
            from torchao.float8 import Float8LinearConfig

            if self.pad_inner_dim is None:
                self.pad_inner_dim = env_bool("FP8_PAD_INNER_DIM", True)
            if self.enable_fsdp_float8_all_gather is None:
                self.enable_fsdp_float8_all_gather = env_bool("FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER", True)
            self.config = Float8LinearConfig(pad_inner_dim=self.pad_inner_dim,
                                             enable_fsdp_float8_all_gather=self.enable_fsdp_float8_all_gather)


_FP8_FORMATS = ("HYBRID", "E4M3", "E5M2")
_AMAX_ALGOS = ("max", "most_recent")
_OPT_LEVELS = ("O1", "O2")


def _int_env(suffix: str, default: int) -> int:
    raw = env_suffix(suffix)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"ACCEL_{suffix}/ACCELERATE_{suffix} must be an integer, got {raw!r}") from None


def _te_defaults(self: Any) -> None:
    """Fill the TransformerEngine recipe fields from ``ACCEL_FP8_*``/``ACCELERATE_FP8_*`` and check them."""
    if self.use_autocast_during_eval is None:
        self.use_autocast_during_eval = env_bool("FP8_USE_AUTOCAST_DURING_EVAL")
    if self.margin is None:
        self.margin = _int_env("FP8_MARGIN", 0)
    if self.interval is None:
        self.interval = _int_env("FP8_INTERVAL", 1)
    self.fp8_format = str(self.fp8_format or env_suffix("FP8_FORMAT", "HYBRID")).upper()
    if self.fp8_format not in _FP8_FORMATS:
        raise ValueError(f"`fp8_format` must be one of {' or '.join(_FP8_FORMATS)}.")
    self.amax_compute_algo = str(self.amax_compute_algo or env_suffix("FP8_AMAX_COMPUTE_ALGO", "most_recent")).lower()
    if self.amax_compute_algo not in _AMAX_ALGOS:
        raise ValueError(f"`amax_compute_algo` must be one of {' or '.join(_AMAX_ALGOS)}")
    if self.amax_history_len is None:
        self.amax_history_len = _int_env("FP8_AMAX_HISTORY_LEN", 1024)
    if self.override_linear_precision is None:
        self.override_linear_precision = tuple(env_bool(f"FP8_OVERRIDE_{p}") for p in ("FPROP", "DGRAD", "WGRAD"))
    if self.use_mxfp8_block_scaling is None:
        self.use_mxfp8_block_scaling = env_bool("FP8_USE_MXFP8_BLOCK_SCALING")


@dataclass
class TERecipeKwargs(KwargsHandler):
    """fp8 training through NVIDIA TransformerEngine's delayed-scaling recipe.

    Unset fields come from ``ACCEL_FP8_*``/``ACCELERATE_FP8_*`` (``FORMAT`` HYBRID/E4M3/E5M2,
    ``MARGIN``, ``INTERVAL``, ``AMAX_HISTORY_LEN``, ``AMAX_COMPUTE_ALGO``, ``OVERRIDE_FPROP``/``DGRAD``/
    ``WGRAD``, ``USE_AUTOCAST_DURING_EVAL``, ``USE_MXFP8_BLOCK_SCALING``). ImportError when
    transformer_engine is missing.
    """

    use_autocast_during_eval: bool | None = None
    margin: int | None = None
    interval: int | None = None
    fp8_format: str | None = None
    amax_history_len: int | None = None
    amax_compute_algo: str | None = None
    override_linear_precision: tuple[bool, bool, bool] | None = None
    use_mxfp8_block_scaling: bool | None = None

    def __post_init__(self) -> None:
        from ..imports import is_transformer_engine_available

        if not is_transformer_engine_available():
            raise _fp8_package_missing("TE", "transformer_engine", "pip install transformer_engine[pytorch]")
        _te_defaults(self)


@dataclass
class MSAMPRecipeKwargs(KwargsHandler):
    """fp8 training through MS-AMP (``opt_level`` O1 or O2; ``ACCEL_FP8_OPT_LEVEL``, default O2)."""

    opt_level: str | None = None

    def __post_init__(self) -> None:
        if self.opt_level is None:
            self.opt_level = env_suffix("FP8_OPT_LEVEL", "O2")
        if self.opt_level not in _OPT_LEVELS:
            raise ValueError(f"`opt_level` must be one of {' or '.join(_OPT_LEVELS)}")


@dataclass
class FP8RecipeKwargs(KwargsHandler):
    """Deprecated (as in Accelerate): one class for the TE and MS-AMP recipes; use
    :class:`TERecipeKwargs`, :class:`MSAMPRecipeKwargs` or :class:`AORecipeKwargs`.

    ``backend`` ("TE" or "MSAMP"; ``ACCEL_FP8_BACKEND``) picks which fields apply; its package must
    be installed.
    """

    use_autocast_during_eval: bool | None = None
    margin: int | None = None
    interval: int | None = None
    fp8_format: str | None = None
    amax_history_len: int | None = None
    amax_compute_algo: str | None = None
    override_linear_precision: tuple[bool, bool, bool] | None = None
    use_mxfp8_block_scaling: bool | None = None
    opt_level: str | None = None
    backend: str | None = None

    def __post_init__(self) -> None:
        import warnings

        from ..imports import is_msamp_available, is_transformer_engine_available

        warnings.warn("FP8RecipeKwargs is deprecated and will be removed in Accelerate v2.0.0. Please use one of the "
                      "proper FP8 recipe kwargs classes such as TERecipeKwargs or MSAMPRecipeKwargs instead.",
                      FutureWarning, stacklevel=3)
        if self.backend is None:
            self.backend = env_suffix("FP8_BACKEND", "msamp" if is_msamp_available() else "te")
        self.backend = str(self.backend).upper()
        if self.backend not in ("TE", "MSAMP"):
            raise ValueError("`backend` must be 'MSAMP' or 'TE' (TransformerEngine) to use `FP8RecipeKwargs`.")
        if self.backend == "TE":
            if not is_transformer_engine_available():
                raise _fp8_package_missing("TE", "transformer_engine", "pip install transformer_engine[pytorch]")
            _te_defaults(self)
        else:
            if not is_msamp_available():
                raise _fp8_package_missing("MSAMP", "msamp", "see https://github.com/Azure/MS-AMP")
            MSAMPRecipeKwargs.__post_init__(self)  # type: ignore[arg-type]
