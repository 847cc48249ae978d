"""Mixed precision on the backend under test: what runs is what was asked, or a loud fallback.

Where ``backend.amp_capability(dtype)`` says autocast works (the ``require_fp16(amp=True)`` /
``require_bf16(amp=True)`` markers), ``Accelerator(mixed_precision=...)`` must really run the forward
in that dtype, hand back fp32 outputs, use a GradScaler for fp16 that skips steps with inf gradients,
and train to the fp32 result within ``MIXED_TOLERANCE``. Where it does not, the Accelerator must warn
with ``MixedPrecisionFallbackWarning``, record ``mixed_precision == "no"`` and keep what was requested
in ``precision.requested``; that decision is also checked on every backend by making
``amp_capability`` answer "unsupported" (this tests the decision logic, not the device).
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from _training_utils import (
    GLOBAL_BATCH,
    LR,
    host_weights,
    make_dataset,
    make_model,
    fresh_state,
    on_backend,  # noqa: F401 - fixture
    reference_training,
    same_weights,
)
from accel import Accelerator
from accel.backends import Capability
from accel.precision import MixedPrecisionFallbackWarning
from accel.state import AcceleratorState
from accel.utils import GradScalerKwargs

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
EPOCHS = 2

# Reduced precision vs fp32 after 12 SGD steps that move the weights by ~1: bf16 keeps 8 significant
# bits, fp16 11, and the rounding of activations and gradients in every step shows up in the weights.
# Measured on the host (torch 2.13): max deviation 1.5e-3 for bf16, 2e-4 for fp16. The bound below
# (2e-2 + 1e-2 * |w|) leaves over 10x room for device kernels that round or accumulate differently,
# while one lost update (~0.1 per step here), a forward in the wrong dtype everywhere or an fp16
# gradient left scaled by 256 is far outside it. A device profile's tolerances.<dtype>.training replaces it
# on that profile's backend (the ``tolerance`` fixture).
MIXED_TOLERANCE = {"rtol": 1e-2, "atol": 2e-2}

SUPPORTED = [
    pytest.param("fp16", marks=pytest.mark.require_fp16(amp=True), id="fp16"),
    pytest.param("bf16", marks=pytest.mark.require_bf16(amp=True), id="bf16"),
]


class Probe(torch.nn.Module):
    """Records the dtype its inner layer computed in."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 4)
        self.seen: list[torch.dtype] = []

    def forward(self, x):
        out = self.layer(x)
        self.seen.append(out.dtype)
        return out


@pytest.mark.parametrize("precision", SUPPORTED)
def test_forward_really_runs_in_reduced_precision(on_backend, device, precision):
    dtype = DTYPES[precision]
    with warnings.catch_warnings():
        warnings.simplefilter("error", MixedPrecisionFallbackWarning)
        accelerator = Accelerator(mixed_precision=precision)
    assert accelerator.backend.name == on_backend.name and accelerator.device == device
    assert accelerator.mixed_precision == precision and not accelerator.precision.fell_back
    assert AcceleratorState().mixed_precision == precision
    assert (accelerator.scaler is not None) == (precision == "fp16")

    model = accelerator.prepare(Probe())
    out = model(torch.ones(2, 4, device=device))
    assert model.seen == [dtype], f"the forward ran in {model.seen}, not {dtype}"
    assert out.dtype == torch.float32 and out.device == device  # outputs handed back in fp32
    with accelerator.autocast():
        assert torch.nn.Linear(2, 2).to(device)(torch.ones(1, 2, device=device)).dtype == dtype


@pytest.mark.require_fp16(amp=True)
def test_fp16_grad_scaler_skips_the_step_on_inf(on_backend, device):
    accelerator = Accelerator(mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=1024.0)])
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    assert isinstance(accelerator.scaler, torch.amp.GradScaler)
    x = torch.ones(2, 4, device=device)

    before = host_weights(accelerator.unwrap_model(model))
    accelerator.backward(model(x).sum() * float("inf"))
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    assert optimizer.step_was_skipped and accelerator.optimizer_step_was_skipped
    assert same_weights(host_weights(accelerator.unwrap_model(model)), before), "an inf step changed the weights"
    assert accelerator.scaler.get_scale() < 1024.0, "the scale did not back off"
    assert scheduler.get_last_lr() == [LR], "the scheduler stepped although the optimizer skipped"

    accelerator.backward(model(x).sum())  # a finite step goes through
    optimizer.step()
    scheduler.step()
    assert not optimizer.step_was_skipped
    assert not same_weights(host_weights(accelerator.unwrap_model(model)), before)
    assert scheduler.get_last_lr() == [LR * 0.5]


