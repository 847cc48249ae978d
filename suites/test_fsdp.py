"""FSDP (FSDP2 ``fully_shard`` and FSDP1) and HSDP on the backend under test, against DDP.

Every multi-process test trains the same model on the same data twice inside its ranks: once with
plain DDP (``Accelerator()``) and once sharded. The per-step global loss (mean over ranks) and the
final full weights must agree within ``_training_utils.FP32_TOLERANCE`` (1e-4 relative / 1e-5
absolute): FSDP reduce-scatters the gradient where DDP all-reduces it, which reorders the fp32
sums by a few ULPs per step, while a missed reduction, a wrong shard or an optimizer still
stepping the unsharded parameters moves the loss by 1e-2 or more and fails.

Also checked: each rank really holds only its shard; the sharded (DCP) checkpoint round trip gives
the same continued trajectory; a checkpoint written by 2 ranks resumes on 4 (the harness's 2- and
4-rank pools); ``accel merge-weights`` output loads into a plain module with the same outputs;
HSDP (2 replicas x 2 shards) on 4 ranks.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from _suite_utils import run_in_ranks
from _training_utils import FP32_TOLERANCE, GLOBAL_BATCH, LR, assert_weights_close, fresh_state, make_dataset, make_model
from accel import Accelerator

pytestmark = pytest.mark.require_fsdp2

STEPS = 6  # one epoch of make_dataset() at GLOBAL_BATCH samples per step
#: the first Linear (40 parameters) becomes its own FSDP unit, the rest joins the root unit
MIN_NUM_PARAMS = 10


def _plugin(version: int, **kwargs):
    from accel.utils import FullyShardedDataParallelPlugin

    return FullyShardedDataParallelPlugin(fsdp_version=version, auto_wrap_policy="size_based_wrap",
                                          min_num_params=MIN_NUM_PARAMS, **kwargs)


def _train(world_size: int, plugin=None, parallelism_config=None, steps: int = STEPS):
    """SGD with momentum, GLOBAL_BATCH samples per step over all ranks; returns the per-step global losses."""
    fresh_state()
    accelerator = Accelerator(fsdp_plugin=plugin, parallelism_config=parallelism_config)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)  # created before prepare, as users do
    loader = DataLoader(make_dataset(), batch_size=GLOBAL_BATCH // world_size)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for step, (x, y) in enumerate(loader):
        if step == steps:
            break
        loss = F.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(accelerator.reduce(loss.detach(), reduction="mean")))
    return accelerator, model, optimizer, losses


def _ddp_reference(world_size: int):
    accelerator, model, _, losses = _train(world_size)
    weights = {k: v.detach().cpu() for k, v in accelerator.get_state_dict(model).items()}
    return losses, weights


def _local_numel(model: torch.nn.Module) -> int:
    from torch.distributed.tensor import DTensor

    return sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in model.parameters())


@pytest.mark.world_size(2, 4)
@pytest.mark.parametrize("version", [pytest.param(2, id="fsdp2"), pytest.param(1, id="fsdp1")])
def test_fsdp_loss_trajectory_matches_ddp(device, world_size, rank, version):
    ddp_losses, ddp_weights = _ddp_reference(world_size)
    accelerator, model, optimizer, losses = _train(world_size, _plugin(version))
    assert accelerator.distributed_type == "FSDP" and accelerator.is_fsdp2 == (version == 2)
    total = sum(p.numel() for p in make_model().parameters())
    assert _local_numel(model) < total, f"rank {rank} holds {_local_numel(model)} of {total} parameters: not sharded"
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ddp_losses), **FP32_TOLERANCE,
                               msg=lambda m: f"fsdp{version} vs DDP losses at world size {world_size}: {m}")
    weights = accelerator.get_state_dict(model)  # a collective: every rank calls it, rank 0 receives
    if rank == 0:
        assert_weights_close({k: v.cpu() for k, v in weights.items()}, ddp_weights, f"fsdp{version} final weights")
    else:
        assert weights == {}


@pytest.mark.world_size(4)
def test_hsdp_two_replicas_of_two_shards_matches_ddp(device, world_size, rank):
    from torch.distributed.tensor import Replicate, Shard

    from accel import ParallelismConfig

    ddp_losses, ddp_weights = _ddp_reference(world_size)
    config = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2)
    accelerator, model, _, losses = _train(world_size, _plugin(2), parallelism_config=config)
    mesh = accelerator.torch_device_mesh
    assert mesh.mesh_dim_names == ("dp_replicate", "dp_shard") and tuple(mesh.shape) == (2, 2)
    assert mesh.device_type == device.type
    assert (accelerator.data_parallel_rank, accelerator.data_parallel_shard_rank) == divmod(rank, 2)
    weight = model[0].weight  # FSDP2 shards in place: the prepared model is the user's module
    assert tuple(weight.placements) == (Replicate(), Shard(0)), weight.placements
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ddp_losses), **FP32_TOLERANCE)
    weights = accelerator.get_state_dict(model)
    if rank == 0:
        assert_weights_close({k: v.cpu() for k, v in weights.items()}, ddp_weights, "HSDP final weights")


@pytest.mark.world_size(2)
@pytest.mark.parametrize("version", [pytest.param(2, id="fsdp2"), pytest.param(1, id="fsdp1")])
def test_sharded_checkpoint_round_trip_continues_the_same_trajectory(device, world_size, rank, version, tmp_path_factory):
    from accel.utils.operations import broadcast_object_list

    folder = [str(tmp_path_factory.mktemp("fsdp_ckpt")) if rank == 0 else None]
    broadcast_object_list(folder, from_process=0)
    checkpoint = Path(folder[0]) / "state"
    accelerator, model, optimizer, first = _train(world_size, _plugin(version, state_dict_type="SHARDED_STATE_DICT"), steps=3)
    accelerator.save_state(checkpoint)
    assert (checkpoint / "pytorch_model_fsdp_0" / ".metadata").is_file()
    assert (checkpoint / "optimizer_0" / ".metadata").is_file()
    continued = _continue(accelerator, model, optimizer, world_size)

    # a fresh run: other initial weights, no momentum yet; the checkpoint must bring both back
    fresh_state()
    accelerator = Accelerator(fsdp_plugin=_plugin(version, state_dict_type="SHARDED_STATE_DICT"))
    model = make_model(seed=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    loader = DataLoader(make_dataset(), batch_size=GLOBAL_BATCH // world_size)  # the checkpoint holds its position
    model, optimizer, _ = accelerator.prepare(model, optimizer, loader)
    accelerator.load_state(checkpoint)
    resumed = _continue(accelerator, model, optimizer, world_size)
    torch.testing.assert_close(torch.tensor(resumed), torch.tensor(continued), **FP32_TOLERANCE,
                               msg=lambda m: f"fsdp{version}: resumed vs uninterrupted losses: {m}")


def _continue(accelerator, model, optimizer, world_size, start: int = 3, steps: int = 3) -> list[float]:
    """Steps ``start`` .. ``start + steps - 1`` of the epoch, on this rank's slice of each global batch."""
    x_all, y_all = make_dataset().tensors
    per_rank = GLOBAL_BATCH // world_size
    rank = accelerator.process_index
    losses = []
    for step in range(start, start + steps):
        lo = step * GLOBAL_BATCH + rank * per_rank
        x, y = x_all[lo:lo + per_rank].to(accelerator.device), y_all[lo:lo + per_rank].to(accelerator.device)
        loss = F.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(accelerator.reduce(loss.detach(), reduction="mean")))
    return losses


