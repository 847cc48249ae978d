"""Deterministic learnable tasks with a known optimum, built on the host from a seed.

Why: a model qualification must catch a backend on which a model *does not learn*, not only one
that crashes. Every task here has a known optimum (accuracy 1.0: the answer is a fixed function of
the input) and is small enough to be learned in tens of steps on a CPU, so "the reference reached
its target and the run under test did not (or did so later)" is a meaningful verdict.

A task makes a :class:`TaskData` (a training split and an evaluation split, each a dict of host
tensors with the same first dimension) from a seed; the same seed gives bitwise the same tensors
on every machine, so every backend, rank and world size trains on the same numbers. What a model
is asked is in the keys: ``input_ids``/``labels`` for language models, ``pixel_values``/``labels``
for image models; ``labels`` of ``IGNORE`` (-100, the value transformers' losses skip) mark
positions that are not scored. Every sample scores the same number of positions, so the mean loss
of a global batch equals the mean of its per-rank means (DDP's average) exactly.

The kinds (how logits line up with labels, see :func:`correct_and_count`):

* ``causal``: a decoder LM; the logits at position ``t`` predict the label at ``t + 1``;
* ``seq2seq``: an encoder-decoder; the decoder's logits at ``t`` predict the label at ``t``;
* ``classify``: one label per sample (sequence or image classification).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

__all__ = ["IGNORE", "TASKS", "TaskData", "TaskSpec", "correct_and_count", "make_task"]

#: the label value transformers' cross-entropy ignores
IGNORE = -100
#: token ids below this are reserved (0: padding/decoder start, 1: separator)
PAD, SEP, FIRST_SYMBOL = 0, 1, 2


@dataclass(frozen=True)
class TaskData:
    """A task's training and evaluation splits (host tensors) and how its logits are scored."""

    name: str
    kind: str
    train: dict[str, torch.Tensor]
    eval: dict[str, torch.Tensor]

    def train_size(self) -> int:
        return len(self.train["labels"])


@dataclass(frozen=True)
class TaskSpec:
    """One task: its name, kind, what it asks, and the builder ``(n, generator) -> tensors``."""

    name: str
    kind: str
    what: str
    build: Callable[[int, torch.Generator], dict[str, torch.Tensor]]
    #: the vocabulary (token tasks) or the image side and class count (image tasks)
    sizes: dict[str, int]


# ---------------------------------------------------------------------------- token tasks
SYMBOLS = 8          # distinct symbols in a sequence (ids FIRST_SYMBOL .. FIRST_SYMBOL + SYMBOLS - 1)
VOCAB = FIRST_SYMBOL + SYMBOLS
LENGTH = 6           # symbols per copy/reverse sequence
#: symbols per encoder-decoder sequence: shorter, because an encoder-decoder must learn where each answer
#: symbol sits from relative position biases alone (cross-attention carries no position), which at six
#: symbols took T5 hundreds of steps more than the decoder-only rows (docs/models.md, t5)
SEQ2SEQ_LENGTH = 4
MODULUS = 11         # modular addition: a + b mod MODULUS


def _symbols(n: int, g: torch.Generator, length: int = LENGTH) -> torch.Tensor:
    return torch.randint(FIRST_SYMBOL, FIRST_SYMBOL + SYMBOLS, (n, length), generator=g)


def _causal(prompt: torch.Tensor, answer: torch.Tensor) -> dict[str, torch.Tensor]:
    """``prompt SEP answer`` as one sequence; only the answer's tokens are scored."""
    sep = torch.full((len(prompt), 1), SEP, dtype=torch.long)
    ids = torch.cat([prompt, sep, answer], dim=1)
    labels = ids.clone()
    labels[:, : prompt.shape[1] + 1] = IGNORE
    return {"input_ids": ids, "labels": labels}


