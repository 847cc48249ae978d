"""PEFT (LoRA) models on the backend under test: training through ``Accelerator``, ``save_state``/``load_state``
round trips, and adapter-only checkpoints of an FSDP2-sharded model (sharded through DCP and full on
rank 0) that hold only the adapter and load back into a fresh model.

LoRA here: rank 2 adapters on both linear layers of the shared tiny MLP (``_training_utils``), the base
frozen. The adapters start non-zero (``init_lora_weights=False``) so that a load that does nothing is
seen. Restored tensors must equal the saved ones exactly (a checkpoint copies, it does not compute).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from _training_utils import GLOBAL_BATCH, LR, fresh_state, make_dataset, make_model, on_backend  # noqa: F401
from accel import Accelerator


@pytest.fixture
def peft():
    """Skips without the peft package (in the test extra); the value is its version (picklable, for the ranks)."""
    return pytest.importorskip("peft", reason="[needs-package] peft is not installed (pip install peft)").__version__


def _lora(seed: int = 0):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    return get_peft_model(make_model(), LoraConfig(r=2, lora_alpha=4, target_modules=["0", "2"], init_lora_weights=False))


def _train(accelerator: Accelerator, model, steps: int = 3):
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR)
    loader = DataLoader(make_dataset(), batch_size=GLOBAL_BATCH // accelerator.num_processes)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for step, (x, y) in enumerate(loader):
        if step == steps:
            break
        accelerator.backward(F.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer


def _adapter(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters() if "lora_" in n}


@pytest.mark.world_size(1)
def test_lora_trains_only_the_adapter_and_save_state_round_trips(device, world_size, rank, peft):
    """Runs in a rank process: a backward in the pytest process would break the host backend's forked ranks."""
    tmp_path = Path(_shared_folder(rank)[0])
    fresh_state()
    accelerator = Accelerator()
    model = _lora()
    base = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    before = _adapter(model)
    model, optimizer = _train(accelerator, model)
    assert all(torch.equal(p.detach().cpu(), base[n]) for n, p in model.named_parameters() if "lora_" not in n), \
        "a frozen base weight moved"
    trained = _adapter(model)
    assert any(not torch.equal(trained[n], before[n]) for n in trained), "the adapter did not train"
    state = accelerator.get_state_dict(model)
    assert any("lora_A" in k for k in state) and any(k.endswith("base_layer.weight") for k in state)

    accelerator.save_state(tmp_path / "state")
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.add_(1.0)
    accelerator.load_state(tmp_path / "state")
    restored = _adapter(model)
    assert all(torch.equal(restored[n], trained[n]) for n in trained), "load_state did not restore the adapter"


def test_adapter_state_of_a_plain_peft_model_round_trips(on_backend, device, peft):
    from accel.strategies.fsdp.peft import get_adapter_state_dict, set_adapter_state_dict

    source, target = _lora(seed=0).to(device), _lora(seed=1).to(device)
    state = get_adapter_state_dict(source)
    assert state and all("lora_" in k for k in state), sorted(state)
    result = set_adapter_state_dict(target, state)
    assert not result.unexpected_keys
    assert all(torch.equal(a, b) for a, b in zip(_adapter(source).values(), _adapter(target).values()))


def _fsdp2_accelerator() -> Accelerator:
    from accel.utils import FullyShardedDataParallelPlugin

    fresh_state()
    return Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))


def _shared_folder(rank: int) -> list[str]:
    """A fresh folder made by rank 0 and known to every rank (removed when the process exits).

    A rank is a multiprocessing child, which ends with ``os._exit`` after multiprocessing's own exit
    handlers: ``atexit`` handlers never run there, a multiprocessing finalizer with an exit priority does."""
    import shutil
    import tempfile
    from multiprocessing import util

    from accel.utils.operations import broadcast_object_list

    folder = [tempfile.mkdtemp(prefix="peft_ckpt_") if rank == 0 else None]
    if rank == 0:
        util.Finalize(None, shutil.rmtree, args=(folder[0], True), exitpriority=10)
    broadcast_object_list(folder, from_process=0)
    return folder


def _full_adapter(model) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    return {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().to("cpu", copy=True)
            for n, p in model.named_parameters() if "lora_" in n}


