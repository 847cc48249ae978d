"""Device-module backends (cuda, xpu, hpu, mps) driven through an injected fake module.

``module=`` hands the backend a fake device module and ``accelerator=None`` switches off the
device-generic accelerator API, so the real code paths of accel/backends run on a machine
without any of these devices. The fakes record their calls, which is what the tests check.
"""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
import torch
import torch.distributed as dist

from accel.backends import (
    Availability,
    Backend,
    BackendUnavailableError,
    Capability,
    DeviceModuleBackend,
    DeviceProperties,
    Timer,
    UnsupportedFeatureError,
)
from accel.backends.cuda import CUDABackend
from accel.backends.hpu import HPUBackend
from accel.backends.mps import MPSBackend
from accel.backends.xpu import XPUBackend

from _backend_fakes import GiB, FakeAccelerator, FakeDeviceModule, FakeEvent, FakeStream

GAUDI_PACKAGE = "habana" + "_frameworks"  # spelled in two parts: see the isolation test

DEVICE_BACKENDS = [
    pytest.param(CUDABackend, id="cuda"),
    pytest.param(XPUBackend, id="xpu"),
    pytest.param(HPUBackend, id="hpu"),
]


def make(cls: type[DeviceModuleBackend], **fake_kwargs) -> tuple[DeviceModuleBackend, FakeDeviceModule]:
    fake = FakeDeviceModule(**fake_kwargs)
    return cls(module=fake, accelerator=None), fake


# ---------------------------------------------------------------------- identity facts
def test_static_facts():
    assert CUDABackend.visible_devices_env == "CUDA_VISIBLE_DEVICES"
    assert XPUBackend.visible_devices_env == "ZE_AFFINITY_MASK"
    assert HPUBackend.visible_devices_env == "HABANA_VISIBLE_MODULES"
    assert MPSBackend.visible_devices_env is None
    for cls in (CUDABackend, XPUBackend, HPUBackend, MPSBackend):
        assert cls.start_method == "spawn", cls
        assert cls.name == cls.device_type
        assert issubclass(cls, DeviceModuleBackend) and issubclass(cls, Backend)
    assert MPSBackend.use_host_timers and not CUDABackend.use_host_timers
    assert not XPUBackend.use_host_timers and not HPUBackend.use_host_timers
    assert HPUBackend.compile_backend == "hpu_backend" and CUDABackend.compile_backend == "inductor"
    distributed_types = {cls.name: cls.distributed_type for cls in (CUDABackend, XPUBackend, HPUBackend, MPSBackend)}
    assert distributed_types == {"cuda": "MULTI_GPU", "xpu": "MULTI_XPU", "hpu": "MULTI_HPU", "mps": "NO"}


def test_comm_backends():
    cuda, _ = make(CUDABackend)
    expected = ("nccl" if dist.is_nccl_available() else "gloo") if dist.is_available() else None
    assert cuda.comm_backend == expected
    hpu, _ = make(HPUBackend)
    assert hpu.comm_backend == "hccl" and hpu.supports_multiprocess()
    mps = MPSBackend(module=FakeDeviceModule(), accelerator=None)
    assert mps.comm_backend is None and not mps.supports_multiprocess()
    assert "single process" in mps.comm_backend_reason()


# ---------------------------------------------------------------------- availability
@pytest.mark.parametrize("cls", DEVICE_BACKENDS)
def test_available_with_device_count(cls):
    backend, fake = make(cls, count=2)
    assert backend.availability == Availability(True, "2 device(s) visible")
    assert backend.is_available()
    assert backend.device_count() == 2
    assert backend.devices() == [torch.device(cls.device_type, 0), torch.device(cls.device_type, 1)]
    backend.require_available()  # no error


@pytest.mark.parametrize("cls", DEVICE_BACKENDS)
def test_availability_is_probed_once(cls):
    backend, fake = make(cls)
    for _ in range(3):
        assert backend.is_available()
    assert len(fake.called("is_available")) == 1


