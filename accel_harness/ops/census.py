"""The dispatcher census: for every aten overload, how the device runs it.

Kinds, in the order the dispatcher prefers them for a device tensor:

- ``device-kernel``: the device registers a kernel of its own for the overload;
- ``composite-implicit``: torch decomposes it into other operators (CompositeImplicitAutograd);
- ``composite-explicit``: one kernel written for every backend (CompositeExplicitAutograd);
- ``fallback``: none of these, but the device has a boxed fallback that runs it (often on the host);
- ``missing``: nothing: a call raises NotImplementedError on the device.

``host_kernel`` says whether the CPU has a kernel of its own, so "device kernels among the operators
the host has kernels for" can be told apart from operators nobody implements per backend. The
training-step trace records which overloads a small training step reaches, and by which kind: a
fallback in a training step is where a device silently loses speed.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

__all__ = ["CENSUS_KINDS", "census", "classify", "dispatch_key", "trace_training_step"]

CENSUS_KINDS = ("device-kernel", "composite-implicit", "composite-explicit", "fallback", "missing")

_EXPLICIT = ("CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional")


def dispatch_key(device_type: str) -> str:
    """The dispatch key of a device type's dense tensors (``cuda`` -> ``CUDA``, a renamed PrivateUse1 -> ``PrivateUse1``)."""
    return str(torch._C._dispatch_key_for_device(device_type))


def _has_fallback(key: str) -> bool:
    try:
        return bool(torch._C._dispatch_has_backend_fallback(getattr(torch._C.DispatchKey, key)))
    except (AttributeError, RuntimeError, TypeError):
        return False


def classify(operator: str, key: str, fallback: bool) -> str:
    """The census kind of one overload (``aten::add.Tensor``) for the dispatch key ``key``."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    if has(operator, key):
        return "device-kernel"
    if has(operator, "CompositeImplicitAutograd"):
        return "composite-implicit"
    if any(has(operator, k) for k in _EXPLICIT):
        return "composite-explicit"
    return "fallback" if fallback else "missing"


def census(device_type: str) -> list[dict[str, Any]]:
    """One row per aten overload: ``operator``, ``kind``, ``host_kernel``."""
    key = dispatch_key(device_type)
    fallback = _has_fallback(key)
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    rows = []
    for operator in sorted(torch._C._dispatch_get_all_op_names()):
        if not operator.startswith("aten::"):
            continue
        rows.append({"operator": operator, "kind": classify(operator, key, fallback), "host_kernel": bool(has(operator, "CPU"))})
    return rows


class _Tracer:
    """Counts the aten overloads a region calls (a TorchDispatchMode, created lazily)."""

    def __new__(cls) -> Any:
        from torch.utils._python_dispatch import TorchDispatchMode

        class Mode(TorchDispatchMode):
            def __init__(self) -> None:
                super().__init__()
                self.calls: Counter[str] = Counter()

            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                self.calls[func.name()] += 1
                return func(*args, **(kwargs or {}))

        return Mode()


def _step_model(device: torch.device) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """A small transformer-shaped model (embedding, attention, norm, MLP, convolution) and a batch."""
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(32, 16)
            self.attn = torch.nn.MultiheadAttention(16, 2, batch_first=True)
            self.norm = torch.nn.LayerNorm(16)
            self.conv = torch.nn.Conv1d(16, 16, 3, padding=1)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Dropout(0.1), torch.nn.Linear(32, 32))

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            x = self.embed(tokens)
            x = x + self.attn(x, x, x, need_weights=False)[0]
            x = self.norm(x)
            x = x + self.conv(x.transpose(1, 2)).transpose(1, 2)
            return self.mlp(x)

    model = Block().to(device)
    tokens = torch.randint(0, 32, (4, 8)).to(device)
    labels = torch.randint(0, 32, (4, 8)).to(device)
    return model, tokens, labels


def trace_training_step(device: torch.device, device_type: str) -> list[dict[str, Any]]:
    """The aten overloads one training step (forward, cross-entropy, backward, AdamW step, clipping)
    reaches on ``device``: ``operator``, ``calls``, ``kind``."""
    model, tokens, labels = _step_model(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    tracer = _Tracer()
    with tracer:
        logits = model(tokens)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 32), labels.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
    key = dispatch_key(device_type)
    fallback = _has_fallback(key)
    return [{"operator": name, "calls": calls, "kind": classify(name, key, fallback)}
            for name, calls in sorted(tracer.calls.items()) if name.startswith("aten::")]
