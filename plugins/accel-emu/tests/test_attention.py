"""scaled_dot_product_attention on emu takes the implementation the host would (adapter/attention.cpp)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import accel_emu


def _attention(device: str, **kwargs):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8).to(device).requires_grad_() for _ in range(3))
    out = F.scaled_dot_product_attention(q, k, v, **kwargs)
    out.sum().backward()
    return out.detach().cpu(), q.grad.cpu()


def test_the_hosts_fused_kernel_runs_and_gives_the_hosts_numbers(emu):
    accel_emu.reset_fallback_calls()
    out, grad = _attention("emu", is_causal=True)
    ran = {name for name, _, calls in accel_emu.fallback_calls() if calls}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in ran, sorted(ran)
    assert "aten::_scaled_dot_product_flash_attention_for_cpu_backward" in ran, sorted(ran)
    host_out, host_grad = _attention("cpu", is_causal=True)
    assert torch.equal(out, host_out) and torch.equal(grad, host_grad), "emu's attention differs from the host's"


def test_with_dropout_the_composite_runs(emu):
    """The composite's dropout draws from emu's generator; the host's fused kernel would draw from the host's."""
    accel_emu.reset_fallback_calls()
    first, _ = _attention("emu", dropout_p=0.5)
    again, _ = _attention("emu", dropout_p=0.5)  # _attention seeds every device again
    ran = {name for name, _, calls in accel_emu.fallback_calls() if calls}
    assert not any("flash_attention" in name for name in ran), sorted(ran)
    assert torch.equal(first, again), "the same seed gave different dropout masks"