def _expected_unavailable_fragment(cls) -> str:
    if cls is CUDABackend and torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return "built without CUDA"
    if cls is XPUBackend and getattr(torch.version, "xpu", None) is None:
        return "built without XPU"
    return f"{cls.device_type}.is_available() is False"


@pytest.mark.parametrize("cls", DEVICE_BACKENDS)
def test_unavailable_gives_reason(cls):
    backend, fake = make(cls, available=False)
    avail = backend.availability
    assert not avail and not backend.is_available()
    assert _expected_unavailable_fragment(cls) in avail.reason
    assert backend.device_count() == 0
    assert backend.devices() == []
    with pytest.raises(BackendUnavailableError, match="not available") as info:
        backend.require_available()
    assert avail.reason in str(info.value)
    describe = backend.describe()
    assert describe["available"] is False and describe["reason"] == avail.reason
    assert "devices" not in describe


@pytest.mark.parametrize("cls", DEVICE_BACKENDS)
def test_zero_devices_means_unavailable(cls):
    backend, _ = make(cls, count=0)
    assert not backend.is_available()
    assert "device_count() is 0" in backend.availability.reason
    assert backend.device_count() == 0


def test_visible_devices_hint_in_reason(monkeypatch):
    monkeypatch.setenv("HABANA_VISIBLE_MODULES", "7")
    backend, _ = make(HPUBackend, available=False)
    assert "HABANA_VISIBLE_MODULES='7' may hide devices" in backend.availability.reason
    monkeypatch.delenv("HABANA_VISIBLE_MODULES")
    backend, _ = make(HPUBackend, available=False)
    assert "may hide devices" not in backend.availability.reason


@pytest.mark.parametrize("cls", DEVICE_BACKENDS)
def test_probe_that_raises_becomes_unavailable(cls):
    backend, _ = make(cls, probe_error=RuntimeError("driver exploded"))
    avail = backend.availability  # must not raise
    assert avail == Availability(False, "probe failed: RuntimeError: driver exploded")
    assert backend.device_count() == 0
    assert backend.describe()["available"] is False


def test_probe_failure_in_device_count_is_caught():
    fake = FakeDeviceModule()
    fake.device_count = lambda: (_ for _ in ()).throw(OSError("no /dev/dri"))
    backend = XPUBackend(module=fake, accelerator=None)
    assert backend.availability.reason == "probe failed: OSError: no /dev/dri"


def test_hpu_with_injected_module_does_not_import_the_gaudi_stack():
    was_loaded = GAUDI_PACKAGE in sys.modules
    backend, fake = make(HPUBackend)
    assert backend.is_available() and backend.module is fake
    if not was_loaded:
        assert GAUDI_PACKAGE not in sys.modules


def test_hpu_without_gaudi_stack_is_unavailable_with_reason():
    if importlib.util.find_spec(GAUDI_PACKAGE) is not None:
        pytest.skip("the Gaudi software stack is installed here")
    backend = HPUBackend()
    assert not backend.is_available()
    assert "not installed" in backend.availability.reason
    assert backend.module is None


# ---------------------------------------------------------------------- devices
@pytest.mark.parametrize("cls", DEVICE_BACKENDS)
def test_device_index_range(cls):
    backend, fake = make(cls, count=2)
    assert backend.device(1) == torch.device(cls.device_type, 1)
    with pytest.raises(ValueError, match=r"device index 2 out of range.*sees 2 device\(s\)") as info:
        backend.device(2)
    assert cls.name in str(info.value)
    with pytest.raises(ValueError, match="sees 2 device"):
        backend.device(-1)
    fake.current = 1
    assert backend.device() == torch.device(cls.device_type, 1)


class RefusingDeviceModule(FakeDeviceModule):
    """A fake device module whose ``set_device`` refuses an index it lacks, as torch's modules do."""

    def set_device(self, index: int) -> None:
        if not 0 <= index < self.count:
            raise RuntimeError(f"invalid device ordinal {index}")
        super().set_device(index)


