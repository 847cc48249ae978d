"""The modules the Accelerator delegates to: the registry of prepared objects, the accumulation rule,
the forwarding properties, and warnings that still point at the user's line after the move."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator
from accel.facade.accumulation import accumulation_block, advance
from accel.facade.preparation import PreparedRegistry, check_checkpointable, kind_of
from accel.facade.uneven_inputs import join_uneven_inputs


def _loader() -> DataLoader:
    return DataLoader(TensorDataset(torch.arange(4.0)), batch_size=2)


def test_kind_of_sorts_what_prepare_handles_and_passes_the_rest():
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    assert [kind_of(o) for o in (model, optimizer, scheduler, _loader(), "text")] == [
        "model", "optimizer", "scheduler", "dataloader", None]


def test_the_registry_records_each_object_once_and_snapshots_a_frozen_copy():
    registry = PreparedRegistry()
    model = torch.nn.Linear(1, 1)
    assert registry.add("model", model) is model and model._is_accelerate_prepared is True
    registry.register(model)  # prepared before: not recorded twice
    registry.register("not preparable")
    assert registry.models == [model] and registry.holds(model) and not registry.holds(torch.nn.Linear(1, 1))
    snapshot = registry.snapshot(scaler="the scaler")
    assert snapshot.models == (model,) and snapshot.scaler == "the scaler"
    registry.clear()
    assert registry.models == [] and snapshot.models == (model,)
    with pytest.raises(ValueError, match="unknown kind of prepared object 'tokenizer'"):
        registry.store("tokenizer")


def test_objects_to_checkpoint_need_both_state_methods():
    check_checkpointable([torch.nn.Linear(1, 1)])
    with pytest.raises(ValueError, match=r"Item at index 1, `object`"):
        check_checkpointable([torch.nn.Linear(1, 1), object()])


def test_the_accelerator_keeps_accelerates_list_names_on_the_registrys_lists():
    accelerator = Accelerator(cpu=True)
    loader = accelerator.prepare(_loader())
    assert accelerator._dataloaders == [loader] and accelerator.prepared_objects().dataloaders == (loader,)
    accelerator.free_memory()
    assert accelerator._dataloaders == [] and accelerator.prepared_objects().dataloaders == ()


def test_advance_syncs_every_num_steps_and_at_the_loaders_end():
    state = SimpleNamespace(sync_with_dataloader=True, end_of_dataloader=False, num_steps=3, sync_gradients=None,
                            sync_each_batch=False)
    seen = []
    step = 0
    for _ in range(4):
        step = advance(step, state)
        seen.append((step, state.sync_gradients))
    assert seen == [(1, False), (2, False), (3, True), (4, False)]
    state.end_of_dataloader = True
    assert advance(step, state) == 0 and state.sync_gradients is True


def test_an_accumulating_block_enters_every_models_no_sync_and_leaves_them_at_its_end():
    events = []

    class Context:
        def __init__(self, name):
            self.name = name

        def __enter__(self):
            events.append(("enter", self.name))

        def __exit__(self, *exc):
            events.append(("exit", self.name))

    state = SimpleNamespace(sync_gradients=False, sync_each_batch=False)
    with accumulation_block(["a", "b"], state, Context):
        events.append("body")
    assert events == [("enter", "a"), ("enter", "b"), "body", ("exit", "b"), ("exit", "a")]
    state.sync_gradients = True
    events.clear()
    with accumulation_block(["a"], state, Context):
        pass
    assert events == []


def test_forwarding_properties_read_through_and_only_the_writable_ones_set():
    accelerator = Accelerator(cpu=True)
    assert accelerator.num_processes == accelerator.state.num_processes
    assert accelerator.mixed_precision == accelerator.precision.used
    assert Accelerator.num_processes.__doc__ == "How many processes take part in the run."
    accelerator.even_batches = False
    assert accelerator.dataloader_config.even_batches is False
    accelerator.sync_gradients = False
    assert accelerator.gradient_state.sync_gradients is False
    with pytest.raises(AttributeError):
        accelerator.num_processes = 3


def test_warnings_moved_out_of_the_accelerator_still_name_the_callers_line(monkeypatch):
    accelerator = Accelerator(cpu=True, dynamo_backend="inductor")
    monkeypatch.setattr(type(accelerator.strategy), "compiles_models", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        accelerator.prepare(torch.nn.Linear(1, 1))
        accelerator.prepare_model(torch.nn.Linear(1, 1))
        with join_uneven_inputs([], "MULTI_GPU", False, []):
            pass
    assert [w.filename for w in caught] == [__file__] * 3, [(w.filename, str(w.message)) for w in caught]
    assert "is ignored" in str(caught[0].message) and "will have no effect" in str(caught[2].message)


@pytest.mark.parametrize("offload_handled", [False, True])
def test_the_quantized_offload_probes_are_names_of_accel_accelerator_that_a_patch_reaches(offload_handled):
    # Accelerate's own suite patches these two names in its accelerator module; the check moved to
    # accel.facade.model_wrappers must still ask them there
    from unittest.mock import patch

    model = torch.nn.Linear(2, 2)
    model.is_loaded_in_8bit = True
    model.hf_device_map = {"": "cpu"}
    accelerator = Accelerator(cpu=True)
    with patch("accel.accelerator.is_bitsandbytes_multi_backend_available", return_value=offload_handled), \
            patch("accel.accelerator.is_xpu_available", return_value=False):
        if offload_handled:
            assert accelerator.prepare_model(model) is not None
        else:
            with pytest.raises(ValueError, match="CPU or disk offload"):
                accelerator.prepare_model(model)
    import accel.accelerator as module

    assert callable(module.is_xpu_available)  # still there once the patches are gone
