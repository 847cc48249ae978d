"""``is_*_available`` helpers with Accelerate's names; device answers come from the backend registry."""

from __future__ import annotations

import functools
import importlib.util
import operator
from typing import Any, Callable

from packaging.version import Version

from ..facts import versions
from ..facts.environment import env_flag

_OPS = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne, ">=": operator.ge, ">": operator.gt}


@functools.lru_cache(maxsize=None)
def _package(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def _backend_available(name: str) -> bool:
    from ..backends import UnknownBackendError, get_registry

    try:
        return get_registry().get(name).is_available()
    except UnknownBackendError:
        return False


def _active():
    from ..backends import get_backend

    return get_backend()


def compare_versions(library_or_version: str | Version, operation: str, requirement_version: str) -> bool:
    """``compare_versions("torch", ">=", "2.5")``: compare an installed package (or a version) to a requirement."""
    if operation not in _OPS:
        raise ValueError(f"operation must be one of {list(_OPS)}, got {operation!r}")
    if isinstance(library_or_version, str) and not library_or_version[:1].isdigit():
        from importlib.metadata import version

        library_or_version = version(library_or_version)
    return _OPS[operation](Version(Version(str(library_or_version)).base_version), Version(requirement_version))


def is_torch_version(operation: str, version: str) -> bool:
    from ..backends import torch_version

    return compare_versions(torch_version(), operation, version)


def is_cuda_available() -> bool:
    return _backend_available("cuda")


def is_xpu_available(check_device: bool = False) -> bool:
    return _backend_available("xpu")


def is_mps_available(min_version: str = "1.12") -> bool:
    return _backend_available("mps")


def is_hpu_available(init_hccl: bool = False) -> bool:
    return _backend_available("hpu")


def is_npu_available(check_device: bool = False) -> bool:
    return _backend_available("npu")


def is_mlu_available(check_device: bool = False) -> bool:
    return _backend_available("mlu")


def is_musa_available(check_device: bool = False) -> bool:
    return _backend_available("musa")


def is_torch_xla_available(check_is_tpu: bool = False, check_is_gpu: bool = False) -> bool:
    """Whether the xla backend is usable (torch_xla installed, not switched off by USE_TORCH_XLA, a device found);
    ``check_is_tpu``/``check_is_gpu`` also ask that the XLA device be a TPU or a GPU."""
    if check_is_tpu and check_is_gpu:
        raise ValueError("is_torch_xla_available: check_is_tpu and check_is_gpu cannot both be True")
    if not _backend_available("xla"):
        return False
    if check_is_tpu or check_is_gpu:
        from ..backends import get_registry

        kind = get_registry().get("xla").xla_device_type
        return kind == "TPU" if check_is_tpu else kind in ("GPU", "CUDA")
    return True


def is_fp16_available() -> bool:
    return bool(_active().supports_fp16)


def is_bf16_available(ignore_tpu: bool = False) -> bool:
    return bool(_active().supports_bf16)


def is_fp8_available() -> bool:
    return bool(_active().supports_fp8)


def is_torch_distributed_available() -> bool:
    import torch.distributed as dist

    return dist.is_available()


def is_xccl_available() -> bool:
    import torch.distributed as dist

    probe = getattr(dist, "is_xccl_available", None)
    return bool(dist.is_available() and probe is not None and probe())


def is_ccl_available() -> bool:
    return _package("oneccl_bindings_for_pytorch")


def is_deepspeed_available() -> bool:
    return _package("deepspeed")


def is_tensorboard_available() -> bool:
    return _package("tensorboard") or _package("tensorboardX")


def is_wandb_available() -> bool:
    return _package("wandb")


def is_comet_ml_available() -> bool:
    return _package("comet_ml")


def is_mlflow_available() -> bool:
    return _package("mlflow")


def is_rich_available() -> bool:
    return _package("rich")


def is_tqdm_available() -> bool:
    return _package("tqdm")


def is_pandas_available() -> bool:
    return _package("pandas")


def is_numpy_available() -> bool:
    return _package("numpy")


def is_datasets_available() -> bool:
    return _package("datasets")


def is_transformers_available() -> bool:
    return _package("transformers")


def is_peft_available() -> bool:
    return _package("peft")


def is_timm_available() -> bool:
    return _package("timm")


def is_torchvision_available() -> bool:
    return _package("torchvision")


def is_pytest_available() -> bool:
    return _package("pytest")


def is_safetensors_available() -> bool:
    return _package("safetensors")


def is_psutil_available() -> bool:
    return _package("psutil")


def is_bnb_available() -> bool:
    return _package("bitsandbytes")


def is_bitsandbytes_multi_backend_available() -> bool:
    """Whether the installed bitsandbytes runs on devices other than CUDA (its multi-backend build)."""
    if not is_bnb_available():
        return False
    import bitsandbytes

    return "multi_backend" in getattr(bitsandbytes, "features", set())


def is_weights_only_available() -> bool:
    return is_torch_version(">=", versions.TORCH_WEIGHTS_ONLY)


# ---------------------------------------------------------------------------- more packages (Accelerate's names)
def _package_version_at_least(distribution: str, minimum: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return Version(Version(version(distribution)).base_version) >= Version(minimum)
    except (PackageNotFoundError, ValueError):
        return False


def is_numpy_at_least(min_version: str) -> bool:
    """Whether numpy >= ``min_version`` is installed."""
    return _package("numpy") and _package_version_at_least("numpy", min_version)


def is_import_timer_available() -> bool:
    """Whether the ``import_timer`` package (import-time profiling) is installed."""
    return _package("import_timer")


def is_aim_available() -> bool:
    """Whether the aim package is installed."""
    return _package("aim")


def is_clearml_available() -> bool:
    """Whether the clearml package is installed."""
    return _package("clearml")


def is_dvclive_available() -> bool:
    """Whether the dvclive package is installed."""
    return _package("dvclive")


def is_swanlab_available() -> bool:
    """Whether the swanlab package is installed."""
    return _package("swanlab")


def is_trackio_available() -> bool:
    """Whether the trackio package is installed."""
    return _package("trackio")


def is_matplotlib_available() -> bool:
    """Whether the matplotlib package is installed."""
    return _package("matplotlib")


def is_boto3_available() -> bool:
    """Whether the boto3 package is installed."""
    return _package("boto3")


def is_sagemaker_available() -> bool:
    """Whether the sagemaker package is installed."""
    return _package("sagemaker")


def is_schedulefree_available() -> bool:
    """Whether the schedulefree package is installed."""
    return _package("schedulefree")


def is_lomo_available() -> bool:
    """Whether the lomo_optim package is installed."""
    return _package("lomo_optim")


def is_msamp_available() -> bool:
    """Whether the msamp package is installed."""
    return _package("msamp")


def is_triton_available() -> bool:
    """Whether the triton package is installed."""
    return _package("triton")


def is_pippy_available() -> bool:
    """Whether pipeline parallelism (``torch.distributed.pipelining``, torch >= 2.4) is importable."""
    return is_torch_version(">=", versions.TORCH_PIPELINING) and _package("torch.distributed.pipelining")


def is_megatron_lm_available() -> bool:
    """Whether the megatron package is installed."""
    return _package("megatron")


def is_transformer_engine_available() -> bool:
    """Whether NVIDIA Transformer Engine is installed (the fp8 "TE" backend)."""
    return _package("transformer_engine")


def is_transformer_engine_mxfp8_available() -> bool:
    """Whether Transformer Engine >= 2.0 (MXFP8 recipes) is installed."""
    return is_transformer_engine_available() and _package_version_at_least("transformer_engine", versions.TRANSFORMER_ENGINE_MXFP8)


def is_torchao_available() -> bool:
    """Whether torchao at its fp8 floor (the fp8 "AO" backend) is installed."""
    return _package("torchao") and _package_version_at_least("torchao", versions.TORCHAO_FP8)


def is_torchdata_available() -> bool:
    """Whether the torchdata package is installed."""
    return _package("torchdata")


def is_torchdata_stateful_dataloader_available() -> bool:
    """Whether torchdata with ``StatefulDataLoader`` is installed."""
    return _package("torchdata") and _package_version_at_least("torchdata", versions.TORCHDATA_STATEFUL)


def is_4bit_bnb_available() -> bool:
    """Whether bitsandbytes with 4-bit layers is installed."""
    return is_bnb_available() and _package_version_at_least("bitsandbytes", versions.BITSANDBYTES_4BIT)


def is_8bit_bnb_available() -> bool:
    """Whether bitsandbytes with 8-bit layers is installed."""
    return is_bnb_available() and _package_version_at_least("bitsandbytes", versions.BITSANDBYTES_8BIT)


def is_pynvml_available() -> bool:
    """Whether the pynvml package is installed."""
    return _package("pynvml")


def is_sdaa_available(check_device: bool = False) -> bool:
    """Whether the sdaa backend is available."""
    return _backend_available("sdaa")


def is_neuron_available(check_device: bool = False) -> bool:
    """Whether the neuron backend is available."""
    return _backend_available("neuron")


def is_amdsmi_available() -> bool:
    """Whether AMD's amdsmi package (ROCm device queries) is installed."""
    return _package("amdsmi")


def is_rocm_available() -> bool:
    """Whether torch is a ROCm (HIP) build and its GPUs are usable through the cuda backend."""
    import torch

    return getattr(torch.version, "hip", None) is not None and is_cuda_available()


def is_habana_gaudi1() -> bool:
    """Whether the HPU in use is a first-generation Gaudi (device name exactly "GAUDI"; Gaudi2/3 lack some features)."""
    if not is_hpu_available():
        return False
    from ..backends import get_registry

    return get_registry().get("hpu").device_properties(0).name.strip().upper() == "GAUDI"


def torchao_required(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: calling ``func`` without torchao at its fp8 floor raises an ImportError saying so."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not is_torchao_available():
            raise ImportError(f"{func.__qualname__} needs torchao >= {versions.TORCHAO_FP8}, which is not installed "
                              "(pip install torchao)")
        return func(*args, **kwargs)

    return wrapper


def deepspeed_required(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: calling ``func`` while an AcceleratorState exists that is not configured for DeepSpeed is an error."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        import sys

        # no state module loaded means no Accelerator yet, hence nothing to contradict (and no import cycle)
        state_module = sys.modules.get(f"{__package__.rpartition('.')[0]}.state")
        state_class = getattr(state_module, "AcceleratorState", None)
        if state_class is not None and state_class._shared_state:
            distributed_type = str(state_class().distributed_type)
            if distributed_type != "DEEPSPEED":
                raise ValueError(f"{func.__qualname__} needs DeepSpeed, but the Accelerator is configured for "
                                 f"{distributed_type}; pass a DeepSpeedPlugin or use `accel launch --use_deepspeed`")
        return func(*args, **kwargs)

    return wrapper


#: whether torch_xla may be used when installed (``USE_TORCH_XLA=0`` runs a plain torch job beside it)
USE_TORCH_XLA = env_flag("USE_TORCH_XLA", default=True)