class NoSetDeviceModule(FakeDeviceModule):
    """A fake device module without ``set_device`` (only ``torch.accelerator`` could set the device)."""

    set_device = None


@pytest.mark.parametrize("cls", DEVICE_BACKENDS)
def test_set_and_current_device_forward(cls):
    fake = RefusingDeviceModule(count=2)
    backend = cls(module=fake, accelerator=None)
    backend.set_device(1)
    assert fake.called("set_device") == [(1,)]
    assert backend.current_device() == 1
    assert fake.called("current_device")
    with pytest.raises(RuntimeError, match="invalid device ordinal 5"):  # the module's own refusal
        backend.set_device(5)
    assert fake.current == 1


@pytest.mark.parametrize("cls", DEVICE_BACKENDS)
def test_set_device_obeys_a_patched_module_function(cls, monkeypatch):
    # Accelerate's test_env_var_device replaces torch.<device>.set_device with a no-op and asks for
    # device 64, which no machine has: the replacement decides, no range check of accel's runs first
    fake = RefusingDeviceModule(count=2)
    seen = []
    monkeypatch.setattr(fake, "set_device", seen.append)
    backend = cls(module=fake, accelerator=FakeAccelerator(count=2))
    backend.set_device(64)
    assert seen == [64] and backend.accelerator.called("set_device_index") == []


def test_without_module_set_device_the_index_is_checked_and_the_accelerator_sets_it():
    acc = FakeAccelerator(count=3)
    backend = CUDABackend(module=NoSetDeviceModule(count=3), accelerator=acc)
    backend.set_device(2)
    assert acc.called("set_device_index") == [(2,)]
    with pytest.raises(ValueError, match="out of range"):
        backend.set_device(3)
    assert acc.called("set_device_index") == [(2,)]
    alone = CUDABackend(module=NoSetDeviceModule(count=3), accelerator=None)
    with pytest.raises(UnsupportedFeatureError, match="torch.cuda has no set_device"):
        alone.set_device(0)


@pytest.mark.parametrize("cls", DEVICE_BACKENDS)
def test_synchronize_forwards(cls):
    backend, fake = make(cls)
    backend.synchronize()
    backend.synchronize(1)
    assert fake.called("synchronize") == [(), (1,)]


# ---------------------------------------------------------------------- RNG
@pytest.mark.parametrize("cls", DEVICE_BACKENDS)
def test_rng_forwards(cls):
    backend, fake = make(cls)
    backend.manual_seed(1234)
    assert fake.called("manual_seed_all") == [(1234,)] and fake.seed == 1234
    fake.current = 1
    state = backend.get_rng_state()
    assert fake.called("get_rng_state") == [(1,)]
    assert torch.equal(state, torch.full((8,), 1, dtype=torch.uint8))
    backend.set_rng_state(torch.zeros(8, dtype=torch.uint8), 0)
    assert fake.called("set_rng_state") == [(0,)]
    assert torch.equal(backend.get_rng_state(0), torch.zeros(8, dtype=torch.uint8))


# ---------------------------------------------------------------------- memory
@pytest.mark.parametrize("cls", DEVICE_BACKENDS)
def test_memory_functions_return_module_figures(cls):
    backend, fake = make(cls)
    assert backend.has_memory_stats and backend.memory_stats_capability.reason
    fake.current = 1
    assert backend.memory_allocated() == 1001
    assert backend.memory_allocated(0) == 1000
    assert backend.memory_reserved() == 2001
    assert backend.max_memory_allocated(0) == 3000
    backend.reset_peak_memory_stats(1)
    assert fake.called("reset_peak_memory_stats") == [(1,)]
    assert backend.max_memory_allocated(1) == 1001
    free, total = backend.mem_get_info()
    assert (free, total) == (4 * GiB + 1, 16 * GiB)
    assert isinstance(free, int) and isinstance(total, int)
    assert fake.called("memory_allocated") == [(1,), (0,)]