def _copy_lm(n: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    x = _symbols(n, g)
    return _causal(x, x)


def _reverse_lm(n: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    x = _symbols(n, g)
    return _causal(x, x.flip(1))


def _modular_addition_lm(n: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    """``a b SEP c`` with c = (a + b) mod MODULUS; numbers are tokens FIRST_SYMBOL + value."""
    ab = torch.randint(0, MODULUS, (n, 2), generator=g)
    c = ab.sum(dim=1, keepdim=True) % MODULUS
    return _causal(ab + FIRST_SYMBOL, c + FIRST_SYMBOL)


def _reverse_seq2seq(n: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    """The encoder reads ``x``, the decoder writes ``x`` reversed (every decoder position scored)."""
    x = _symbols(n, g, length=SEQ2SEQ_LENGTH)
    return {"input_ids": x, "labels": x.flip(1).clone()}


def _copy_seq2seq(n: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    x = _symbols(n, g, length=SEQ2SEQ_LENGTH)
    return {"input_ids": x, "labels": x.clone()}


def _majority_classify(n: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    """Label 1 when most of the (odd number of) symbols are in the upper half of the alphabet.

    Each sample carries a leading SEP (a [CLS]-like slot the classifier's pooler reads)."""
    x = _symbols(n, g, length=2 * LENGTH + 1)
    upper = (x >= FIRST_SYMBOL + SYMBOLS // 2).sum(dim=1)
    labels = (2 * upper > x.shape[1]).long()
    ids = torch.cat([torch.full((n, 1), SEP, dtype=torch.long), x], dim=1)
    return {"input_ids": ids, "labels": labels}


# ---------------------------------------------------------------------------- image task
IMAGE_SIZE = 16
CHANNELS = 3
IMAGE_CLASSES = 4
NOISE = 0.6


def _pattern_images(n: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    """Noisy images of one of four stripe patterns; the class is the pattern.

    Horizontal stripes, vertical stripes, a checkerboard, diagonal stripes, each with a random
    phase, period (2 or 4 pixels) and colour mix under Gaussian noise: every patch shows its
    class, so the optimum is 1.0, yet the noise makes the model average over the image."""
    labels = torch.randint(0, IMAGE_CLASSES, (n,), generator=g)
    period = 2 * torch.randint(1, 3, (n, 1, 1), generator=g)
    phase = torch.randint(0, 4, (n, 1, 1), generator=g)
    rows = torch.arange(IMAGE_SIZE).view(1, -1, 1)
    cols = torch.arange(IMAGE_SIZE).view(1, 1, -1)
    h = ((rows + phase) // (period // 2)) % 2
    v = ((cols + phase) // (period // 2)) % 2
    stacked = torch.stack([h.expand(n, -1, IMAGE_SIZE), v.expand(n, IMAGE_SIZE, -1), (h + v) % 2,
                           ((rows + cols + phase) // period) % 2], dim=1).float()
    pattern = stacked[torch.arange(n), labels]  # (n, H, W)
    colours = 0.3 + 0.5 * torch.rand(n, CHANNELS, 1, 1, generator=g)
    images = (2 * pattern[:, None] - 1) * colours + NOISE * torch.randn(n, CHANNELS, IMAGE_SIZE, IMAGE_SIZE, generator=g)
    return {"pixel_values": images, "labels": labels}


#: task name -> spec
TASKS: dict[str, TaskSpec] = {
    "copy": TaskSpec("copy", "causal", f"repeat {LENGTH} symbols after a separator", _copy_lm, {"vocab": VOCAB}),
    "reverse": TaskSpec("reverse", "causal", f"write {LENGTH} symbols reversed after a separator", _reverse_lm,
                        {"vocab": VOCAB}),
    "modular-addition": TaskSpec("modular-addition", "causal", f"a + b mod {MODULUS}", _modular_addition_lm,
                                 {"vocab": FIRST_SYMBOL + MODULUS}),
    "reverse-seq2seq": TaskSpec("reverse-seq2seq", "seq2seq", f"encode {SEQ2SEQ_LENGTH} symbols, decode them reversed",
                                _reverse_seq2seq, {"vocab": VOCAB}),
    "copy-seq2seq": TaskSpec("copy-seq2seq", "seq2seq", f"encode {SEQ2SEQ_LENGTH} symbols, decode them in order",
                             _copy_seq2seq, {"vocab": VOCAB}),
    "majority": TaskSpec("majority", "classify", f"is most of {2 * LENGTH + 1} symbols in the upper half",
                         _majority_classify, {"vocab": VOCAB, "classes": 2}),
    "pattern-images": TaskSpec("pattern-images", "classify",
                               f"which of four stripe patterns a noisy {IMAGE_SIZE}x{IMAGE_SIZE} image shows",
                               _pattern_images, {"image_size": IMAGE_SIZE, "channels": CHANNELS,
                                                  "classes": IMAGE_CLASSES}),
}


def make_task(name: str, train_size: int, eval_size: int = 128, seed: int = 0) -> TaskData:
    """The task's splits from ``seed``: bitwise the same on every machine (host generator only)."""
    spec = TASKS[name]
    g = torch.Generator().manual_seed(seed)
    train = spec.build(train_size, g)
    evaluation = spec.build(eval_size, g)  # drawn after the training split: disjoint draws of one stream
    return TaskData(name, spec.kind, train, evaluation)


def correct_and_count(kind: str, logits: torch.Tensor, labels: torch.Tensor) -> tuple[int, int]:
    """How many scored positions the argmax of ``logits`` gets right, and how many are scored."""
    if kind == "causal":
        logits, labels = logits[:, :-1], labels[:, 1:]
    elif kind not in ("seq2seq", "classify"):
        raise ValueError(f"unknown task kind {kind!r}")
    predicted = logits.argmax(dim=-1)
    scored = labels != IGNORE
    return int(((predicted == labels) & scored).sum()), int(scored.sum())
