"""The default launch configuration for a machine, below the CLI (Accelerate's write_basic_config uses it)."""

from __future__ import annotations

import pytest

from accel.facts.network import DEFAULT_PORT
from accel.launch.machine_config import MachineConfigError, default_config, distributed_type_for
from accel.backends import get_backend


def test_the_host_defaults_to_one_process_without_distribution():
    config = default_config(use_cpu=True)
    assert (config.backend, config.use_cpu, config.num_processes, config.distributed_type) == ("cpu", True, 1, "NO")


def test_the_distributed_type_follows_the_process_count():
    assert default_config(use_cpu=True, num_processes=2).distributed_type == "MULTI_CPU"
    assert distributed_type_for(get_backend("cpu"), 1) == "NO"
    assert default_config(use_cpu=True, num_processes=2, distributed_type="FSDP").distributed_type == "FSDP"


def test_several_machines_need_the_main_address_and_get_the_default_port():
    with pytest.raises(MachineConfigError, match="main_process_ip"):
        default_config(use_cpu=True, num_machines=2)
    config = default_config(use_cpu=True, num_machines=2, main_process_ip="10.0.0.1")
    assert config.main_process_port == DEFAULT_PORT and config.num_processes == 2


def test_contradictions_and_unknown_backends_are_named():
    with pytest.raises(MachineConfigError, match="--cpu contradicts backend 'cuda'"):
        default_config(use_cpu=True, backend="cuda")
    with pytest.raises(MachineConfigError, match="no-such-device"):
        default_config(backend="no-such-device")


def test_write_basic_config_uses_it(tmp_path):
    from accel.utils import write_basic_config

    path = write_basic_config(mixed_precision="bf16", save_location=tmp_path / "c.yaml")
    assert "mixed_precision: bf16" in path.read_text()
    assert write_basic_config(save_location=tmp_path / "c.yaml") is False  # never overwrites
