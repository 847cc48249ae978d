"""The Accelerator: training equivalence across process counts, accumulation, precision, wrappers."""

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator
from accel.state import AcceleratorState, GradientState, PartialState
from accel.utils.dataclasses import (
    AutocastKwargs,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    GradientAccumulationPlugin,
    GradScalerKwargs,
)
from dist_utils import run_distributed

GLOBAL_BATCH = 16
LENGTH = 96


def _dataset():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(LENGTH, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(LENGTH, 1, generator=g)
    return TensorDataset(x, y)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def _train(split_batches=False, accumulation=1, epochs=2, mixed_precision="no", handlers=None):
    """Train with a global batch of GLOBAL_BATCH samples per optimizer step; return final weights."""
    accelerator = Accelerator(
        dataloader_config=DataLoaderConfiguration(split_batches=split_batches),
        gradient_accumulation_steps=accumulation,
        mixed_precision=mixed_precision,
        kwargs_handlers=handlers,
    )
    world = accelerator.num_processes
    per_loader = GLOBAL_BATCH // accumulation if split_batches else GLOBAL_BATCH // (world * accumulation)
    model, opt = _model(), None
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    # constant LR so weights compare across process counts; the step count is checked separately
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=1.0)
    loader = DataLoader(_dataset(), batch_size=per_loader)
    model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)
    losses = []
    for _ in range(epochs):
        for x, y in loader:
            with accelerator.accumulate(model):
                loss = F.mse_loss(model(x), y)
                accelerator.backward(loss)
                opt.step()
                sched.step()
                opt.zero_grad()
            losses.append(float(loss.detach()))
    state = accelerator.unwrap_model(model).state_dict()
    return {k: v.detach().clone() for k, v in state.items()}, sched.scheduler.last_epoch


def _close(a, b, tol=1e-5):
    return all(torch.allclose(a[k], b[k], atol=tol, rtol=tol) for k in a)


def test_single_process_matches_hand_written_loop():
    weights, _ = _train()
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=1.0)
    for _ in range(2):
        for x, y in DataLoader(_dataset(), batch_size=GLOBAL_BATCH):
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            sched.step()
            opt.zero_grad()
    assert _close(weights, model.state_dict(), tol=0)  # bitwise: nothing extra happens on one process


def test_gradient_accumulation_matches_larger_batch():
    reference, ref_lr = _train()
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    accumulated, lr = _train(accumulation=4)
    assert _close(reference, accumulated)
    assert lr == ref_lr  # the scheduler stepped once per optimizer step, not per batch


def _multi(split_batches, accumulation):
    weights, lr = _train(split_batches=split_batches, accumulation=accumulation)
    return {k: v.tolist() for k, v in weights.items()}, lr


@pytest.mark.parametrize("world_size", [2, 4])
def test_multi_process_training_matches_single_process(world_size):
    reference, ref_lr = _train()
    for split_batches, accumulation in ((False, 1), (True, 1), (False, 2)):
        results = run_distributed(_multi, world_size, split_batches, accumulation)
        for weights, lr in results:
            weights = {k: torch.tensor(v) for k, v in weights.items()}
            assert _close(reference, weights, tol=1e-5), (world_size, split_batches, accumulation)
        # Accelerate's rule: without split_batches the scheduler steps num_processes times per
        # optimizer step (it was written for one process seeing every batch), with split_batches once
        assert results[0][1] == (ref_lr if split_batches else ref_lr * world_size)