def test_empty_cache_forwards_on_cuda_and_xpu_only():
    for cls in (CUDABackend, XPUBackend):
        backend, fake = make(cls)
        backend.empty_cache()
        assert fake.called("empty_cache") == [()], cls
    hpu, fake = make(HPUBackend)
    hpu.empty_cache()  # the HPU allocator has no cache: documented no-op
    assert fake.called("empty_cache") == []
    off, fake = make(CUDABackend, available=False)
    off.empty_cache()
    assert fake.called("empty_cache") == []


# ---------------------------------------------------------------------- streams, events, timer
@pytest.mark.parametrize("cls", DEVICE_BACKENDS)
def test_streams_forward(cls):
    backend, fake = make(cls)
    stream = backend.stream()
    assert isinstance(stream, FakeStream) and stream.label == "new"
    assert backend.current_stream().label == "current"
    with backend.stream_context(stream):
        assert fake.streams_entered == [stream]
    assert fake.streams_entered == []


@pytest.mark.parametrize("cls", DEVICE_BACKENDS)
def test_event_forwards(cls):
    backend, fake = make(cls)
    ev = backend.event(enable_timing=True)
    assert isinstance(ev, FakeEvent) and ev.enable_timing
    assert not backend.event().enable_timing
    assert fake.called("Event") == [(True,), (False,)]


@pytest.mark.parametrize("cls", DEVICE_BACKENDS)
def test_timer_uses_device_events(cls):
    backend, fake = make(cls, elapsed_ms=250.0)
    assert backend.use_host_timers is False
    timer = backend.timer()
    assert isinstance(timer, Timer)
    with timer as t:
        assert len(fake.events) == 2
        start, end = fake.events
        assert start.recorded == 1 and end.recorded == 0
    assert t.elapsed == pytest.approx(0.25)
    assert start.enable_timing and end.enable_timing
    assert end.recorded == 1 and end.synchronized == 1
    assert start.elapsed_queries == [end]
    assert fake.called("synchronize") == []  # events, not a host synchronize


def test_timer_on_mps_uses_host_clock_and_module_synchronize(timer_clock):
    fake = FakeDeviceModule()
    mps = MPSBackend(module=fake, accelerator=None)
    with mps.timer() as t:
        timer_clock.advance(0.25)
    assert fake.events == []
    assert len(fake.called("synchronize")) == 2
    assert t.elapsed == 0.25


# ---------------------------------------------------------------------- properties and dtypes
def test_cuda_device_properties():
    backend, _ = make(CUDABackend, capability=(9, 0))
    props = backend.device_properties(1)
    assert isinstance(props, DeviceProperties)
    assert props.index == 1 and props.name == "Fake Accelerator 1"
    assert props.total_memory == 16 * GiB
    assert props.extra == {"major": 9, "minor": 0, "multi_processor_count": 108}
    assert props.driver_version is None
    expected_runtime = f"CUDA {torch.version.cuda}" if torch.version.cuda else None
    if getattr(torch.version, "hip", None):
        expected_runtime = f"HIP {torch.version.hip}"
    assert props.runtime_version == expected_runtime


def test_xpu_device_properties_take_driver_version_out_of_extra():
    props_in = {"name": "Intel Data Center GPU Max 1550", "total_memory": 64 * GiB,
                "driver_version": "1.3.27642", "platform_name": "Intel(R) Level-Zero"}
    backend, _ = make(XPUBackend, props=props_in)
    props = backend.device_properties(0)
    assert props.name == "Intel Data Center GPU Max 1550"
    assert props.total_memory == 64 * GiB
    assert props.driver_version == "1.3.27642"
    assert props.extra == {"platform_name": "Intel(R) Level-Zero"}


def test_device_properties_without_a_name_fall_back_to_device_type():
    backend, _ = make(HPUBackend, props={"total_memory": 96 * GiB})
    props = backend.device_properties(0)
    assert props.name == "hpu" and props.total_memory == 96 * GiB and props.extra == {}


