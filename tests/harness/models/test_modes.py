"""The model suite's modes, their gate factors (one table, a device profile's ``models: gates:`` on top)
and what a run keeps for its record."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from accel.backends.profile import ProfileError, load_profile
from accel.facts.model_gates import MODE_GATES, MODE_LABELS, MODEL_MODES, gate_factor_problem
from accel_harness.models.modes import MODES, gate_factors
from accel_harness.models.train import CURVE_POINTS, RunRecord, downsample


def test_the_modes_and_the_gate_table_agree_and_full_precision_keeps_the_strict_gates():
    assert tuple(MODES) == MODEL_MODES == tuple(MODE_LABELS)
    assert {MODES[m].world_size for m in ("ddp", "fsdp2", "zero2", "zero3")} == {2}
    for mode in ("single", "ddp", "fsdp2", "zero2", "zero3", "compile"):
        assert MODE_GATES[mode] == {"quality": 0.99, "steps": 1.05}
    assert all(gate_factor_problem(k, v) is None for gates in MODE_GATES.values() for k, v in gates.items())


def test_each_mode_builds_its_accelerator_arguments():
    backend = SimpleNamespace(compile_backend="my_compiler")
    assert MODES["single"].accelerator_kwargs(backend) == {}
    assert MODES["bf16"].accelerator_kwargs(backend) == {"mixed_precision": "bf16"}
    assert MODES["compile"].accelerator_kwargs(backend) == {"dynamo_backend": "my_compiler"}
    assert MODES["fsdp2"].accelerator_kwargs(backend)["fsdp_plugin"].fsdp_version == 2
    assert MODES["zero3"].accelerator_kwargs(backend)["deepspeed_plugin"].zero_stage == 3


def test_gate_factors_take_a_profiles_override_for_its_mode_only():
    assert gate_factors("bf16") == MODE_GATES["bf16"]
    assert gate_factors("bf16", {"bf16": {"steps": 2.0}}) == {"quality": MODE_GATES["bf16"]["quality"], "steps": 2.0}
    assert gate_factors("single", {"bf16": {"steps": 2.0}}) == MODE_GATES["single"]
    with pytest.raises(ValueError, match="unknown model suite mode 'bf61'"):
        gate_factors("bf61")


@pytest.mark.parametrize("key, value, words", [
    ("quality", 1.5, "in (0, 1]"), ("quality", 0, "in (0, 1]"), ("steps", 0.9, "at least 1"),
    ("steps", float("inf"), "at least 1"), ("steps", True, "expected a number"), ("speed", 1.0, "unknown gate"),
])
def test_a_bad_gate_factor_is_named(key, value, words):
    assert words in gate_factor_problem(key, value)


def _profile(tmp_path, gates: str):
    path = tmp_path / "dev.yaml"
    path.write_text("device: {name: mydev, device_type: cpu}\nmodels:\n  gates:\n" + gates)
    return load_profile(path)


def test_a_profile_sets_gates_per_mode(tmp_path):
    profile = _profile(tmp_path, "    bf16: {steps: 1.4}\n    fp8:\n      quality: 0.95\n      steps: 2\n")
    assert profile.model_gates == {"bf16": {"steps": 1.4}, "fp8": {"quality": 0.95, "steps": 2.0}}
    assert profile.model_gate("bf16", MODE_GATES["bf16"]) == {"quality": MODE_GATES["bf16"]["quality"], "steps": 1.4}
    assert _profile(tmp_path, "    {}\n").model_gates == {}


@pytest.mark.parametrize("gates, key, words", [
    ("    bf16:\n      steps: 0.9\n", "models.gates.bf16.steps", "at least 1"),
    ("    bf16: {quality: 2}\n", "models.gates.bf16.quality", "in (0, 1]"),
    ("    bf61: {steps: 1.2}\n", "models.gates.bf61", "did you mean 'bf16'"),
    ("    bf16: {stpes: 1.2}\n", "models.gates.bf16.stpes", "did you mean 'steps'"),
    ("    bf16: 1.2\n", "models.gates.bf16", "expected a mapping"),
])
def test_a_bad_models_section_is_refused_naming_the_key(tmp_path, gates, key, words):
    with pytest.raises(ProfileError, match="line") as info:
        _profile(tmp_path, gates)
    assert info.value.key == key and words in str(info.value)


def test_a_runs_figures_are_json_ready_and_its_curve_downsampled():
    assert downsample(list(range(10)), 100) == (1, list(range(10)))
    assert downsample(list(range(250)), 100) == (3, list(range(0, 250, 3)))
    with pytest.raises(ValueError, match="points"):
        downsample([1.0], 0)
    run = RunRecord("cnn", "t", "cpu", "bf16", 1, 300, 32, 0.9, losses=[1.0] * 299 + [float("nan")],
                    evals=[(4, 0.5, 0.25)], steps_to_target=None)
    figures = json.loads(json.dumps(run.figures(), allow_nan=False))
    assert figures["mode"] == "bf16" and figures["loss_every"] == 3 and len(figures["losses"]) <= CURVE_POINTS
    assert figures["final_loss"] is None and figures["evals"] == [[4, 0.5, 0.25]]
