"""What FSDP does to a model's parameters and gradients: wrapper-free names, which FSDP a model runs,
ignored modules, the optimizer switched to the shards, gradient clipping over DTensor shards.

Apart from the strategy so that the wrapping, the state-dict helpers and the strategy share them.
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch

_CANONICAL = (("._checkpoint_wrapped_module", ""), ("_checkpoint_wrapped_module.", ""), ("_fsdp_wrapped_module.", ""),
              ("._fsdp_wrapped_module", ""), ("._orig_mod", ""))


def fsdp2_canonicalize_names(named_params: dict[str, Any]) -> dict[str, Any]:
    """``named_params`` with the names wrappers add (activation checkpointing, FSDP1, torch.compile) removed."""
    out = {}
    for name, value in named_params.items():
        if name.startswith("_orig_mod."):
            name = name[len("_orig_mod."):]
        for old, new in _CANONICAL:
            name = name.replace(old, new)
        out[name] = value
    return out


def _is_fsdp2(model: Any) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _is_fsdp1(model: Any) -> bool:
    from torch.distributed.fsdp import FullyShardedDataParallel

    return isinstance(model, FullyShardedDataParallel)


def _ignored_modules(spec: Any, model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules ``ignored_modules`` names: a regex full-matched against module names, or modules."""
    if spec is None:
        return []
    if isinstance(spec, str):
        pattern = re.compile(spec)
        found = [m for name, m in model.named_modules() if name and pattern.fullmatch(name)]
        if not found:
            raise ValueError(f"ignored_modules={spec!r} matches no module name of {type(model).__name__}")
        return found
    return list(spec)


def get_fsdp2_grad_scaler(**kwargs: Any) -> Any:
    """The grad scaler for fp16 under FSDP: torch's ShardedGradScaler, which agrees on inf/NaN across ranks."""
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    return ShardedGradScaler(**kwargs)


def fsdp2_switch_optimizer_parameters(optimizer: torch.optim.Optimizer, mapping: dict[Any, torch.nn.Parameter]) -> None:
    """Point ``optimizer`` at the sharded parameters: ``mapping`` takes an original parameter (or its id) to its shard.

    Optimizer state already held for a parameter moves with it. KeyError when a parameter has no
    sharded counterpart (stepping the stale tensor would silently train nothing).
    """
    # keyed by id: a tensor key would be compared with ``==`` on a hash collision
    by_id = {(key if isinstance(key, int) else id(key)): value for key, value in mapping.items()}
    moved_state = {}
    for group in optimizer.param_groups:
        new_params = []
        for p in group["params"]:
            new = by_id.get(id(p))
            if new is None:
                raise KeyError(f"an optimizer parameter of shape {tuple(p.shape)} belongs to no model prepared with FSDP, so it "
                               "cannot be switched to a sharded parameter; prepare the model with (or before) its optimizer")
            if p in optimizer.state:
                moved_state[new] = optimizer.state.pop(p)
            new_params.append(new)
        group["params"] = new_params
    optimizer.state.update(moved_state)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return tensor._local_tensor if isinstance(tensor, DTensor) else tensor


def _clip_sharded_grad_norm_(parameters: list[torch.Tensor], max_norm: float, norm_type: float = 2) -> torch.Tensor:
    """``clip_grad_norm_`` over DTensor (sharded) and plain gradients together: the norm of the full gradient."""
    from torch.distributed.tensor import DTensor

    norm_type = float(norm_type)
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    norms = []
    for group in ([g for g in grads if isinstance(g, DTensor)], [g for g in grads if not isinstance(g, DTensor)]):
        if not group:
            continue
        norm = torch.nn.utils.get_total_norm(group, norm_type)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    device = norms[0].device
    norms = [n.to(device) for n in norms]
    if math.isinf(norm_type):
        total = torch.stack(norms).max()
    else:
        total = torch.stack([n.pow(norm_type) for n in norms]).sum().pow(1.0 / norm_type)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        local = _local(g)
        local.mul_(coef.to(local.device, local.dtype))
    return total
