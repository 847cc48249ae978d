"""Capability answers that depend on the torch release (``torch_version=``)."""

from __future__ import annotations

import pytest
import torch
from packaging.version import Version

import accel.backends.xpu as xpu_mod
from accel.backends import Availability, BackendError, Capability, UnsupportedFeatureError, torch_version
from accel.backends.cpu import CPUBackend
from accel.backends.cuda import CUDABackend
from accel.backends.hpu import HPUBackend
from accel.backends.mps import MPSBackend
from accel.backends.xpu import XPUBackend

from _backend_fakes import FakeDeviceModule


# ---------------------------------------------------------------------- the version itself
def test_installed_torch_version_has_no_local_tag():
    installed = torch_version()
    assert installed == Version(Version(torch.__version__).base_version)
    assert installed.local is None
    assert CPUBackend().torch_version == installed
    assert XPUBackend().torch_version == installed


def test_explicit_torch_version_is_used():
    assert CPUBackend(torch_version="2.3").torch_version == Version("2.3")
    assert XPUBackend(torch_version=Version("2.4.1")).torch_version == Version("2.4.1")


def test_explicit_torch_version_is_normalised_like_the_installed_one():
    """A nightly/source build string answers like its release, as for the installed torch.

    ``torch_version()`` reduces ``torch.__version__`` to its base release, so an installed
    ``2.5.0a0+git1234abc`` counts as 2.5.0. Passing the same string explicitly must give the
    same capability answers.
    """
    nightly = "2.5.0a0+git1234abc"
    backend = XPUBackend(torch_version=nightly)
    cap = backend.memory_stats_capability
    assert cap.supported, cap.reason
    assert backend.torch_version == Version("2.5.0")


# ---------------------------------------------------------------------- XPU
def test_xpu_memory_stats_need_torch_2_5():
    old = XPUBackend(torch_version="2.4.1").memory_stats_capability
    assert isinstance(old, Capability) and not old
    assert "2.5" in old.reason and "2.4.1" in old.reason
    assert not XPUBackend(torch_version="2.4.1").has_memory_stats
    new = XPUBackend(torch_version="2.5.0").memory_stats_capability
    assert new.supported and new.reason
    assert XPUBackend(torch_version="2.5.0").has_memory_stats
    assert XPUBackend(torch_version="2.13").has_memory_stats


@pytest.mark.parametrize(
    "call",
    [
        ("memory_allocated", lambda b: b.memory_allocated()),
        ("memory_reserved", lambda b: b.memory_reserved(0)),
        ("max_memory_allocated", lambda b: b.max_memory_allocated()),
        ("reset_peak_memory_stats", lambda b: b.reset_peak_memory_stats()),
        ("mem_get_info", lambda b: b.mem_get_info()),
    ],
    ids=lambda c: c[0],
)
def test_xpu_2_4_memory_calls_raise_unsupported(call):
    feature, invoke = call
    fake = FakeDeviceModule()
    backend = XPUBackend(torch_version="2.4", module=fake, accelerator=None)
    with pytest.raises(UnsupportedFeatureError) as info:
        invoke(backend)
    err = info.value
    assert err.backend == "xpu" and err.feature == feature
    assert "2.5" in err.reason
    message = str(err)
    assert message.startswith("xpu: ") and feature in message and err.reason in message
    assert isinstance(err, BackendError) and isinstance(err, NotImplementedError)
    assert fake.called(feature) == [] and fake.called("mem_get_info") == []


def test_xpu_comm_backend_below_2_7_is_never_xccl(monkeypatch):
    monkeypatch.setattr(xpu_mod, "_xccl_available", lambda: True)  # even if the build had xccl
    for version in ("2.4", "2.5.1", "2.6.0"):
        backend = XPUBackend(torch_version=version)
        assert backend.comm_backend != "xccl", version
        assert "2.7" in backend.comm_backend_reason()
    assert XPUBackend(torch_version="2.7").comm_backend == "xccl"
    assert XPUBackend(torch_version="2.8.0").supports_multiprocess()


def test_xpu_without_xccl_or_oneccl_is_single_process(monkeypatch):
    monkeypatch.setattr(xpu_mod, "_xccl_available", lambda: False)
    real_find_spec = xpu_mod.importlib.util.find_spec
    monkeypatch.setattr(
        xpu_mod.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "oneccl_bindings_for_pytorch" else real_find_spec(name, *a),
    )
    backend = XPUBackend(torch_version="2.7")
    assert backend.comm_backend is None
    assert not backend.supports_multiprocess()
    assert "xccl" in backend.comm_backend_reason()
    caps = backend.capabilities()
    assert not caps["multiprocess"] and caps["multiprocess"].reason == backend.comm_backend_reason()


