"""Cambricon MLUs through the ``torch_mlu`` extension (collectives: cncl)."""

from __future__ import annotations

import os
from .base import Availability
from .extension import ExtensionBackend

#: makes torch.mlu.is_available() ask the CNDev library instead of initialising the driver
_CNDEV_CHECK = "PYTORCH_CNDEV_BASED_MLU_CHECK"


class MLUBackend(ExtensionBackend):
    """Cambricon MLU: ``torch.mlu`` from torch_mlu, CNCL collectives, devices chosen by MLU_VISIBLE_DEVICES."""

    name = "mlu"
    device_type = "mlu"
    extension_package = "torch_mlu"
    install_hint = "install Cambricon's torch_mlu with the Neuware SDK"
    collective_backend = "cncl"
    accelerate_rng_key = "torch_mlu_manual_seed"
    visible_devices_env = "MLU_VISIBLE_DEVICES"
    start_method = "spawn"
    distributed_type = "MULTI_MLU"
    priority = 4
    oom_messages = ("MLU out of memory",)

    def _probe(self) -> Availability:
        # probe without initialising the driver, so a forked worker can still use the device
        previous = os.environ.get(_CNDEV_CHECK)
        os.environ[_CNDEV_CHECK] = "1"
        try:
            return super()._probe()
        finally:
            if previous is None:
                os.environ.pop(_CNDEV_CHECK, None)
            else:
                os.environ[_CNDEV_CHECK] = previous
