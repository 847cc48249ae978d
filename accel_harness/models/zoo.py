"""The model zoo: small real architectures built from configurations, never downloaded.

Why: a backend that runs a two-layer MLP can still break a real model: rotary embeddings,
grouped-query attention, RMSNorm/LayerNorm, tied embeddings, relative attention buckets, expert
routing, dropout. Each entry here is a real transformers architecture (built with its own config
class and random weights from a fixed seed) or a small convolutional network in torch, sized so
that it learns its task in tens of steps on a CPU while attention, normalisation, embeddings,
dropout and the loss all take part.

:data:`MODELS` is the one table: name -> :class:`ModelSpec` (family, task, builder, the global
batch and step budget, the learning rate, the accuracy target, and whether it is in the quick set
that ``pytest suites -m models`` runs by default; the rest run with ``RUN_SLOW=1``). A builder
takes the task's sizes and the dropout probability and returns a module whose
``forward(**batch)`` returns an object with ``loss`` and ``logits`` (transformers' output classes;
:class:`SmallCNN` mimics them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import torch
from torch import nn

from .tasks import TASKS

__all__ = ["MODELS", "CNNOutput", "ModelSpec", "SmallCNN", "build_model", "quick_models"]

#: every transformer in the zoo: width, depth and heads (small enough for CPU, big enough to matter)
HIDDEN, LAYERS, HEADS, FFN = 64, 2, 4, 128
DROPOUT = 0.1
MAX_POSITIONS = 64


@dataclass(frozen=True)
class ModelSpec:
    """One zoo entry."""

    name: str
    family: str
    task: str
    build: Callable[[dict[str, int], float], nn.Module]
    #: optimizer steps the run may take, the global batch per step, the AdamW learning rate
    steps: int
    batch: int
    lr: float
    #: evaluation accuracy that counts as "learned" (the task's optimum is 1.0)
    target: float
    quick: bool = False
    #: the step from which the learning rate falls linearly to zero at the last step (None: constant). A
    #: row that ends while its accuracy still swings (t5, vit) settles onto its plateau, so the quality gate
    #: compares two converged runs instead of two points of a noisy curve
    decay_from: int | None = None
    notes: str = ""
    #: ``needs``: the transformers class the row needs; ``untuned``: why the row does not learn yet
    extra: dict[str, Any] = field(default_factory=dict)


def _llama(sizes: dict[str, int], dropout: float) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=sizes["vocab"], hidden_size=HIDDEN, intermediate_size=FFN,
                         num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=HEADS // 2,
                         max_position_embeddings=MAX_POSITIONS, attention_dropout=dropout,
                         pad_token_id=0, bos_token_id=1, eos_token_id=1)
    return LlamaForCausalLM(config)


def _gpt2(sizes: dict[str, int], dropout: float) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=sizes["vocab"], n_positions=MAX_POSITIONS, n_embd=HIDDEN, n_layer=LAYERS,
                        n_head=HEADS, n_inner=FFN, resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
                        bos_token_id=1, eos_token_id=1)
    return GPT2LMHeadModel(config)


def _bert(sizes: dict[str, int], dropout: float) -> nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=sizes["vocab"], hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                        num_attention_heads=HEADS, intermediate_size=FFN, max_position_embeddings=MAX_POSITIONS,
                        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
                        num_labels=sizes["classes"], pad_token_id=0)
    return BertForSequenceClassification(config)


def _vit(sizes: dict[str, int], dropout: float) -> nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(image_size=sizes["image_size"], patch_size=4, num_channels=sizes["channels"],
                       hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                       intermediate_size=FFN, hidden_dropout_prob=dropout, attention_probs_dropout_prob=0.0,
                       num_labels=sizes["classes"])
    return ViTForImageClassification(config)


def _t5(sizes: dict[str, int], dropout: float) -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(vocab_size=sizes["vocab"], d_model=HIDDEN, d_kv=HIDDEN // HEADS, d_ff=FFN,
                      num_layers=LAYERS, num_decoder_layers=LAYERS, num_heads=HEADS, dropout_rate=dropout,
                      relative_attention_num_buckets=16, relative_attention_max_distance=16, pad_token_id=0, decoder_start_token_id=0, eos_token_id=1)
    return T5ForConditionalGeneration(config)


def _mixtral(sizes: dict[str, int], dropout: float) -> nn.Module:
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(vocab_size=sizes["vocab"], hidden_size=HIDDEN, intermediate_size=FFN,
                           num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=HEADS // 2,
                           max_position_embeddings=MAX_POSITIONS, num_local_experts=4, num_experts_per_tok=2,
                           output_router_logits=True, router_aux_loss_coef=0.01, attention_dropout=dropout,
                           pad_token_id=0, bos_token_id=1, eos_token_id=1)
    return MixtralForCausalLM(config)


class CNNOutput(NamedTuple):
    """The CNN's output: ``loss`` (None without labels) and ``logits``. A named tuple, not a plain
    namespace: torch's pytree walks it (as it does transformers' output classes), so FSDP2 finds the
    tensors to hook its backward onto; a namespace hid them and a root-only FSDP2 never reduced the
    gradients."""

    loss: torch.Tensor | None
    logits: torch.Tensor


class SmallCNN(nn.Module):
    """Two conv blocks (conv, batch norm, ReLU, pooling), dropout and a linear head.

    ``forward(pixel_values, labels=None)`` returns ``loss`` and ``logits`` as transformers' image
    classifiers do, so one training loop serves the whole zoo. Batch norm keeps running statistics
    (buffers DDP broadcasts), a part of training the transformers here do not exercise."""

    def __init__(self, channels: int, classes: int, width: int = 16, dropout: float = 0.1):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(dropout), nn.Linear(8 * width, classes))

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor | None = None) -> CNNOutput:
        logits = self.head(self.features(pixel_values))
        loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return CNNOutput(loss, logits)


def _cnn(sizes: dict[str, int], dropout: float) -> nn.Module:
    return SmallCNN(sizes["channels"], sizes["classes"], dropout=dropout)


def _has(name: str) -> bool:
    try:
        import transformers

        return hasattr(transformers, name)
    except ImportError:  # the harness runs without transformers; the zoo then has only the CNN
        return False


def _table() -> dict[str, ModelSpec]:
    rows = [
        ModelSpec("llama", "decoder LM (rotary, grouped-query attention, RMSNorm)", "copy", _llama,
                  steps=60, batch=32, lr=3e-3, target=0.9, quick=True, extra={"needs": "LlamaConfig"}),
        ModelSpec("gpt2", "decoder LM (learned positions, LayerNorm, tied embeddings)", "reverse", _gpt2,
                  steps=160, batch=32, lr=3e-3, target=0.9, extra={"needs": "GPT2Config"}),
        ModelSpec("bert", "encoder, sequence classification", "majority", _bert,
                  steps=160, batch=32, lr=2e-3, target=0.9, extra={"needs": "BertConfig"}),
        ModelSpec("vit", "vision transformer, image classification", "pattern-images", _vit,
                  steps=80, batch=32, lr=7e-4, target=0.9, quick=True, decay_from=56, extra={"needs": "ViTConfig"}),
        ModelSpec("t5", "encoder-decoder (relative attention buckets)", "copy-seq2seq", _t5,
                  steps=360, batch=128, lr=3e-3, target=0.9, decay_from=240, extra={"needs": "T5Config"}),
        ModelSpec("mixtral", "mixture of experts decoder (top-2 of 4 experts, router loss)", "copy", _mixtral,
                  steps=120, batch=32, lr=3e-3, target=0.9, extra={"needs": "MixtralConfig"}),
        ModelSpec("cnn", "convolutional network (batch norm, pooling)", "pattern-images", _cnn,
                  steps=48, batch=32, lr=3e-3, target=0.98, quick=True),
    ]
    return {row.name: row for row in rows if "needs" not in row.extra or _has(row.extra["needs"])}


#: model name -> spec (rows whose transformers class is not installed are left out)
MODELS: dict[str, ModelSpec] = _table()


def quick_models() -> list[str]:
    """The models of the quick set, in table order."""
    return [name for name, spec in MODELS.items() if spec.quick]


def build_model(name: str, seed: int = 0, dropout: float = DROPOUT) -> nn.Module:
    """The zoo model ``name`` with random weights from ``seed`` (fp32, on the host, train mode),
    every dropout probability set to ``dropout``.

    transformers initialises from the global RNG, so the global RNG is seeded here and restored
    afterwards: building a model leaves the caller's random stream as it was."""
    spec = MODELS[name]
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = spec.build(TASKS[spec.task].sizes, dropout)
    finally:
        torch.random.set_rng_state(state)
    return model.float().train()
