"""accel.strategies.fsdp.peft: adapter-only state dicts of PEFT models (the pieces behind FSDP's ``adapter_only``)."""

import pytest
import torch
import torch.nn as nn

from accel.strategies.fsdp.peft import get_adapter_state_dict, is_peft_model, set_adapter_state_dict, unwrap_peft_model

peft = pytest.importorskip("peft", reason="[needs-package] peft is in the test extra")


def _lora(seed: int):
    torch.manual_seed(seed)
    base = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    return peft.get_peft_model(base, peft.LoraConfig(r=2, target_modules=["0", "2"], init_lora_weights=False))


class _Wrapper(nn.Module):
    """Stands for DDP/FSDP1: the model under ``.module``."""

    def __init__(self, module):
        super().__init__()
        self.module = module


def test_adapter_state_holds_only_the_adapter_and_loads_back():
    source, target = _lora(0), _lora(1)
    state = get_adapter_state_dict(source)
    assert sorted(state) == ["base_model.model.0.lora_A.weight", "base_model.model.0.lora_B.weight",
                             "base_model.model.2.lora_A.weight", "base_model.model.2.lora_B.weight"]
    assert not torch.equal(target.base_model.model[0].lora_A["default"].weight, state["base_model.model.0.lora_A.weight"])
    base_before = target.base_model.model[0].base_layer.weight.clone()
    set_adapter_state_dict(_Wrapper(target), state)
    assert torch.equal(target.base_model.model[0].lora_A["default"].weight, state["base_model.model.0.lora_A.weight"])
    assert torch.equal(target.base_model.model[0].base_layer.weight, base_before), "the base is not in an adapter state"


def test_wrapped_and_plain_models():
    model = _lora(0)
    assert unwrap_peft_model(_Wrapper(_Wrapper(model))) is model and is_peft_model(_Wrapper(model))
    plain = nn.Linear(2, 2)
    assert not is_peft_model(plain) and unwrap_peft_model(plain) is None
    state = get_adapter_state_dict(plain)  # not a PEFT model: its whole state, as Accelerate does
    assert sorted(state) == ["bias", "weight"]
    with pytest.raises(TypeError, match="dict of tensors"):
        set_adapter_state_dict(model, [("a", torch.zeros(1))])


def test_a_full_state_dict_keeps_only_trainable_tensors_under_their_full_names():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    model = _lora(0)
    state = get_adapter_state_dict(model, options=StateDictOptions(full_state_dict=True))
    trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    assert sorted(state) == trainable and all(".default." in k for k in state)
    fresh = _lora(1)
    result = set_adapter_state_dict(fresh, state, options=StateDictOptions(full_state_dict=True))
    assert not result.unexpected_keys
    for name, param in fresh.named_parameters():
        if param.requires_grad:
            assert torch.equal(param, state[name])
