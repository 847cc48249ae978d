"""fp8 training through torchao: Accelerate's layer choice, real or emulated fp8, and one refusal everywhere.

Tolerance (stated here, checked below): over 60 AdamW steps of a 4-layer MLP at one process, the
mean of the last 10 fp8 losses is within 5 % of fp32's and no step's loss is more than 15 % away
(measured here: 1.9 % and 6.8 % with real fp8 GEMMs on CPU, 1.2 % and 6.1 % emulated).
"""

from __future__ import annotations

import pytest
import torch

from accel import Accelerator
from accel.backends import Capability, UnsupportedFeatureError
from accel.state import AcceleratorState, GradientState

torchao = pytest.importorskip("torchao", reason="fp8 training runs through torchao (pip install torchao)")

LAST_MEAN_TOLERANCE = 0.05
STEP_TOLERANCE = 0.15
STEPS = 60


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))


def _train(mixed_precision: str, **accelerator_kwargs) -> tuple[list[float], Accelerator, torch.nn.Module, dict]:
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True, mixed_precision=mixed_precision, **accelerator_kwargs)
    model = _mlp()
    initial = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)  # built before prepare, as users do
    model, optimizer = accelerator.prepare(model, optimizer)
    data = torch.Generator().manual_seed(1)
    x = torch.randn(256, 32, generator=data)
    y = torch.sin(x @ torch.randn(32, 1, generator=data))
    losses = []
    for step in range(STEPS):
        start = (step * 32) % 256
        loss = torch.nn.functional.mse_loss(model(x[start:start + 32]), y[start:start + 32])
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, accelerator, model, initial


@pytest.fixture(scope="module")
def fp32_losses():
    losses, _, _, _ = _train("no")
    AcceleratorState._reset_state(reset_partial_state=True)
    return losses


def _force_emulation(monkeypatch):
    import accel.precision.fp8 as fp8

    monkeypatch.setattr(fp8, "scaled_mm_capability", lambda backend: Capability(False, "torch._scaled_mm fails on cpu (test)"))


@pytest.mark.parametrize("emulated", [False, True], ids=["scaled-mm", "emulated"])
def test_fp8_training_tracks_fp32(emulated, fp32_losses, monkeypatch):
    import accel.precision.fp8 as fp8
    from accel.utils import AORecipeKwargs

    if emulated:
        _force_emulation(monkeypatch)
    elif not fp8.scaled_mm_capability(_cpu()):
        pytest.skip("torch._scaled_mm does not run on this CPU build: only the emulated path can run")
    losses, accelerator, model, initial = _train("fp8", kwargs_handlers=[AORecipeKwargs()])
    expected_label = "fp8 (emulated)" if emulated else "fp8"
    assert accelerator.mixed_precision == "fp8" and accelerator.precision.label == expected_label
    assert f"Mixed precision type: {expected_label}\n" in repr(accelerator.state)
    assert accelerator.precision.fp8.config.emulate is emulated
    converted = [name for name, module in model.named_modules() if type(module).__name__ == "Float8Linear"]
    assert converted == ["2", "4"]
    for name, param in model.named_parameters():  # every layer trained, the converted ones included
        assert not torch.equal(param.detach().to(initial[name].dtype).view(-1), initial[name].view(-1)), name
    tail, reference = sum(losses[-10:]) / 10, sum(fp32_losses[-10:]) / 10
    assert abs(tail - reference) <= LAST_MEAN_TOLERANCE * reference, (tail, reference)
    worst = max(abs(a - b) / b for a, b in zip(losses, fp32_losses))
    assert worst <= STEP_TOLERANCE, worst
    assert tail < 0.6 * losses[0]  # it learned


def _cpu():
    from accel.backends import get_registry

    return get_registry().get("cpu")


def test_layer_choice_is_accelerates():
    theirs = pytest.importorskip("accelerate.utils.ao", reason="the installed Accelerate is the reference").convert_model_to_fp8_ao

    from accel.utils.ao import convert_model_to_fp8_ao

    def model():
        return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Linear(64, 48), torch.nn.Linear(48, 24),
                                   torch.nn.Linear(24, 64), torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))

    ours, reference = model(), model()
    convert_model_to_fp8_ao(ours)
    theirs(reference)
    kinds = [type(m).__name__ for m in ours]
    assert kinds == [type(m).__name__ for m in reference]
    # first and last stay, sizes not multiples of 16 (24) stay
    assert kinds == ["Linear", "Float8Linear", "Linear", "Linear", "Float8Linear", "Linear"]


