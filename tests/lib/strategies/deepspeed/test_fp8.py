"""fp8 with DeepSpeed, as Accelerate 1.15 does it: torchao runs (DeepSpeed in bf16, ``Float8Linear`` layers put in
before the engine is built); MS-AMP builds the engine through ``msamp.deepspeed.initialize`` when installed and is
refused naming ``msamp`` when not; Transformer Engine's absence is Accelerate's ImportError.

Training at 2 ranks (ZeRO-2 and ZeRO-3 against fp32) is shown by ``suites/test_fp8_training.py``; here one process.
"""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator
from accel.utils import DeepSpeedPlugin

pytest.importorskip("deepspeed")

_ENV = ("ACCELERATE_USE_DEEPSPEED", "ACCEL_USE_DEEPSPEED", "ACCELERATE_DEEPSPEED_ZERO_STAGE", "ACCELERATE_FP8_BACKEND",
        "ACCEL_FP8_BACKEND", "ACCELERATE_FP8_OPT_LEVEL", "ACCEL_FP8_OPT_LEVEL", "ACCELERATE_MIXED_PRECISION",
        "ACCEL_MIXED_PRECISION", "ACCELERATE_DEEPSPEED_CONFIG_FILE", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS")
_WRITTEN = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "DS_ACCELERATOR")

MSAMP_MISSING = "MS-AMP was not found on your system"
TE_MISSING = "TransformerEngine is not available. Please install it or use a different backend."


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    for name in _WRITTEN:  # a one-process DeepSpeed run writes these; the teardown restores what was there
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    yield
    import torch.distributed as dist

    if dist.is_initialized():
        import deepspeed.comm

        if deepspeed.comm.comm.cdb is not None:
            deepspeed.comm.destroy_process_group()
        else:
            dist.destroy_process_group()


@pytest.fixture
def no_msamp(monkeypatch):
    """msamp is not installed here; make sure a stale fake from another test is not importable either."""
    import accel.utils.imports as imports

    monkeypatch.setattr(imports, "is_msamp_available", lambda: False)
    for name in [n for n in sys.modules if n == "msamp" or n.startswith("msamp.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "msamp", None)  # `import msamp` -> ModuleNotFoundError (name "msamp")


@pytest.fixture
def fake_msamp(tmp_path, monkeypatch):
    """A stand-in msamp package whose DeepSpeed ``initialize`` records its call and builds DeepSpeed's engine."""
    package = tmp_path / "fake_msamp" / "msamp"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "deepspeed.py").write_text(textwrap.dedent("""
        import deepspeed

        calls = []

        def initialize(**kwargs):
            calls.append(kwargs)
            return deepspeed.initialize(**kwargs)
    """))
    monkeypatch.syspath_prepend(str(package.parent))
    for name in [n for n in sys.modules if n == "msamp" or n.startswith("msamp.")]:
        monkeypatch.delitem(sys.modules, name)
    yield package
    for name in [n for n in sys.modules if n == "msamp" or n.startswith("msamp.")]:
        sys.modules.pop(name, None)


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 1))


def _loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(32, 16, generator=g), torch.randn(32, 1, generator=g)), batch_size=8)


def _accelerate_plugin(**kwargs):
    """Accelerate's own DeepSpeedPlugin (the reference), or a skip where Accelerate is not installed."""
    reference = pytest.importorskip("accelerate.utils", reason="the installed Accelerate is the reference")
    return reference.DeepSpeedPlugin(**kwargs)


# ---------------------------------------------------------------------- DeepSpeedPlugin(enable_msamp=True)
def test_enable_msamp_writes_accelerates_msamp_section():
    plugin = DeepSpeedPlugin(zero_stage=2, enable_msamp=True, msamp_opt_level="O2")
    assert plugin.deepspeed_config["msamp"] == {"enabled": True, "opt_level": "O2"}
    assert plugin.deepspeed_config["msamp"] == _accelerate_plugin(zero_stage=2, enable_msamp=True,
                                                                  msamp_opt_level="O2").deepspeed_config["msamp"]


def test_enable_msamp_from_the_fp8_backend_variable(monkeypatch):
    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "MSAMP")
    plugin = DeepSpeedPlugin(zero_stage=1)
    assert plugin.enable_msamp and plugin.deepspeed_config["msamp"] == {"enabled": True, "opt_level": "O1"}


@pytest.mark.parametrize("kwargs, error", [
    ({"zero_stage": 3, "enable_msamp": True}, NotImplementedError),
    ({"zero_stage": 2, "enable_msamp": True, "msamp_opt_level": "O3"}, ValueError),
], ids=["zero3", "opt-level"])
def test_enable_msamp_bad_settings_are_accelerates_errors(kwargs, error):
    with pytest.raises(error) as ours:
        DeepSpeedPlugin(**kwargs)
    with pytest.raises(error) as theirs:
        _accelerate_plugin(**kwargs)
    assert str(ours.value) == str(theirs.value)


def test_enable_msamp_without_msamp_is_a_module_not_found_error_naming_it(no_msamp):
    plugin = DeepSpeedPlugin(zero_stage=2, enable_msamp=True)
    with pytest.raises(ModuleNotFoundError) as caught:  # Accelerate: `from msamp import deepspeed` fails
        Accelerator(mixed_precision="fp8", deepspeed_plugin=plugin)
    assert caught.value.name == "msamp" and "No module named 'msamp'" in str(caught.value)


