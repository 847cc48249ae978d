"""Tecorigin SDAA accelerators through the ``torch_sdaa`` extension (collectives: tccl)."""

from __future__ import annotations

from .extension import ExtensionBackend


class SDAABackend(ExtensionBackend):
    """Tecorigin SDAA: ``torch.sdaa`` from torch_sdaa, TCCL collectives, devices chosen by SDAA_VISIBLE_DEVICES."""

    name = "sdaa"
    device_type = "sdaa"
    extension_package = "torch_sdaa"
    install_hint = "install Tecorigin's torch_sdaa with the Teco SDK"
    collective_backend = "tccl"
    accelerate_rng_key = "torch_sdaa_manual_seed"
    visible_devices_env = "SDAA_VISIBLE_DEVICES"
    start_method = "spawn"
    distributed_type = "MULTI_SDAA"
    priority = 5
    oom_messages = ("SDAA out of memory",)
