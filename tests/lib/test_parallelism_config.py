"""ParallelismConfig: sizes from arguments and PARALLELISM_CONFIG_*, Accelerate's validation messages, the DeviceMesh
built on the backend's device type (real gloo ranks), and the check against the run's process count."""

from __future__ import annotations

import pytest

from accel import ParallelismConfig
from dist_utils import run_distributed


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    import os

    for name in list(os.environ):
        if name.startswith(("PARALLELISM_CONFIG_", "FSDP_")) or name in ("ACCELERATE_USE_FSDP", "ACCEL_USE_FSDP"):
            monkeypatch.delenv(name)


def test_defaults_and_derived_sizes():
    config = ParallelismConfig(dp_replicate_size=2, dp_shard_size=3, tp_size=2)
    assert (config.cp_size, config.sp_size, config.cp_backend, config.sp_backend) == (1, 1, "torch", "deepspeed")
    assert config.total_size == 12 and config.data_parallel_size == 6 and config.non_data_parallel_size == 2
    assert config.dp_dim_names == ["dp_replicate", "dp_shard"] and config.non_dp_dim_names == ["tp"]
    assert config.fsdp_dim_names == ["dp_replicate", "dp_shard_cp"] and config.dp_shard_cp_dim_names == ["dp_shard"]
    assert config._get_mesh() == (("dp_replicate", "dp_shard", "tp"), (2, 3, 2))
    assert config.tp_handler is not None and config.cp_handler is None
    assert ParallelismConfig()._get_mesh() == ()
    assert "total_size=12" in repr(config)


def test_sizes_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("PARALLELISM_CONFIG_DP_REPLICATE_SIZE", "2")
    monkeypatch.setenv("PARALLELISM_CONFIG_DP_SHARD_SIZE", "4")
    monkeypatch.setenv("PARALLELISM_CONFIG_CP_SIZE", "2")
    monkeypatch.setenv("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "alltoall")
    config = ParallelismConfig()
    assert (config.dp_replicate_size, config.dp_shard_size, config.cp_size) == (2, 4, 2)
    assert config.cp_handler.cp_comm_strategy == "alltoall"
    assert config._get_mesh() == (("dp_replicate", "dp_shard", "cp"), (2, 4, 2))
    monkeypatch.setenv("PARALLELISM_CONFIG_TP_SIZE", "two")
    with pytest.raises(ValueError, match="PARALLELISM_CONFIG_TP_SIZE must be an integer"):
        ParallelismConfig()


@pytest.mark.parametrize("kwargs, message", [
    ({"dp_shard_size": 0}, "dp_shard_size must be at least 1, but got 0"),
    ({"tp_size": -1}, "tp_size must be at least 1, but got -1"),
    ({"cp_backend": "ring"}, "cp_backend must be one of \\['torch'\\], but got ring"),
    ({"sp_backend": "ulysses"}, "sp_backend must be one of \\['deepspeed'\\], but got ulysses"),
    ({"cp_size": 2, "sp_size": 2}, "mutually exclusive"),
    ({"dp_replicate_size": 2, "tp_size": 2}, "cannot be used with pure data parallelism"),
])
def test_accelerate_validation_messages(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ParallelismConfig(**kwargs)


def _mesh_on_ranks():
    import torch

    from accel.backends import get_backend

    config = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2)
    mesh = config.get_device_mesh()  # no device type given: the active backend's
    same = config.get_device_mesh() is mesh
    flat = {name: mesh[name].size() for name in ("dp", "dp_shard_cp", "dp_cp")}
    group = mesh["dp_shard"].get_group()
    value = torch.tensor([float(torch.distributed.get_rank())])
    torch.distributed.all_reduce(value, group=group)
    wrong = None
    try:
        config.get_device_mesh("meta")
    except ValueError as exc:
        wrong = str(exc)
    return (mesh.device_type == get_backend().device_type, mesh.mesh_dim_names, tuple(mesh.shape), same, flat,
            value.item(), mesh.get_local_rank("dp_replicate"), wrong)


def test_mesh_is_built_on_the_backend_device_type_with_joint_dimensions():
    results = run_distributed(_mesh_on_ranks, 4)
    for rank, (on_backend, names, shape, same, flat, shard_sum, replica, wrong) in enumerate(results):
        assert on_backend and names == ("dp_replicate", "dp_shard") and shape == (2, 2) and same
        assert flat == {"dp": 4, "dp_shard_cp": 2, "dp_cp": 4}
        assert shard_sum == {0: 1, 1: 1, 2: 5, 3: 5}[rank]  # the shard groups are {0, 1} and {2, 3}
        assert replica == rank // 2
        assert "already created with device type" in wrong


def _accelerator_with(config_kwargs, plugin_version):
    from accel import Accelerator
    from accel.utils import FullyShardedDataParallelPlugin

    try:
        Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=plugin_version),
                    parallelism_config=ParallelismConfig(**config_kwargs))
    except ValueError as exc:
        return str(exc)
    return None


def test_sizes_that_do_not_multiply_to_the_world_size_are_refused():
    message = run_distributed(_accelerator_with, 2, {"dp_shard_size": 4}, 2)[0]
    assert message.startswith("ParallelismConfig total_size (4) does not match num_processes (2)")


def test_fsdp_without_a_shard_dimension_is_refused():
    message = run_distributed(_accelerator_with, 2, {"dp_replicate_size": 2}, 2)[0]
    assert "no dimension for FSDP to shard across" in message


def test_meshes_need_fsdp2():
    message = run_distributed(_accelerator_with, 2, {"dp_shard_size": 2}, 1)[0]
    assert "needs FSDP2" in message


def test_a_mesh_that_does_not_fit_the_process_count_is_refused_at_construction():
    from accel import Accelerator
    from accel.parallelism_config import ParallelismConfig

    with pytest.raises(ValueError, match=r"total_size \(2\) does not match num_processes \(1\)"):
        Accelerator(parallelism_config=ParallelismConfig(tp_size=2))