def test_enable_msamp_builds_the_engine_through_msamp(fake_msamp):
    plugin = DeepSpeedPlugin(zero_stage=2, enable_msamp=True)
    accelerator = Accelerator(mixed_precision="fp8", deepspeed_plugin=plugin)
    assert accelerator.mixed_precision == "fp8" and "MS-AMP" in accelerator.precision.reason
    model = _mlp()
    model, optimizer, loader = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3), _loader())
    import msamp.deepspeed

    assert len(msamp.deepspeed.calls) == 1
    config = msamp.deepspeed.calls[0]["config_params"]
    assert config["msamp"] == {"enabled": True, "opt_level": "O1"} and config["bf16"]["enabled"] is True
    assert type(model).__name__ == "DeepSpeedEngine"
    assert not any(type(m).__name__ == "Float8Linear" for m in model.module.modules())  # MS-AMP's work, not torchao's


# ---------------------------------------------------------------------- mixed_precision="fp8" with DeepSpeed
def test_fp8_with_torchao_under_deepspeed_converts_before_the_engine_and_trains():
    pytest.importorskip("torchao")
    accelerator = Accelerator(mixed_precision="fp8", deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
    config = accelerator.state.deepspeed_plugin.deepspeed_config
    assert config["bf16"]["enabled"] is True and config["fp16"]["enabled"] is False and "msamp" not in config
    assert accelerator.mixed_precision == "fp8"
    assert accelerator.precision.label in ("fp8", "fp8 (emulated)")
    assert not accelerator.precision.fp8.config.enable_fsdp_float8_all_gather  # FSDP2's option, off here
    model = _mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)  # built before prepare
    model, optimizer, loader = accelerator.prepare(model, optimizer, _loader())
    kinds = [type(m).__name__ for m in model.module.modules() if "Linear" in type(m).__name__]
    assert kinds == ["Linear", "Float8Linear", "Linear"]  # first and last kept, as Accelerate's filter does
    before = model.module[2].weight.detach().float().clone()
    for x, y in loader:
        accelerator.backward(torch.nn.functional.mse_loss(model(x.to(torch.bfloat16)).float(), y))
        optimizer.step()
        optimizer.zero_grad()
    assert not torch.equal(before, model.module[2].weight.detach().float()), "the fp8 layer did not train"


def test_fp8_config_enabling_fp16_is_a_contradiction():
    pytest.importorskip("torchao")
    config = {"zero_optimization": {"stage": 2}, "fp16": {"enabled": True}, "train_micro_batch_size_per_gpu": 4}
    with pytest.raises(ValueError, match="fp16.enabled"):
        Accelerator(mixed_precision="fp8", deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config))


def test_fp8_with_transformer_engine_missing_is_accelerates_import_error(monkeypatch):
    import accel.utils.imports as imports

    monkeypatch.setattr(imports, "is_transformer_engine_available", lambda: False)
    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "TE")
    with pytest.raises(ImportError, match=TE_MISSING) as caught:
        Accelerator(mixed_precision="fp8", deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
    assert caught.value.name == "transformer_engine"


# ---------------------------------------------------------------------- the launcher, before any rank starts
@pytest.mark.parametrize("backend, words", [("msamp", MSAMP_MISSING), ("te", TE_MISSING)])
def test_launch_with_a_missing_fp8_library_is_refused_before_ranks_start(backend, words, no_msamp, monkeypatch,
                                                                          tmp_path, capsys):
    import accel.utils.imports as imports
    from accel.commands import cli

    monkeypatch.setattr(imports, "is_transformer_engine_available", lambda: False)
    marker = tmp_path / "rank_started"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').write('started')\n")
    code = cli.main(["launch", "--num_processes", "2", "--use_deepspeed", "--mixed_precision", "fp8",
                     "--fp8_backend", backend, str(script)])
    err = capsys.readouterr().err
    assert code == 2 and words in err, err
    assert not marker.exists()


def test_installed_msamp_is_allowed_under_deepspeed_only(monkeypatch):
    import accel.utils.imports as imports
    from accel.precision.fp8 import fp8_refusal

    monkeypatch.setattr(imports, "is_msamp_available", lambda: True)
    environ = {"ACCELERATE_FP8_BACKEND": "MSAMP"}
    assert fp8_refusal(environ={**environ, "ACCELERATE_USE_DEEPSPEED": "true"}) is None
    assert fp8_refusal(environ=environ, deepspeed=True) is None
    assert "is not integrated outside DeepSpeed" in fp8_refusal(environ=environ)


# ---------------------------------------------------------------------- selecting a plugin (Accelerate's rules)
def test_plugin_selection_follows_accelerate():
    """``select()`` only from the state (ValueError otherwise), ``selected`` read-only (NotImplementedError), as in
    Accelerate; the state's ``select_deepspeed_plugin`` switches the active plugin."""
    ours = DeepSpeedPlugin(zero_stage=2)
    theirs = _accelerate_plugin(zero_stage=2)
    for plugin in (ours, theirs):
        assert plugin.selected is False
        with pytest.raises(ValueError):
            plugin.select()
        with pytest.raises(NotImplementedError):
            plugin.selected = True
        plugin.select(_from_accelerator_state=True)
        assert plugin.selected is True
        plugin._unselect()
        assert plugin.selected is False

    plugins = {"student": DeepSpeedPlugin(zero_stage=2), "teacher": DeepSpeedPlugin(zero_stage=1)}
    accelerator = Accelerator(deepspeed_plugin=plugins)
    assert plugins["student"].selected and not plugins["teacher"].selected
    accelerator.state.select_deepspeed_plugin("teacher")
    assert plugins["teacher"].selected and not plugins["student"].selected
    assert accelerator.state.deepspeed_plugin is plugins["teacher"]
