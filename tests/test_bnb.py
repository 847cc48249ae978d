"""accel.utils.bnb: which modules stay unquantized, and a clear refusal where quantization cannot run."""

import pytest
import torch

from accel.utils.bnb import get_keys_to_not_convert, load_and_quantize_model
from accel.utils.dataclasses import BnbQuantizationConfig


class _Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(4, 3)
        self.body = torch.nn.Linear(3, 3)
        self.head = torch.nn.Linear(3, 4, bias=False)
        self.head.weight = self.emb.weight


def test_tied_head_and_embedding_stay_unquantized():
    assert get_keys_to_not_convert(_Tied()) == ["emb", "head"]


def test_untied_model_keeps_only_its_head():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    assert get_keys_to_not_convert(model) == ["1"]


def test_quantization_is_refused_with_the_reason():
    with pytest.raises(TypeError, match="BnbQuantizationConfig"):
        load_and_quantize_model(torch.nn.Linear(2, 2), {"load_in_8bit": True})
    with pytest.raises((ImportError, NotImplementedError), match="bitsandbytes"):
        load_and_quantize_model(torch.nn.Linear(2, 2), BnbQuantizationConfig(load_in_8bit=True))
