"""Moore Threads GPUs through the ``torch_musa`` extension (collectives: mccl)."""

from __future__ import annotations

from .extension import ExtensionBackend


class MUSABackend(ExtensionBackend):
    """Moore Threads MUSA: ``torch.musa`` from torch_musa, MCCL collectives, devices chosen by MUSA_VISIBLE_DEVICES."""

    name = "musa"
    device_type = "musa"
    extension_package = "torch_musa"
    install_hint = "install Moore Threads' torch_musa with the MUSA toolkit"
    collective_backend = "mccl"
    accelerate_rng_key = "torch_musa_manual_seed"
    visible_devices_env = "MUSA_VISIBLE_DEVICES"
    start_method = "spawn"
    distributed_type = "MULTI_MUSA"
    priority = 6
    oom_messages = ("MUSA out of memory",)