def test_cuda_bf16_follows_module_answer():
    backend, fake = make(CUDABackend, bf16=False)
    cap = backend.supports_bf16
    assert not cap and cap.reason == "this GPU has no bf16 support"
    assert fake.called("is_bf16_supported")
    yes, _ = make(CUDABackend, bf16=True)
    assert yes.supports_bf16.reason != "this GPU has no bf16 support"


@pytest.mark.parametrize("capability, supported", [((8, 0), False), ((8, 9), True), ((9, 0), True)])
def test_cuda_fp8_needs_compute_capability_8_9(capability, supported):
    backend, fake = make(CUDABackend, capability=capability)
    cap = backend.supports_fp8
    assert cap.supported is supported
    assert f"{capability[0]}.{capability[1]}" in cap.reason
    assert fake.called("get_device_capability") == [(0,)]


def test_cuda_fp8_unavailable_backend():
    backend, fake = make(CUDABackend, available=False)
    cap = backend.supports_fp8
    assert not cap and cap.reason.startswith("backend unavailable")
    assert fake.called("get_device_capability") == []


@pytest.mark.parametrize("cls", DEVICE_BACKENDS)
def test_describe_is_json_ready(cls):
    backend, _ = make(cls, count=2)
    info = json.loads(json.dumps(backend.describe()))
    assert info["name"] == cls.name and info["available"] is True
    assert info["device_count"] == 2
    assert [d["name"] for d in info["devices"]] == ["Fake Accelerator 0", "Fake Accelerator 1"]
    assert info["visible_devices_env"] == cls.visible_devices_env
    assert info["timing"] == "device events"
    assert set(info["capabilities"]) == {
        "memory_stats", "multiprocess", "fp16", "bf16", "fp8", "fp16_amp", "bf16_amp", "grad_scaler",
    }
    caps = backend.capabilities()
    assert all(isinstance(c, Capability) and c.reason for c in caps.values()), caps


# ---------------------------------------------------------------------- out-of-memory errors
OOM_CASES = [
    (CUDABackend, "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.78 GiB total capacity)"),
    (CUDABackend, "HIP out of memory. Tried to allocate 1.00 GiB"),
    (XPUBackend, "XPU out of memory. Tried to allocate 4.00 GiB"),
    (XPUBackend, "level_zero backend failed with error: 39 (UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY)"),
    (HPUBackend, "Device out of memory: synStatus=10 [Device memory exhausted]"),
]


@pytest.mark.parametrize("cls, message", OOM_CASES, ids=[f"{c.name}-{i}" for i, (c, _) in enumerate(OOM_CASES)])
def test_oom_messages_recognised(cls, message):
    backend, _ = make(cls)
    assert backend.is_oom_error(RuntimeError(message))


@pytest.mark.parametrize("cls", DEVICE_BACKENDS)
def test_oom_error_type_recognised_and_unrelated_errors_rejected(cls):
    backend, _ = make(cls)
    assert backend.is_oom_error(torch.OutOfMemoryError("allocator gave up"))
    assert not backend.is_oom_error(RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)"))
    assert not backend.is_oom_error(RuntimeError())
    assert not backend.is_oom_error(KeyError("CUDA out of memory"))  # not a RuntimeError


def test_oom_messages_are_per_backend():
    cuda, _ = make(CUDABackend)
    xpu, _ = make(XPUBackend)
    assert not cuda.is_oom_error(RuntimeError("XPU out of memory"))
    assert not xpu.is_oom_error(RuntimeError("CUDA out of memory"))


# ---------------------------------------------------------------------- torch.accelerator preference
def _with_accelerator(cls=CUDABackend, omit=()):
    fake = FakeDeviceModule(count=2)
    acc = FakeAccelerator(count=3, omit=omit)
    return cls(module=fake, accelerator=acc), fake, acc


