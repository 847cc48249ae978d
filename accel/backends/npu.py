"""Huawei Ascend NPUs through the ``torch_npu`` extension (collectives: hccl)."""

from __future__ import annotations

from .extension import ExtensionBackend


class NPUBackend(ExtensionBackend):
    """Ascend NPU: ``torch.npu`` from torch_npu, HCCL collectives, devices chosen by ASCEND_RT_VISIBLE_DEVICES."""

    name = "npu"
    device_type = "npu"
    extension_package = "torch_npu"
    install_hint = "pip install torch-npu, with the Ascend CANN toolkit"
    collective_backend = "hccl"
    # Accelerate saves NPU states through torch.cuda (which transfer_to_npu routes to the NPU), under cuda's key
    accelerate_rng_key = "torch_cuda_manual_seed"
    visible_devices_env = "ASCEND_RT_VISIBLE_DEVICES"
    start_method = "spawn"
    distributed_type = "MULTI_NPU"
    # before cuda: torch_npu's transfer_to_npu makes torch.cuda answer for the NPU
    priority = 7
    oom_messages = ("NPU out of memory",)