@pytest.mark.require_fsdp2
@pytest.mark.world_size(2)
@pytest.mark.parametrize("layout", ["sharded", "full"])
def test_fsdp2_adapter_only_checkpoint_holds_the_adapter_and_round_trips(device, world_size, rank, peft, layout):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    from accel.strategies.fsdp.peft import get_adapter_state_dict, set_adapter_state_dict

    folder = _shared_folder(rank)
    target = Path(folder[0]) / "adapter"
    full = layout == "full"
    options = StateDictOptions(full_state_dict=full, cpu_offload=True, broadcast_from_rank0=full)

    accelerator = _fsdp2_accelerator()
    model, _ = _train(accelerator, _lora(seed=0))
    saved = _full_adapter(model)
    state = get_adapter_state_dict(model, options=options)
    if full:
        if rank == 0:
            assert sorted(state) == sorted(saved), "a full adapter state holds exactly the trainable (adapter) tensors"
            torch.save(state, target.with_suffix(".bin"))
    else:
        assert state and all("lora_" in k for k in state), sorted(state)
        dcp.save({"model": state}, checkpoint_id=str(target))
    accelerator.wait_for_everyone()
    if not full:
        stored = dcp.FileSystemReader(str(target)).read_metadata().state_dict_metadata
        assert stored and all(k.startswith("model.") and "lora_" in k for k in stored), sorted(stored)

    accelerator = _fsdp2_accelerator()
    fresh, _ = _train(accelerator, _lora(seed=1), steps=0)
    base_before = {n: v for n, v in _full_base(fresh).items()}
    assert any(not torch.equal(_full_adapter(fresh)[n], saved[n]) for n in saved), "the fresh adapter already matches"
    if full:
        loaded = torch.load(target.with_suffix(".bin"), weights_only=True) if rank == 0 else {}
        set_adapter_state_dict(fresh, loaded, options=options)
    else:
        template = get_adapter_state_dict(fresh, options=options)
        dcp.load({"model": template}, checkpoint_id=str(target))
        set_adapter_state_dict(fresh, template, options=options)
    restored = _full_adapter(fresh)
    assert all(torch.equal(restored[n], saved[n]) for n in saved), f"{layout} adapter checkpoint did not round-trip"
    assert all(torch.equal(v, base_before[n]) for n, v in _full_base(fresh).items()), "loading an adapter changed the base"


def _full_base(model) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    return {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().to("cpu", copy=True)
            for n, p in model.named_parameters() if "lora_" not in n}


@pytest.mark.require_fsdp2
@pytest.mark.world_size(2)
@pytest.mark.parametrize("state_dict_type", ["SHARDED_STATE_DICT", "FULL_STATE_DICT"])
def test_save_fsdp_model_adapter_only_round_trips(device, world_size, rank, peft, state_dict_type):
    """``save_fsdp_model``/``load_fsdp_model(adapter_only=True)`` write and read the adapter alone."""
    import torch.distributed.checkpoint as dcp

    from accel.utils.fsdp_utils import load_fsdp_model, save_fsdp_model

    folder = _shared_folder(rank)
    accelerator = _fsdp2_accelerator()
    accelerator.state.fsdp_plugin.set_state_dict_type(state_dict_type)
    model, _ = _train(accelerator, _lora(seed=0))
    saved = _full_adapter(model)
    plugin = accelerator.state.fsdp_plugin
    save_fsdp_model(plugin, accelerator, model, folder[0], adapter_only=True)
    accelerator.wait_for_everyone()
    if state_dict_type == "FULL_STATE_DICT":
        stored = list(torch.load(Path(folder[0]) / "pytorch_model_fsdp.bin", weights_only=True)) if rank == 0 else ["lora_"]
    else:
        stored = list(dcp.FileSystemReader(str(Path(folder[0]) / "pytorch_model_fsdp_0")).read_metadata().state_dict_metadata)
    assert stored and all("lora_" in k for k in stored), f"the checkpoint holds more than the adapter: {sorted(stored)}"

    accelerator = _fsdp2_accelerator()
    accelerator.state.fsdp_plugin.set_state_dict_type(state_dict_type)
    fresh, _ = _train(accelerator, _lora(seed=1), steps=0)
    base_before = _full_base(fresh)
    assert any(not torch.equal(_full_adapter(fresh)[n], saved[n]) for n in saved), "the fresh adapter already matches"
    load_fsdp_model(accelerator.state.fsdp_plugin, accelerator, fresh, folder[0], adapter_only=True)
    restored = _full_adapter(fresh)
    assert all(torch.equal(restored[n], saved[n]) for n in saved), f"{state_dict_type} adapter_only did not round-trip"
    assert all(torch.equal(v, base_before[n]) for n, v in _full_base(fresh).items()), "loading an adapter changed the base"