def _dtype_probe(mixed_precision):
    seen = {}
    accelerator = Accelerator(mixed_precision=mixed_precision)

    class Probe(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            out = self.lin(x)
            seen["inner"] = out.dtype
            return out

    model = accelerator.prepare(Probe())
    out = model(torch.ones(2, 4))
    return seen["inner"], out.dtype, accelerator


@pytest.mark.parametrize("precision, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_mixed_precision_really_runs_under_autocast(precision, dtype):
    inner, outer, accelerator = _dtype_probe(precision)
    assert inner == dtype  # the forward really ran in reduced precision
    assert outer == torch.float32  # outputs converted back, as in Accelerate
    assert accelerator.mixed_precision == precision
    assert (accelerator.scaler is not None) == (precision == "fp16")
    with accelerator.autocast():
        assert torch.nn.Linear(2, 2)(torch.ones(1, 2)).dtype == dtype


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains_close_to_fp32(precision):
    reference, _ = _train()
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    # a modest initial loss scale: the default 65536 overflows here and skips the first steps
    reduced, _ = _train(mixed_precision=precision, handlers=[GradScalerKwargs(init_scale=256.0)])
    assert not _close(reference, reduced, tol=0)  # it did run differently
    assert _close(reference, reduced, tol=5e-2)  # and within a stated tolerance of fp32


def test_unsupported_precision_warns_and_records_what_ran(monkeypatch):
    from accel.backends import Capability
    from accel.backends.cpu import CPUBackend
    from accel.precision import MixedPrecisionFallbackWarning

    monkeypatch.setattr(CPUBackend, "amp_capability", lambda self, dtype: Capability(False, "pretend old torch"))
    with pytest.warns(MixedPrecisionFallbackWarning, match="pretend old torch"):
        accelerator = Accelerator(mixed_precision="fp16")
    assert accelerator.mixed_precision == "no"
    assert accelerator.precision.requested == "fp16" and accelerator.precision.fell_back
    assert AcceleratorState().mixed_precision == "no"
    assert accelerator.scaler is None


def test_fp16_scaler_skips_step_on_inf_and_unwrap_restores_forward():
    accelerator = Accelerator(mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=1024.0)])
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = accelerator.prepare(model, opt)
    before = model.weight.detach().clone()
    loss = model(torch.ones(1, 2)).sum() * float("inf")
    accelerator.backward(loss)
    opt.step()
    assert opt.step_was_skipped and accelerator.optimizer_step_was_skipped
    assert torch.equal(model.weight.detach(), before)
    assert accelerator.scaler.get_scale() < 1024.0
    plain = accelerator.unwrap_model(model, keep_fp32_wrapper=False)
    assert plain(torch.ones(1, 2)).dtype == torch.float32
    assert "forward" not in vars(plain)


def test_optimizer_and_zero_grad_wait_while_accumulating():
    accelerator = Accelerator(gradient_accumulation_steps=3)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = accelerator.prepare(model, opt)
    steps_taken = []
    for i in range(6):
        before = model.weight.detach().clone()
        with accelerator.accumulate(model):
            accelerator.backward(model(torch.ones(1, 2)).sum())
            opt.step()
            opt.zero_grad()
        steps_taken.append(not torch.equal(before, model.weight.detach()))
        assert accelerator.sync_gradients == ((i + 1) % 3 == 0)
    assert steps_taken == [False, False, True, False, False, True]


def test_sync_with_dataloader_forces_step_at_end_of_epoch():
    accelerator = Accelerator(gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=4))
    loader = accelerator.prepare(DataLoader(_dataset(), batch_size=16))  # 6 batches: 4 + 2
    model = accelerator.prepare(torch.nn.Linear(4, 1))
    syncs = []
    for x, _ in loader:
        with accelerator.accumulate(model):
            syncs.append(accelerator.sync_gradients)
    assert syncs == [False, False, False, True, False, True]


def test_gather_for_metrics_drops_duplicates_single_process():
    accelerator = Accelerator()
    loader = accelerator.prepare(DataLoader(_dataset(), batch_size=10))
    seen = [accelerator.gather_for_metrics(x) for x, _ in loader]
    assert sum(len(s) for s in seen) == LENGTH


def _metrics_rank():
    accelerator = Accelerator()
    loader = accelerator.prepare(DataLoader(TensorDataset(torch.arange(10).float()), batch_size=2))
    gathered = []
    for (x,) in loader:
        gathered.extend(accelerator.gather_for_metrics(x).tolist())
    objects = []
    for (x,) in loader:
        objects.extend(accelerator.gather_for_metrics([int(v) for v in x], use_gather_object=True))
    if accelerator.process_index == 1:
        accelerator.set_trigger()
    return gathered, objects, accelerator.check_trigger(), accelerator.check_trigger()


