"""The strategy is the hub: it holds no reference back to the Accelerator, gets what was prepared as a
frozen value, and checkpointing returns what the Accelerator applies instead of writing into it."""

from __future__ import annotations

import dataclasses
import weakref

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator
from accel.checkpointing import LoadedState, SavedState, load_state, save_state
from accel.state import AcceleratorState, GradientState
from accel.strategies import PreparedObjects, SingleDeviceStrategy, Strategy, StrategyContext


@pytest.fixture(autouse=True)
def fresh_state():
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def _prepared(accelerator: Accelerator):
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    loader = DataLoader(TensorDataset(torch.randn(8, 3), torch.randn(8, 1)), batch_size=2)
    return accelerator.prepare(model, optimizer, loader, scheduler)


def test_the_strategy_contract_is_an_abstract_base_class():
    class Incomplete(Strategy):
        name = "incomplete"

    with pytest.raises(TypeError, match="abstract"):
        Incomplete(None)
    abstract = Strategy.__abstractmethods__
    assert {"distributed_type", "wrap_model", "unwrap_model", "is_wrapped"} <= set(abstract)


def test_no_strategy_keeps_a_reference_to_its_accelerator():
    accelerator = Accelerator(cpu=True)
    _prepared(accelerator)
    strategy = accelerator.strategy
    assert isinstance(strategy, SingleDeviceStrategy) and isinstance(strategy.context, StrategyContext)
    held = [*vars(strategy).values(), *(getattr(strategy.context, f.name) for f in dataclasses.fields(strategy.context))]
    assert not any(isinstance(value, Accelerator) for value in held)
    # and so nothing keeps the Accelerator alive once the user drops it (no cycle, no weak-reference workaround)
    ref = weakref.ref(accelerator)
    del accelerator
    assert ref() is None


def test_prepared_objects_is_a_frozen_snapshot_of_what_was_prepared():
    accelerator = Accelerator(cpu=True, mixed_precision="fp16")
    model, optimizer, loader, scheduler = _prepared(accelerator)
    counter = torch.optim.lr_scheduler.StepLR(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), 1)
    accelerator.register_for_checkpointing(counter)
    prepared = accelerator.prepared_objects()
    assert prepared.models == (model,) and prepared.optimizers == (optimizer,) and prepared.schedulers == (scheduler,)
    assert prepared.dataloaders == (loader,) and prepared.custom_objects == (counter,)
    assert prepared.scaler is accelerator.scaler is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        prepared.models = ()
    accelerator.prepare(torch.nn.Linear(1, 1))
    assert len(prepared.models) == 1 and len(accelerator.prepared_objects().models) == 2


def test_the_strategy_is_handed_the_prepared_objects_for_its_checkpoint(tmp_path, monkeypatch):
    accelerator = Accelerator(cpu=True)
    model, optimizer, _, _ = _prepared(accelerator)
    seen = []
    monkeypatch.setattr(accelerator.strategy, "save_checkpoint",
                        lambda output_dir, prepared, **kwargs: seen.append(prepared))
    accelerator.save_state(tmp_path / "ck")
    assert len(seen) == 1 and seen[0].models == (model,) and seen[0].optimizers == (optimizer,)


def test_save_and_load_state_return_what_the_accelerator_applies(tmp_path):
    accelerator = Accelerator(cpu=True, project_dir=str(tmp_path))
    accelerator.project_configuration.automatic_checkpoint_naming = True
    _prepared(accelerator)
    accelerator.step = 7
    saved = save_state(accelerator, accelerator.prepared_objects())
    assert isinstance(saved, SavedState) and saved.iteration == 1
    assert accelerator.project_configuration.iteration == 0  # checkpointing wrote nothing into the Accelerator
    accelerator.step = 0
    loaded = load_state(accelerator, accelerator.prepared_objects())
    assert isinstance(loaded, LoadedState) and loaded.step == 7 and loaded.iteration == 1
    assert accelerator.step == 0 and accelerator.project_configuration.iteration == 0
    # through the Accelerator, the returned values are applied
    accelerator.load_state()
    assert accelerator.step == 7 and accelerator.project_configuration.iteration == 1
    assert accelerator.save_state().endswith("checkpoint_1") and accelerator.project_configuration.iteration == 2


def test_without_deepspeed_there_is_no_engine_wrapper():
    accelerator = Accelerator(cpu=True)
    assert accelerator.deepspeed_engine_wrapped is None and accelerator.strategy.engine_wrapper is None


def test_a_step_reads_no_accelerator_attribute_through_the_strategy():
    """The hot path: the strategy's backward uses the values it was built with."""
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model, optimizer, _, _ = _prepared(accelerator)
    strategy = accelerator.strategy
    assert strategy.precision is accelerator.precision and strategy.gradient_state is accelerator.gradient_state
    assert strategy.device == accelerator.device and strategy.backend is accelerator.backend
    x = torch.ones(2, 3)
    with accelerator.accumulate(model):  # first of two: no sync, the loss is halved
        accelerator.backward(model(x).sum())
    grad = model.weight.grad.clone()
    assert torch.allclose(grad, torch.full_like(grad, 1.0))  # 2 rows of ones, halved
    assert not accelerator.sync_gradients
    with accelerator.accumulate(model):
        accelerator.backward(model(x).sum())
    assert accelerator.sync_gradients and torch.allclose(model.weight.grad, 2 * grad)


def test_a_strategy_built_by_hand_needs_only_a_context():
    accelerator = Accelerator(cpu=True)
    context = StrategyContext(state=accelerator.state, gradient_state=accelerator.gradient_state,
                              precision=accelerator.precision)
    strategy = SingleDeviceStrategy(context)
    model = torch.nn.Linear(2, 2)
    (prepared,), (opt,), _ = strategy.prepare([model], [torch.optim.SGD(model.parameters(), lr=1.0)], [],
                                              model_placement=[True], optimizer_placement=[True],
                                              prepared=PreparedObjects())
    assert prepared is model and opt.optimizer.param_groups[0]["params"][0] is model.weight
