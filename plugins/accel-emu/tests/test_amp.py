"""Autocast (fp16, bf16) and GradScaler on emu."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_autocast_runs_matmuls_in_lower_precision(emu, dtype):
    lin = torch.nn.Linear(8, 8).to("emu")
    x = torch.randn(4, 8, device="emu")
    with torch.autocast("emu", dtype=dtype):
        y = lin(x)
        s = torch.softmax(y, dim=1)  # an fp32 op under autocast
    assert y.dtype == dtype
    assert s.dtype == torch.float32
    assert lin(x).dtype == torch.float32  # outside the region


def test_autocast_rejects_unsupported_dtype(emu):
    with pytest.warns(UserWarning, match="emu"):
        with torch.autocast("emu", dtype=torch.float64):
            pass


def test_grad_scaler_scales_unscales_and_skips_inf_steps(emu):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).to("emu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("emu", init_scale=1024.0)
    x = torch.randn(8, 4, device="emu")
    with torch.autocast("emu", dtype=torch.float16):
        loss = model(x).float().pow(2).mean()
    scaler.scale(loss).backward()
    before = model.weight.detach().cpu().clone()
    scaler.step(opt)
    scaler.update()
    assert not torch.equal(model.weight.detach().cpu(), before)  # a finite step was taken
    assert scaler.get_scale() == 1024.0

    # an infinite gradient: the step is skipped and the scale backs off
    opt.zero_grad()
    with torch.autocast("emu", dtype=torch.float16):
        loss = model(x).float().sum() * float("inf")
    scaler.scale(loss).backward()
    before = model.weight.detach().cpu().clone()
    scaler.step(opt)
    scaler.update()
    assert torch.equal(model.weight.detach().cpu(), before)
    assert scaler.get_scale() == 512.0