# ---------------------------------------------------------------------------------------------- 2 -> 4 ranks
_CACHE: dict[str, Path] = {}
PROBE = torch.linspace(-1, 1, 20).reshape(5, 4)


def _reshard_run(seed: int):
    """An FSDP2 run with a sharded state dict, as the 2 -> 4 rank tests train it (no data loader)."""
    fresh_state()
    accelerator = Accelerator(fsdp_plugin=_plugin(2, state_dict_type="SHARDED_STATE_DICT"))
    model = make_model(seed=seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


def _save_on_two_ranks(device, world_size, rank, folder: str) -> None:
    """In 2 ranks: 3 steps, then ``save_state`` (sharded), ``save_model`` (100-byte shards) and, on
    rank 0, ``save.json`` with the probe's outputs and the losses of steps 3-5."""
    accelerator, model, optimizer = _reshard_run(seed=0)
    _continue(accelerator, model, optimizer, world_size, start=0, steps=3)
    accelerator.save_state(os.path.join(folder, "state"))
    accelerator.save_model(model, os.path.join(folder, "model"), max_shard_size="100B")
    with torch.no_grad():
        probe = model(PROBE.to(accelerator.device)).cpu().tolist()
    losses = _continue(accelerator, model, optimizer, world_size)
    if rank == 0:
        with open(os.path.join(folder, "save.json"), "w") as fh:
            json.dump({"world": world_size, "losses": losses, "probe": probe}, fh)


@pytest.fixture
def two_rank_checkpoint(backend, request, tmp_path_factory) -> Path:
    """A sharded checkpoint, a save_model folder and the continued losses of a 2-rank FSDP2 run, made
    once per backend in the harness's 2-rank pool."""
    if backend.name not in _CACHE:
        folder = tmp_path_factory.mktemp(f"fsdp_{backend.name}")
        run_in_ranks(request.config, backend, 2, _save_on_two_ranks, folder=str(folder))
        _CACHE[backend.name] = folder
    return _CACHE[backend.name]


@pytest.mark.world_size(4)
def test_checkpoint_saved_on_two_ranks_resumes_on_four(device, world_size, rank, two_rank_checkpoint):
    folder = two_rank_checkpoint
    shards = sorted(p.name for p in (folder / "state" / "pytorch_model_fsdp_0").glob("*.distcp"))
    assert len(shards) == 2, f"2 ranks should each write a shard file, found {shards}"
    accelerator, model, optimizer = _reshard_run(seed=1)  # other weights, no momentum: the checkpoint brings both
    accelerator.load_state(folder / "state")  # shards reshard from 2 ranks to 4
    losses = _continue(accelerator, model, optimizer, world_size)
    saved = json.loads((folder / "save.json").read_text())
    assert (saved["world"], accelerator.num_processes) == (2, 4)
    # the same global batches (4 ranks x 4 samples = 2 ranks x 8), so the same trajectory within fp32 reordering
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(saved["losses"]), **FP32_TOLERANCE)