@pytest.mark.parametrize("world_size", [2, 4])
def test_gather_for_metrics_and_trigger_across_processes(world_size):
    for gathered, objects, first, second in run_distributed(_metrics_rank, world_size):
        assert sorted(gathered) == [float(i) for i in range(10)]  # evened-out duplicates dropped
        assert sorted(objects) == list(range(10))
        assert first is True and second is False  # the trigger is seen everywhere, then resets


def test_prepare_handles_order_and_passthrough():
    accelerator = Accelerator()
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.Adam(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    sentinel = object()
    sched_p, sentinel_p, opt_p, model_p = accelerator.prepare(sched, sentinel, opt, model)
    assert sentinel_p is sentinel
    assert sched_p.optimizers == [opt_p] and opt_p.optimizer is opt
    # Accelerate's semantics: a prepared object is marked and comes back as it is, registered once
    assert model_p._is_accelerate_prepared and opt_p._is_accelerate_prepared and sched_p._is_accelerate_prepared
    assert accelerator.prepare(model_p) is model_p
    assert accelerator.prepare(opt_p) is opt_p
    assert sum(m is model_p for m in accelerator._models) == 1
    assert len(accelerator._optimizers) == 1 and len(accelerator._schedulers) == 1


def test_kwargs_handlers_validation():
    with pytest.raises(ValueError, match="only one DistributedDataParallelKwargs"):
        Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(), DistributedDataParallelKwargs()])
    with pytest.raises(TypeError, match="unsupported kwargs handler"):
        Accelerator(kwargs_handlers=[object()])
    with pytest.raises(ValueError, match="either gradient_accumulation_steps or"):
        Accelerator(gradient_accumulation_steps=2, gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2))
    AcceleratorState._reset_state(True)
    with pytest.raises(TypeError, match="must be DeepSpeedPlugin objects"):
        Accelerator(deepspeed_plugin=object())


def test_autocast_handler_can_disable():
    accelerator = Accelerator(mixed_precision="bf16")
    with accelerator.autocast(AutocastKwargs(enabled=False)):
        assert torch.nn.Linear(2, 2)(torch.ones(1, 2)).dtype == torch.float32


def test_split_batches_deprecated_argument_still_works():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        accelerator = Accelerator(split_batches=True)
    assert accelerator.split_batches
    assert any(issubclass(w.category, FutureWarning) for w in caught)


def _ddp_rank():
    accelerator = Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
    model = accelerator.prepare(torch.nn.Linear(2, 1))
    from torch.nn.parallel import DistributedDataParallel

    with accelerator.no_sync(model):
        accelerator.backward(model(torch.full((1, 2), float(accelerator.process_index + 1))).sum())
    local = model.module.weight.grad.clone()
    return isinstance(model, DistributedDataParallel), local.tolist(), accelerator.unwrap_model(model) is model.module


def test_ddp_wrapping_and_no_sync():
    results = run_distributed(_ddp_rank, 2)
    assert all(r[0] and r[2] for r in results)
    assert results[0][1] != results[1][1]  # no_sync: each rank kept its own gradient


# ---------------------------------------------------------------- Accelerate semantics
def test_reset_state_errors_name_the_reset():
    state = PartialState()
    with pytest.raises(AttributeError, match="'PartialState' object has no attribute 'nothing'"):
        state.nothing
    PartialState._reset_state()
    with pytest.raises(AttributeError, match=r"`PartialState` object has no attribute `num_processes`.*_reset_state\(\)"):
        state.num_processes
    accelerator = Accelerator()
    with pytest.raises(AttributeError, match="'AcceleratorState' object has no attribute 'nothing'"):
        accelerator.state.nothing
    accelerator.state._reset_state()
    with pytest.raises(AttributeError, match=r"`AcceleratorState` object has no attribute `num_processes`"):
        accelerator.num_processes
    accelerator.state.custom = "kept"
    assert accelerator.state.custom == "kept"


