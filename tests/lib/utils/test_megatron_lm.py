"""Megatron-LM: the refusal names exactly what is missing (package parts, CUDA, the engine)."""

import pytest

from accel.utils import megatron_lm


def test_the_refusal_names_each_missing_part():
    error = megatron_lm.megatron_lm_refusal()
    assert isinstance(error, NotImplementedError)
    text = str(error)
    assert "megatron.training" in text and "Megatron-LM repository" in text
    assert "CUDA" in text and "engine" in text


def test_missing_core_is_named_with_its_install_command(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name.startswith("megatron") else real(name, *a))
    assert megatron_lm.megatron_lm_missing()[0] == "megatron.core: pip install megatron-core"


def test_the_train_step_classes_use_the_same_reason():
    step = megatron_lm.GPTTrainStep.__new__(megatron_lm.GPTTrainStep)
    with pytest.raises(RuntimeError, match="GPTTrainStep drives Megatron-LM training.*megatron.training"):
        step.__init__(None, None)