@pytest.mark.world_size(1)
def test_merge_weights_output_loads_into_a_plain_module(device, world_size, two_rank_checkpoint, tmp_path):
    """``accel merge-weights`` (its command-line entry point, run in a rank) and ``save_model``'s shards."""
    import contextlib
    import io

    from safetensors.torch import load_file

    from accel.commands.cli import main

    folder = two_rank_checkpoint
    errors = io.StringIO()
    with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
        code = main(["merge-weights", str(folder / "state" / "pytorch_model_fsdp_0"), str(tmp_path / "merged")])
    assert code == 0, errors.getvalue()[-4000:]
    merged = make_model(seed=1)
    merged.load_state_dict(load_file(str(tmp_path / "merged" / "model.safetensors")))

    # save_model wrote the full model, sharded with an index at max_shard_size=100B
    index = json.loads((folder / "model" / "model.safetensors.index.json").read_text())
    saved = make_model(seed=2)
    state = {}
    for name in sorted(set(index["weight_map"].values())):
        state.update(load_file(str(folder / "model" / name)))
    saved.load_state_dict(state)

    expected = torch.tensor(json.loads((folder / "save.json").read_text())["probe"])
    with torch.no_grad():
        torch.testing.assert_close(merged(PROBE), expected, **FP32_TOLERANCE)
        torch.testing.assert_close(saved(PROBE), expected, **FP32_TOLERANCE)