def test_accelerate_torch_device_overrides_the_device(monkeypatch):
    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "cpu:3")
    assert str(Accelerator(cpu=True).device) == "cpu:3"


@pytest.mark.parametrize("keep", [True, False])
def test_unwrap_model_sees_through_compile_and_data_parallel(keep):
    model = torch.nn.Linear(2, 2)
    compiled = torch.compile(torch.nn.DataParallel(model))
    unwrapped = Accelerator().unwrap_model(compiled, keep_torch_compile=keep)
    assert (unwrapped._orig_mod if keep else unwrapped) is model
    assert (unwrapped is compiled) is keep


def test_register_for_checkpointing_names_every_bad_item():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError) as info:
        Accelerator().register_for_checkpointing(torch.ones(1), model, "text")
    message = str(info.value)
    assert "Item at index 0, `Tensor`" in message and "Item at index 2, `str`" in message
    assert "Item at index 1" not in message


def test_stateful_loader_resumes_mid_epoch(tmp_path):
    """Unshuffled, as Accelerate's own test; a shuffled mid-epoch resume draws a new order (also in Accelerate 1.15)."""
    pytest.importorskip("torchdata")
    from accel.utils import DataLoaderConfiguration as Config

    accelerator = Accelerator(dataloader_config=Config(use_stateful_dataloader=True))
    loader = accelerator.prepare(DataLoader(TensorDataset(torch.arange(20.0)), batch_size=2))
    seen = []
    for step, (batch,) in enumerate(loader):
        if step == 2:
            accelerator.save_state(tmp_path / "ck")
        if step >= 3:
            seen.append(batch.tolist())
    accelerator.load_state(tmp_path / "ck")
    assert [batch.tolist() for (batch,) in loader] == seen and seen[0] == [6.0, 7.0]


# ---------------------------------------------------------------- torch.compile through the Accelerator
def test_dynamo_backend_compiles_prepared_models_once():
    from accel.utils.other import is_compiled_module

    accelerator = Accelerator(dynamo_backend="eager")
    assert accelerator.state.dynamo_plugin.backend.value == "EAGER"
    model = accelerator.prepare(torch.nn.Linear(3, 2))
    assert is_compiled_module(model)
    assert accelerator.prepare(model) is model  # prepared already: not compiled twice
    assert accelerator.unwrap_model(model, keep_torch_compile=False).__class__ is torch.nn.Linear


def test_dynamo_backend_and_plugin_together_are_refused():
    from accel.utils import TorchDynamoPlugin

    with pytest.raises(ValueError, match="dynamo_backend or dynamo_plugin, not both"):
        Accelerator(dynamo_backend="eager", dynamo_plugin=TorchDynamoPlugin())


def test_launcher_dynamo_environment_is_honoured(monkeypatch):
    from accel.utils.other import is_compiled_module

    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "AOT_EAGER")
    model = Accelerator().prepare(torch.nn.Linear(3, 2))
    assert is_compiled_module(model)


def test_inductor_trains_like_eager_on_this_backend():
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    compiled = copy.deepcopy(eager)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    accelerator = Accelerator(dynamo_backend="inductor")
    opt = torch.optim.SGD(compiled.parameters(), lr=0.1)
    compiled, opt = accelerator.prepare(compiled, opt)
    ref_opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    for _ in range(3):
        loss = F.mse_loss(compiled(x), y)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        ref = F.mse_loss(eager(x), y)
        ref.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)


def test_profile_writes_a_trace_per_process(tmp_path):
    from accel.utils import ProfileKwargs

    accelerator = Accelerator(kwargs_handlers=[ProfileKwargs(activities=["cpu"], output_trace_dir=str(tmp_path))])
    with accelerator.profile() as prof:
        torch.nn.Linear(4, 4)(torch.ones(2, 4)).sum()
    assert any("addmm" in e.key or "linear" in e.key for e in prof.key_averages())
    assert (tmp_path / "profile_0.json").stat().st_size > 0


