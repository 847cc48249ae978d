"""DeepSpeed through accel on the backend under test: ZeRO stages 0-3 at 1 and 2 processes.

Each test runs real DeepSpeed engines in the harness's ranks (gloo on CPU, the backend's collective
elsewhere). The reference is the plain-torch loop of ``_training_utils`` on the whole global batch
with the same gradient clipping DeepSpeed applies (the config's ``gradient_clipping``, which accel
fills with Accelerate's default 1.0 when left "auto").

Tolerance: fp32 ZeRO keeps fp32 master weights and averages gradients with a reduce-scatter
instead of one mean over the global batch, so it reassociates sums like DDP does; after 12 SGD
steps the weights agree with the reference to ~1e-6, inside ``FP32_TOLERANCE`` (1e-4 relative,
1e-5 absolute). A missed reduction, a double-divided loss or an extra step moves them by >1e-2.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from _training_utils import (
    GLOBAL_BATCH,
    LR,
    assert_weights_close,
    fresh_state,
    host_weights,
    make_dataset,
    make_model,
    reference_training,
    same_weights,
)
from accel import Accelerator
from accel.utils import DeepSpeedPlugin, gather_object

pytestmark = pytest.mark.require_deepspeed

EPOCHS = 2
CLIP = 1.0
STAGES = [pytest.param(s, id=f"zero{s}") for s in (0, 1, 2, 3)]


def _prepare(world_size: int, stage: int, **accelerator_kwargs):
    fresh_state()
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=stage, gradient_clipping=CLIP),
                              **accelerator_kwargs)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    loader = DataLoader(make_dataset(), batch_size=GLOBAL_BATCH // world_size)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    return accelerator, model, optimizer, loader


def _train(accelerator, model, optimizer, loader, epochs: int) -> list[float]:
    losses = []
    dtype = next(accelerator.unwrap_model(model).parameters()).dtype
    for _ in range(epochs):
        for x, y in loader:
            loss = F.mse_loss(model(x.to(dtype)).float(), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(float(accelerator.reduce(loss.detach(), reduction="mean")))
    return losses


def _full_weights(accelerator, model) -> dict[str, torch.Tensor]:
    """The full weights on every rank (under ZeRO-3 gathered on rank 0 and shared)."""
    state = {k: v.detach().float().cpu() for k, v in accelerator.get_state_dict(model).items()}
    return gather_object([state])[0]


@pytest.mark.world_size(1, 2)
@pytest.mark.parametrize("stage", STAGES)
def test_zero_training_matches_the_single_process_reference(device, world_size, stage):
    accelerator, model, optimizer, loader = _prepare(world_size, stage)
    assert accelerator.distributed_type == "DEEPSPEED"
    assert accelerator.state.deepspeed_plugin.deepspeed_config["train_micro_batch_size_per_gpu"] == GLOBAL_BATCH // world_size
    assert accelerator.state.deepspeed_plugin.deepspeed_config["train_batch_size"] == GLOBAL_BATCH
    assert type(model).__name__ == "DeepSpeedEngine" and model.zero_optimization_stage() == stage
    losses = _train(accelerator, model, optimizer, loader, EPOCHS)
    expected, _ = reference_training(device, EPOCHS, max_norm=CLIP)
    weights = _full_weights(accelerator, model)
    assert_weights_close(weights, expected, f"ZeRO-{stage} at {world_size} process(es)")
    assert losses[-1] < losses[0] * 0.5, f"the loss did not go down: {losses}"
    everyone = gather_object([weights])
    assert all(same_weights(everyone[0], w) for w in everyone), "ranks ended with different weights"
    accelerator.free_memory()


@pytest.mark.world_size(1, 2)
@pytest.mark.parametrize("stage", [pytest.param(2, id="zero2"), pytest.param(3, id="zero3")])
def test_save_and_load_state_resume_with_identical_losses(device, world_size, stage, tmp_path):
    folder = tmp_path / f"ds_resume_zero{stage}"  # tmp_path is shared by the ranks
    accelerator, model, optimizer, loader = _prepare(world_size, stage)
    _train(accelerator, model, optimizer, loader, 1)
    path = accelerator.save_state(folder)
    first = _train(accelerator, model, optimizer, loader, 1)
    after_first = _full_weights(accelerator, model)
    accelerator.load_state(path)
    second = _train(accelerator, model, optimizer, loader, 1)
    assert second == first, "the resumed run did not repeat the same losses"
    assert same_weights(_full_weights(accelerator, model), after_first)
    manifest = __import__("json").loads((folder / "accel_checkpoint.json").read_text())
    assert manifest["strategy"]["name"] == "deepspeed" and manifest["strategy"]["owns"] == ["models", "optimizers"]
    assert (folder / "pytorch_model").is_dir(), "DeepSpeed's engine checkpoint is missing"
    accelerator.free_memory()


@pytest.mark.world_size(2)
def test_zero3_save_model_writes_the_full_model(device, world_size, rank, tmp_path):
    from safetensors.torch import load_file

    folder = tmp_path / "ds_zero3_model"
    accelerator, model, optimizer, loader = _prepare(world_size, 3)
    _train(accelerator, model, optimizer, loader, 1)
    probe = torch.linspace(-1, 1, 8 * 4).reshape(8, 4).to(device)
    with torch.no_grad():
        expected = model(probe).float().cpu()  # a ZeRO-3 forward is a collective: every rank runs it
    accelerator.save_model(model, folder)  # every rank joins the gather; only rank 0 writes
    accelerator.wait_for_everyone()
    plain = make_model(seed=123)
    plain.load_state_dict(load_file(folder / "model.safetensors"))
    torch.testing.assert_close(plain(probe.cpu()), expected, rtol=1e-5, atol=1e-6)
    accelerator.free_memory()


@pytest.mark.world_size(1, 2)
def test_two_models_with_two_plugins_train_in_one_script(device, world_size):
    fresh_state()
    plugins = {"student": DeepSpeedPlugin(zero_stage=2, gradient_clipping=CLIP),
               "teacher": DeepSpeedPlugin(zero_stage=1, gradient_clipping=CLIP)}
    accelerator = Accelerator(deepspeed_plugins=plugins)
    assert accelerator.state.deepspeed_plugin is plugins["student"]
    loader = DataLoader(make_dataset(), batch_size=GLOBAL_BATCH // world_size)
    student_model = make_model(seed=1)
    student, student_opt, loader = accelerator.prepare(student_model, torch.optim.SGD(student_model.parameters(), lr=LR), loader)
    accelerator.state.select_deepspeed_plugin("teacher")
    assert plugins["teacher"].selected and not plugins["student"].selected
    teacher_model = make_model()
    teacher_opt = torch.optim.SGD(teacher_model.parameters(), lr=LR)
    # the teacher's micro batch comes from this call's loader too
    teacher, teacher_opt, _ = accelerator.prepare(teacher_model, teacher_opt, DataLoader(make_dataset(), batch_size=GLOBAL_BATCH // world_size))
    assert student.zero_optimization_stage() == 2 and teacher.zero_optimization_stage() == 1
    # the teacher trains exactly as the reference does; the student learns from the teacher
    for _ in range(EPOCHS):
        for x, y in loader:
            accelerator.state.select_deepspeed_plugin("teacher")
            loss = F.mse_loss(teacher(x), y)
            accelerator.backward(loss)
            teacher_opt.step()
            teacher_opt.zero_grad()
            accelerator.state.select_deepspeed_plugin("student")
            distill = F.mse_loss(student(x), teacher(x).detach())
            accelerator.backward(distill)
            student_opt.step()
            student_opt.zero_grad()
    expected, _ = reference_training(device, EPOCHS, max_norm=CLIP)
    assert_weights_close(_full_weights(accelerator, teacher), expected, "the teacher (ZeRO-1)")
    student_weights = _full_weights(accelerator, student)
    assert not same_weights(student_weights, host_weights(make_model(seed=1))), "the student never trained"
    accelerator.free_memory()


@pytest.mark.world_size(1, 2)
def test_bf16_runs_through_deepspeed(device, world_size, backend):
    if not backend.supports_bf16_amp:
        pytest.skip(f"bf16 is not supported on {backend.name} [unsupported-dtype]")
    accelerator, model, optimizer, loader = _prepare(world_size, 2, mixed_precision="bf16")
    assert accelerator.mixed_precision == "bf16"
    assert accelerator.state.deepspeed_plugin.deepspeed_config["bf16"]["enabled"] is True
    assert next(accelerator.unwrap_model(model).parameters()).dtype == torch.bfloat16
    losses = _train(accelerator, model, optimizer, loader, EPOCHS)
    expected, _ = reference_training(device, EPOCHS, max_norm=CLIP)
    # bf16 keeps 8 bits of mantissa: weights track the fp32 reference to about 1e-2
    assert_weights_close(_full_weights(accelerator, model), expected, "bf16 ZeRO-2", rtol=3e-2, atol=3e-2)
    assert losses[-1] < losses[0] * 0.5
    accelerator.free_memory()


OFFLOAD = [
    pytest.param(2, {"offload_optimizer": {"device": "cpu"}}, id="zero2-offload-optimizer"),
    pytest.param(3, {"offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}, id="zero3-offload-params"),
]


@pytest.mark.world_size(1, 2)
@pytest.mark.parametrize("stage, offload", OFFLOAD)
def test_cpu_offload_trains_like_the_reference(device, world_size, stage, offload):
    # a torch optimizer on offloaded states: DeepSpeed's CPU Adam is not forced (it needs a C++ build)
    config = {"zero_optimization": {"stage": stage, **offload}, "zero_force_ds_cpu_optimizer": False}
    fresh_state()
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config, gradient_clipping=CLIP))
    assert accelerator.state.deepspeed_plugin.hf_ds_config.is_offload()
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    loader = DataLoader(make_dataset(), batch_size=GLOBAL_BATCH // world_size)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    _train(accelerator, model, optimizer, loader, EPOCHS)
    expected, _ = reference_training(device, EPOCHS, max_norm=CLIP)
    assert_weights_close(_full_weights(accelerator, model), expected, f"ZeRO-{stage} with {sorted(offload)}")
    accelerator.free_memory()