def test_accelerator_api_is_preferred_when_present():
    backend, fake, acc = _with_accelerator()
    assert backend.accelerator is acc
    assert backend.device_count() == 3
    backend.set_device(1)  # the device module's set_device is what a test patches, so it is the one called
    assert fake.called("set_device") == [(1,)] and acc.called("set_device_index") == []
    acc.set_device_index(2)
    assert backend.current_device() == 2
    backend.synchronize()
    assert acc.called("synchronize") == [()] and fake.called("synchronize") == []
    assert backend.memory_allocated() == 70_002
    assert backend.memory_reserved(0) == 80_000
    assert backend.max_memory_allocated(1) == 90_001
    backend.reset_peak_memory_stats()
    assert acc.called("reset_peak_memory_stats") == [(2,)]
    assert backend.mem_get_info() == (5 * GiB, 32 * GiB)
    backend.empty_cache()
    assert acc.called("empty_cache") == [()] and fake.called("empty_cache") == []
    assert fake.called("memory_allocated") == [] and fake.called("mem_get_info") == []


def test_module_answers_what_the_accelerator_api_lacks():
    backend, fake, acc = _with_accelerator(
        omit=("get_memory_info", "set_device_index", "current_device_index", "memory_reserved")
    )
    backend.set_device(1)
    assert fake.called("set_device") == [(1,)]
    assert backend.current_device() == 1
    assert backend.mem_get_info() == (4 * GiB + 1, 16 * GiB)
    assert backend.memory_reserved() == 2001
    assert backend.memory_allocated() == 70_001  # still from the accelerator API


def test_accelerator_detection(monkeypatch):
    acc = torch.accelerator
    monkeypatch.setattr(acc, "current_accelerator", lambda *a, **k: torch.device("xpu"))
    assert XPUBackend(module=FakeDeviceModule()).accelerator is acc
    assert CUDABackend(module=FakeDeviceModule()).accelerator is None
    monkeypatch.setattr(acc, "current_accelerator", lambda *a, **k: None)
    assert XPUBackend(module=FakeDeviceModule()).accelerator is None

    def broken(*a, **k):
        raise RuntimeError("no driver")

    monkeypatch.setattr(acc, "current_accelerator", broken)
    assert CUDABackend(module=FakeDeviceModule()).accelerator is None


# ---------------------------------------------------------------------- MPS through a fake module
def test_mps_forwards_to_its_module():
    fake = FakeDeviceModule()
    mps = MPSBackend(module=fake, accelerator=None)
    assert mps.memory_stats_capability.supported
    assert mps.memory_allocated() == 111
    assert mps.memory_reserved() == 222
    assert mps.mem_get_info() == (1000 - 222, 1000)
    mps.manual_seed(5)
    assert fake.called("manual_seed") == [(5,)]
    mps.synchronize()
    assert fake.called("synchronize") == [()]
    ev = mps.event(enable_timing=True)
    assert isinstance(ev, FakeEvent) and ev.enable_timing
    for unsupported in (mps.max_memory_allocated, mps.reset_peak_memory_stats, mps.stream, mps.current_stream):
        with pytest.raises(UnsupportedFeatureError) as info:
            unsupported()
        assert info.value.backend == "mps"
    with pytest.raises(UnsupportedFeatureError, match="streams"):
        mps.stream_context(None)
    t = torch.arange(4)
    assert mps.pin_memory(t) is t


class _PicklableProbe(DeviceModuleBackend):
    name = "probe"
    device_type = "cpu"

    @property
    def comm_backend(self):
        return None


def test_a_device_module_backend_pickles_without_its_module():
    """A prepared data loader (or anything else) that holds the backend must pickle: the cached
    ``torch.<device>`` module is dropped and looked up again (found on the emulated device)."""
    import pickle
    import types

    backend = _PicklableProbe(module=types.ModuleType("torch_probe"))
    assert backend.module is not None
    copy = pickle.loads(pickle.dumps(backend))
    assert copy.name == "probe" and copy.module is getattr(__import__("torch"), "cpu", None)