def test_xpu_comm_backend_on_installed_torch_matches_torch_distributed():
    import torch.distributed as dist

    backend = XPUBackend()
    probe = getattr(dist, "is_xccl_available", None)
    if torch_version() >= Version("2.7") and dist.is_available() and probe is not None and probe():
        assert backend.comm_backend == "xccl"
    else:
        assert backend.comm_backend != "xccl"


# ---------------------------------------------------------------------- MPS
class _AvailableMPS(MPSBackend):
    """MPS whose probes are patched to succeed, to check the version gates alone."""

    def _probe(self) -> Availability:
        return Availability(True, "pretend Apple GPU")

    def dtype_capability(self, dtype: torch.dtype) -> Capability:
        return Capability(True, f"pretend {dtype} works")


@pytest.mark.parametrize(
    "dtype, need, below, at",
    [(torch.float16, "2.8", "2.7.1", "2.8.0"), (torch.bfloat16, "2.6", "2.5", "2.6")],
    ids=["fp16", "bf16"],
)
def test_mps_autocast_version_gates(dtype, need, below, at):
    old = MPSBackend(torch_version=below).amp_capability(dtype)
    assert not old
    assert f">= {need}" in old.reason and below in old.reason
    # at the required release the version gate passes; what remains is the device itself
    new = MPSBackend(torch_version=at).amp_capability(dtype)
    assert "needs torch" not in new.reason
    if not MPSBackend().is_available():
        assert not new and new.reason.startswith("backend unavailable")
    assert _AvailableMPS(torch_version=at).amp_capability(dtype).supported
    assert not _AvailableMPS(torch_version=below).amp_capability(dtype)


def test_mps_fp16_and_bf16_amp_properties_follow_the_table():
    assert not MPSBackend(torch_version="2.7").supports_fp16_amp
    assert _AvailableMPS(torch_version="2.7").supports_bf16_amp
    assert _AvailableMPS(torch_version="2.8").supports_fp16_amp


def test_mps_grad_scaler_needs_torch_2_8():
    old = _AvailableMPS(torch_version="2.7").grad_scaler_capability
    assert not old and "2.8" in old.reason
    with pytest.raises(UnsupportedFeatureError) as info:
        _AvailableMPS(torch_version="2.7").grad_scaler()
    assert info.value.feature == "GradScaler" and "2.8" in info.value.reason
    assert _AvailableMPS(torch_version="2.8").grad_scaler_capability.supported


# ---------------------------------------------------------------------- CPU
def test_cpu_fp16_amp_and_grad_scaler_unsupported_on_torch_2_3():
    backend = CPUBackend(torch_version="2.3")
    fp16 = backend.supports_fp16_amp
    assert not fp16 and "2.3" in fp16.reason and "2.4" in fp16.reason
    scaler = backend.grad_scaler_capability
    assert not scaler and "2.3" in scaler.reason
    with pytest.raises(UnsupportedFeatureError) as info:
        backend.grad_scaler()
    assert info.value.backend == "cpu" and "2.3" in str(info.value)
    # bf16 autocast was there long before
    assert backend.supports_bf16_amp.supported


def test_cpu_table_answer_for_torch_2_4():
    backend = CPUBackend(torch_version="2.4")
    assert backend.supports_fp16_amp.supported
    assert backend.grad_scaler_capability.supported


def test_cpu_installed_torch_supports_fp16_amp_and_grad_scaler_by_probing():
    backend = CPUBackend()
    fp16 = backend.supports_fp16_amp
    assert fp16.supported, fp16.reason
    assert "autocast" in fp16.reason and "float16" in fp16.reason  # the real probe's answer
    assert backend.supports_bf16_amp.supported
    assert backend.grad_scaler_capability.supported
    # and the answer is true: autocast really computes a Linear in fp16
    with backend.autocast(torch.float16):
        out = torch.nn.Linear(8, 8)(torch.randn(2, 8))
    assert out.dtype == torch.float16


def test_cpu_autocast_of_an_unsupported_dtype():
    cap = CPUBackend().amp_capability(torch.float64)
    assert not cap and "float64" in cap.reason


# ---------------------------------------------------------------------- device-module backends
def test_device_module_backends_have_no_version_gate_for_amp_on_cuda_and_hpu():
    for cls in (CUDABackend, HPUBackend):
        backend = cls(torch_version="2.0", module=FakeDeviceModule(available=False), accelerator=None)
        cap = backend.amp_capability(torch.float16)
        assert not cap and cap.reason.startswith("backend unavailable"), cls
        assert not backend.grad_scaler_capability
        assert "GradScaler" in backend.grad_scaler_capability.reason


def test_capability_and_availability_truthiness():
    assert Capability(True) and not Capability(False, "why")
    assert Availability(True, "ok") and not Availability(False, "no")
    err = UnsupportedFeatureError("xpu", "streams", "because")
    assert (err.backend, err.feature, err.reason) == ("xpu", "streams", "because")
    assert str(err) == "xpu: streams is not supported (because)"