def test_fp8_without_torchao_is_a_capability_error_naming_the_reason(monkeypatch):
    import accel.utils.imports as imports
    from accel.backends import UnsupportedFeatureError

    monkeypatch.setattr(imports, "is_torchao_available", lambda: False)  # fp8 itself: tests/lib/precision/test_fp8.py
    with pytest.raises(UnsupportedFeatureError, match="mixed_precision='fp8'.*needs torchao"):
        Accelerator(mixed_precision="fp8")


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(torch.arange(8.0)[:, None])


def _join_rank():
    accelerator = Accelerator()
    model = accelerator.prepare(torch.nn.Linear(1, 1))
    accelerator.prepare(DataLoader(TensorDataset(torch.arange(6.0)[:, None]), batch_size=1),
                        DataLoader(_Stream(), batch_size=1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with accelerator.join_uneven_inputs([model], even_batches=False):
            pass
    sampler = accelerator._dataloaders[0].batch_sampler
    return [str(w.message) for w in caught], sampler.even_batches


def test_join_uneven_inputs_warns_for_iterable_loaders_and_restores_even_batches():
    for messages, even in run_distributed(_join_rank, 2):
        assert any("only supported for map-style datasets" in m for m in messages), messages
        assert even is True  # the override ends with the block


def test_an_accelerator_pickles_with_its_strategy():
    import pickle

    accelerator = Accelerator()
    loader = accelerator.prepare(DataLoader(TensorDataset(torch.arange(4.0)), batch_size=2))
    restored = pickle.loads(pickle.dumps(accelerator))
    # the strategy holds no reference back to its Accelerator, only the values it was handed
    assert not hasattr(restored.strategy, "accelerator") and restored.strategy.state is restored.state
    assert restored.strategy.gradient_state is restored.gradient_state and restored.num_processes == accelerator.num_processes
    assert [b.tolist() for (b,) in pickle.loads(pickle.dumps(loader))] == [[0.0, 1.0], [2.0, 3.0]]


def test_split_between_processes_takes_a_datasets_dataset():
    datasets = pytest.importorskip("datasets")
    from accel.state import _split

    data = datasets.Dataset.from_dict({"x": list(range(5))})
    assert _split(data, 2, 0, False)["x"] == [0, 1, 2]
    assert _split(data, 2, 1, True)["x"] == [3, 4, 4]


def test_prepare_lets_the_strategy_adapt_the_loaders_of_a_call_with_a_model(monkeypatch):
    """Loaders prepared with a model go through the strategy's ``adapt_dataloader`` (DeepSpeed Ulysses shards
    them there); a loader prepared alone does not, and the Accelerator keeps the loader it prepared."""
    accelerator = Accelerator()
    adapted = []
    monkeypatch.setattr(accelerator.strategy, "adapt_dataloader", lambda dl: adapted.append(dl) or ("adapted", dl))
    alone = accelerator.prepare(DataLoader(_dataset(), batch_size=4))
    assert not adapted and alone is accelerator._dataloaders[0]
    _, (tag, inner) = accelerator.prepare(_model(), DataLoader(_dataset(), batch_size=4))
    assert tag == "adapted" and adapted == [inner] and inner is accelerator._dataloaders[1]


def test_sequence_and_context_parallel_helpers_are_no_ops_without_them(caplog):
    import logging

    from accel.logging import MultiProcessAdapter

    accelerator = Accelerator()
    loader = DataLoader(_dataset(), batch_size=4)
    assert accelerator.deepspeed_ulysses_dl_adapter(loader, _model()) is loader
    MultiProcessAdapter.warning_once.cache_clear()
    ran = []
    with caplog.at_level(logging.WARNING, logger="accel.accelerator"):
        with accelerator.maybe_context_parallel(buffers=[torch.zeros(1, 4)], buffer_seq_dims=[1]):
            ran.append(True)
    assert ran == [True]
    assert "Context parallel training is not enabled" in caplog.text