def test_precision_plan_without_handler_uses_accelerates_defaults(monkeypatch):
    _force_emulation(monkeypatch)
    accelerator = Accelerator(cpu=True, mixed_precision="fp8")
    config = accelerator.precision.fp8.config
    assert config.emulate and config.pad_inner_dim and config.enable_fsdp_float8_all_gather
    assert "torch._scaled_mm fails on cpu (test)" in accelerator.precision.reason
    assert accelerator.precision.dtype == torch.bfloat16  # the other layers run under bf16 autocast, as in Accelerate


def test_recipe_without_fp8_is_an_error():
    from accel.utils import AORecipeKwargs

    with pytest.raises(ValueError, match="fp8 recipes need mixed_precision='fp8'"):
        Accelerator(cpu=True, kwargs_handlers=[AORecipeKwargs()])


# ---------------------------------------------------------------------- one refusal, three entry points
REFUSAL = "fp8 training needs torchao >= 0.6.1, which is not installed (pip install torchao)"


@pytest.fixture
def no_torchao(monkeypatch):
    import accel.utils.imports as imports

    monkeypatch.setattr(imports, "is_torchao_available", lambda: False)


def test_library_refuses_without_torchao(no_torchao):
    with pytest.raises(UnsupportedFeatureError, match="mixed_precision='fp8'") as caught:
        Accelerator(cpu=True, mixed_precision="fp8")
    assert caught.value.reason == REFUSAL


def test_launcher_refuses_before_any_rank_starts(no_torchao, tmp_path, capsys):
    from accel.commands import cli

    marker = tmp_path / "rank_started"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').write('started')\n")
    code = cli.main(["launch", "--cpu", "--num_processes", "2", "--mixed_precision", "fp8", str(script)])
    err = capsys.readouterr().err
    assert code == 2 and REFUSAL in err
    assert not marker.exists()


def test_env_shows_the_same_words(no_torchao):
    from accel.commands.env import collect_environment, render_text

    env = collect_environment(include_deepspeed=False)
    assert env["run_plan"]["fp8"] == {"mode": None, "refused": REFUSAL}
    assert f"refused: {REFUSAL}" in render_text(env)


def test_env_says_emulated_where_torchao_emulates(monkeypatch):
    from accel.commands.env import collect_environment

    _force_emulation(monkeypatch)
    fp8 = collect_environment(include_deepspeed=False)["run_plan"]["fp8"]
    assert fp8["mode"] == "fp8 (emulated)" and "torch._scaled_mm fails on cpu (test)" in fp8["reason"]


def test_missing_fp8_libraries_are_named_in_accelerates_words(monkeypatch):
    import accel.utils.imports as imports
    from accel.precision.fp8 import fp8_refusal
    from accel.utils.launch import launch_env

    monkeypatch.setattr(imports, "is_transformer_engine_available", lambda: False)
    monkeypatch.setattr(imports, "is_msamp_available", lambda: False)
    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "TE")
    words = fp8_refusal()
    assert words.startswith("TransformerEngine is not available. Please install it or use a different backend.")
    assert "`transformer_engine`" in words
    with pytest.raises(ImportError) as caught:  # Accelerate's TERecipeKwargs raises ImportError
        Accelerator(cpu=True, mixed_precision="fp8")
    assert str(caught.value) == words and caught.value.name == "transformer_engine"
    monkeypatch.delenv("ACCELERATE_FP8_BACKEND")
    from types import SimpleNamespace

    with pytest.raises(ValueError, match="MS-AMP was not found on your system.*`msamp`"):
        launch_env(SimpleNamespace(mixed_precision="fp8", fp8_backend="msamp"))


def test_installed_but_unintegrated_fp8_libraries_are_refused_by_name(monkeypatch):
    import accel.utils.imports as imports
    from accel.precision.fp8 import fp8_refusal

    monkeypatch.setattr(imports, "is_transformer_engine_available", lambda: True)
    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "TE")
    words = fp8_refusal()
    assert words.startswith("accel trains fp8 through torchao; the TE fp8 backend (Transformer Engine) is not integrated")
    with pytest.raises(UnsupportedFeatureError) as caught:
        Accelerator(cpu=True, mixed_precision="fp8")
    assert caught.value.reason == words


def test_require_fp8_needs_torchao_as_in_accelerate(no_torchao):
    from accel.test_utils.testing import REQUIREMENTS

    satisfied, reason = REQUIREMENTS["require_fp8"].evaluate()
    assert not satisfied and REFUSAL in reason