@pytest.mark.parametrize("precision", SUPPORTED)
def test_mixed_precision_training_reaches_the_fp32_result(on_backend, device, precision, tolerance):
    expected, _ = reference_training(device, EPOCHS)  # plain fp32 torch on the same device
    # a modest initial loss scale: the default 65536 overflows on this loss and skips the first steps
    accelerator = Accelerator(mixed_precision=precision, kwargs_handlers=[GradScalerKwargs(init_scale=256.0)])
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    loader = DataLoader(make_dataset(), batch_size=GLOBAL_BATCH)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    skipped = 0
    for _ in range(EPOCHS):
        for x, y in loader:
            loss = F.mse_loss(model(x), y)
            assert loss.dtype == torch.float32
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            skipped += int(optimizer.step_was_skipped)
    assert skipped == 0, f"{skipped} steps were skipped for inf/NaN gradients"
    weights = host_weights(accelerator.unwrap_model(model))
    assert not same_weights(weights, expected), f"{precision} training gave bitwise the fp32 result: it ran in fp32"
    bound = tolerance(precision, "training", MIXED_TOLERANCE)  # a device profile may set its own
    for key in expected:
        torch.testing.assert_close(weights[key], expected[key], **bound,
                                   msg=lambda m, key=key: f"{precision} vs fp32, parameter {key!r}: {m}")


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_requested_precision_runs_or_falls_back_loudly(on_backend, device, precision):
    """No skip: on a backend without autocast for the dtype, the stated fallback is what is checked."""
    capability = on_backend.amp_capability(DTYPES[precision])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        accelerator = Accelerator(mixed_precision=precision)
    fallbacks = [w for w in caught if issubclass(w.category, MixedPrecisionFallbackWarning)]
    assert accelerator.precision.requested == precision
    if capability:
        assert not fallbacks and accelerator.mixed_precision == precision
    else:
        assert fallbacks, f"{precision} is unsupported here ({capability.reason}) but no fallback warning was raised"
        assert accelerator.mixed_precision == "no" and accelerator.scaler is None


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_unsupported_autocast_falls_back_with_a_warning(on_backend, device, precision, monkeypatch):
    def unsupported(self, dtype):
        return Capability(False, f"pretend {self.name} has no {dtype} autocast")

    monkeypatch.setattr(type(on_backend), "amp_capability", unsupported)
    with pytest.warns(MixedPrecisionFallbackWarning, match=f"pretend {on_backend.name} has no"):
        accelerator = Accelerator(mixed_precision=precision)
    assert accelerator.backend.name == on_backend.name
    assert accelerator.mixed_precision == "no"
    assert accelerator.precision.requested == precision and accelerator.precision.fell_back
    assert AcceleratorState().mixed_precision == "no"
    assert accelerator.scaler is None and not accelerator.native_amp

    model = accelerator.prepare(Probe())
    out = model(torch.ones(2, 4, device=device))
    assert model.seen == [torch.float32] and out.dtype == torch.float32
    with accelerator.autocast():
        assert torch.nn.Linear(2, 2).to(device)(torch.ones(1, 2, device=device)).dtype == torch.float32


#: fp8 against fp32 on the same small MLP: mean of the last 10 losses, relative
FP8_TAIL_TOLERANCE = 0.05


def _fp8_mlp_losses(device, mixed_precision: str, steps: int = 60) -> tuple[list[float], str]:
    fresh_state()
    accelerator = Accelerator(mixed_precision=mixed_precision)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    data = torch.Generator().manual_seed(1)
    x = torch.randn(256, 32, generator=data)
    y = torch.sin(x @ torch.randn(32, 1, generator=data))
    x, y = x.to(device), y.to(device)
    losses = []
    for step in range(steps):
        start = (step * 32) % 256
        loss = F.mse_loss(model(x[start:start + 32]), y[start:start + 32])
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, accelerator.precision.label


def test_fp8_trains_like_fp32_or_is_refused_with_the_reason(on_backend, device):
    """fp8 (torchao's float8 training; real where the device's fp8 matmul runs, emulated elsewhere and
    labelled so) tracks fp32 on a small MLP; where fp8 cannot run, the Accelerator refuses with the
    same words `accel env` and the launcher give."""
    from accel.backends import UnsupportedFeatureError
    from accel.precision.fp8 import describe_fp8

    plan = describe_fp8(on_backend)
    if plan["mode"] is None:
        with pytest.raises(UnsupportedFeatureError) as refused:
            Accelerator(mixed_precision="fp8")
        assert plan["refused"] in str(refused.value)
        return
    reference, _ = _fp8_mlp_losses(device, "no")
    losses, label = _fp8_mlp_losses(device, "fp8")
    assert label == plan["mode"]  # "fp8" or "fp8 (emulated)", never a bare claim
    tail, expected = sum(losses[-10:]) / 10, sum(reference[-10:]) / 10
    assert abs(tail - expected) <= FP8_TAIL_TOLERANCE * expected, (tail, expected)
    assert tail < 0.6 * losses[0]  # it learned
