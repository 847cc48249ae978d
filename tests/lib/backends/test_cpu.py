"""Every Backend method, run for real on the host CPU."""

from __future__ import annotations

import json

import pytest
import torch

from accel.backends import Availability, BackendUnavailableError, Capability, DeviceProperties, Timer, UnsupportedFeatureError
from accel.backends.cpu import CPUBackend

CAPABILITY_KEYS = {"memory_stats", "multiprocess", "fp16", "bf16", "fp8", "fp16_amp", "bf16_amp", "grad_scaler"}


@pytest.fixture
def cpu(monkeypatch) -> CPUBackend:
    monkeypatch.delenv("ACCEL_CPU_COMM_BACKEND", raising=False)
    return CPUBackend()


# ---------------------------------------------------------------------- identity and devices
def test_identity(cpu):
    assert (cpu.name, cpu.device_type) == ("cpu", "cpu")
    assert cpu.start_method == "fork"
    assert cpu.distributed_type == "MULTI_CPU"
    assert cpu.use_host_timers is True
    assert cpu.visible_devices_env is None
    assert cpu.priority > 100  # after every accelerator
    assert repr(cpu) == "<CPUBackend 'cpu'>"


def test_availability(cpu):
    avail = cpu.availability
    assert isinstance(avail, Availability) and avail.available
    assert "host CPU" in avail.reason
    assert cpu.is_available()
    cpu.require_available()


def test_devices(cpu):
    assert cpu.device_count() == 1
    assert cpu.device() == torch.device("cpu")
    assert cpu.device(0) == torch.device("cpu")
    assert cpu.devices() == [torch.device("cpu")]
    for bad in (1, -1):
        with pytest.raises(ValueError, match=f"device index {bad} out of range"):
            cpu.device(bad)


def test_set_current_device_and_synchronize(cpu):
    cpu.set_device(0)
    assert cpu.current_device() == 0
    with pytest.raises(ValueError, match="out of range"):
        cpu.set_device(1)
    assert cpu.synchronize() is None
    assert cpu.synchronize(0) is None


# ---------------------------------------------------------------------- RNG
def test_manual_seed_reproduces_numbers(cpu):
    cpu.manual_seed(1234)
    a = torch.rand(8)
    cpu.manual_seed(1234)
    b = torch.rand(8)
    assert torch.equal(a, b)
    cpu.manual_seed(4321)
    assert not torch.equal(torch.rand(8), a)


def test_rng_state_round_trip(cpu):
    cpu.manual_seed(7)
    torch.rand(3)  # advance the generator a little
    state = cpu.get_rng_state()
    assert isinstance(state, torch.Tensor) and state.dtype == torch.uint8
    first = torch.randn(16)
    cpu.set_rng_state(state)
    second = torch.randn(16)
    assert torch.equal(first, second)
    assert torch.equal(cpu.get_rng_state(0), torch.get_rng_state())
    with pytest.raises(ValueError):
        cpu.get_rng_state(1)
    with pytest.raises(ValueError):
        cpu.set_rng_state(state, 1)


# ---------------------------------------------------------------------- memory
def test_memory_figures(cpu):
    assert cpu.has_memory_stats and cpu.memory_stats_capability.reason
    allocated = cpu.memory_allocated()
    assert allocated > 0
    assert cpu.memory_reserved() > 0
    assert cpu.max_memory_allocated() >= allocated
    free, total = cpu.mem_get_info()
    assert 0 < free <= total
    assert cpu.empty_cache() is None


def test_peak_memory_rises_after_reset(cpu):
    try:
        cpu.reset_peak_memory_stats()
    except UnsupportedFeatureError as exc:  # documented: some kernels/sandboxes refuse the reset
        assert exc.feature == "reset_peak_memory_stats" and exc.reason
        pytest.skip(f"cannot reset the peak RSS here: {exc.reason}")
    before = cpu.max_memory_allocated()
    big = torch.ones(50 * 1024 * 1024)  # 200 MiB, every page written
    big += 1
    after = cpu.max_memory_allocated()
    assert float(big[-1]) == 2.0
    del big
    assert after - before >= 150 * 1024 * 1024, (before, after)
    assert cpu.max_memory_allocated() >= after - 1024 * 1024  # the peak stays after freeing


# ---------------------------------------------------------------------- streams, events, timing
def test_streams(cpu):
    stream = cpu.stream()
    assert stream is not None
    assert cpu.current_stream() is not None
    with cpu.stream_context(stream):
        x = torch.ones(4) * 2
    assert x.sum().item() == 8


def test_events_are_unsupported(cpu):
    with pytest.raises(UnsupportedFeatureError) as info:
        cpu.event(enable_timing=True)
    assert info.value.backend == "cpu" and info.value.feature == "events"
    assert isinstance(info.value, NotImplementedError)


def test_timer_measures_with_the_host_clock(cpu, timer_clock):
    timer = cpu.timer()
    assert isinstance(timer, Timer) and timer.elapsed is None
    with timer as t:
        timer_clock.advance(0.25)
    assert t.elapsed == 0.25
    with timer:
        pass
    assert timer.elapsed == 0.0  # a reused timer measures afresh


def test_pin_memory_returns_equal_tensor(cpu):
    t = torch.arange(10, dtype=torch.float32)
    pinned = cpu.pin_memory(t)
    assert torch.equal(pinned, t)


# ---------------------------------------------------------------------- dtypes and AMP
def test_dtype_capabilities(cpu):
    for cap in (cpu.supports_fp16, cpu.supports_bf16, cpu.dtype_capability(torch.float32)):
        assert isinstance(cap, Capability) and cap.supported, cap.reason
        assert "cpu" in cap.reason


def test_fp8_probe_answers_with_reason(cpu):
    cap = cpu.supports_fp8
    assert isinstance(cap, Capability)
    assert cap.reason
    if cap.supported:  # then an fp8 matmul really runs here
        a = torch.ones(16, 16).to(torch.float8_e4m3fn)
        assert float((a @ a)[0, 0].float()) == 16.0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_amp_supported_and_autocast_really_runs(cpu, dtype):
    cap = cpu.amp_capability(dtype)
    assert cap.supported, cap.reason
    layer = torch.nn.Linear(8, 4)
    with cpu.autocast(dtype):
        out = layer(torch.randn(3, 8))
    assert out.dtype == dtype
    with cpu.autocast(dtype, enabled=False):
        assert layer(torch.randn(3, 8)).dtype == torch.float32
    assert cpu.autocast_device_type == "cpu"


def test_grad_scaler(cpu):
    assert cpu.grad_scaler_capability.supported
    scaler = cpu.grad_scaler(init_scale=1024.0)
    assert isinstance(scaler, torch.amp.GradScaler)
    assert scaler.scale(torch.tensor(2.0)).item() == 2048.0


# ---------------------------------------------------------------------- errors
def test_is_oom_error_on_message(cpu):
    err = RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes")
    assert cpu.is_oom_error(err)
    assert not cpu.is_oom_error(RuntimeError("expected scalar type Float but found Half"))
    assert not cpu.is_oom_error(ValueError("DefaultCPUAllocator: can't allocate memory"))


def test_is_oom_error_on_real_allocation_failure(cpu):
    with pytest.raises(RuntimeError) as info:
        torch.empty(10**15, dtype=torch.uint8)  # 1 PB: more than any address space holds
    assert cpu.is_oom_error(info.value), str(info.value)


# ---------------------------------------------------------------------- description
def test_device_properties(cpu):
    props = cpu.device_properties()
    assert isinstance(props, DeviceProperties)
    assert props.index == 0 and props.name
    assert props.total_memory and props.total_memory >= cpu.mem_get_info()[1] // 2
    assert props.extra["logical_cores"] >= 1
    with pytest.raises(ValueError):
        cpu.device_properties(1)


def test_capabilities(cpu):
    caps = cpu.capabilities()
    assert set(caps) == CAPABILITY_KEYS
    assert all(isinstance(c, Capability) and c.reason for c in caps.values())
    for key in ("memory_stats", "multiprocess", "fp16", "bf16", "fp16_amp", "bf16_amp", "grad_scaler"):
        assert caps[key].supported, (key, caps[key])
    assert caps["multiprocess"].reason == "gloo"


def test_describe_is_json_serialisable(cpu):
    info = cpu.describe()
    round_trip = json.loads(json.dumps(info))
    assert round_trip["name"] == "cpu" and round_trip["available"] is True
    assert round_trip["device_count"] == 1
    assert len(round_trip["devices"]) == 1 and round_trip["devices"][0]["name"]
    assert set(round_trip["capabilities"]) == CAPABILITY_KEYS
    assert round_trip["capabilities"]["fp16_amp"]["supported"] is True
    assert round_trip["comm_backend"] == "gloo"
    assert round_trip["start_method"] == "fork"
    assert round_trip["timing"] == "host timers"


def test_comm_backend(cpu, monkeypatch):
    assert cpu.comm_backend == "gloo"
    assert cpu.supports_multiprocess()
    monkeypatch.setenv("ACCEL_CPU_COMM_BACKEND", " MPI ")
    assert cpu.comm_backend == "mpi"
    monkeypatch.setenv("ACCEL_CPU_COMM_BACKEND", "nccl")
    with pytest.raises(ValueError, match="'nccl'"):
        cpu.comm_backend
    # reports survive the misconfiguration and name it
    info = json.loads(json.dumps(cpu.describe()))
    assert info["available"] is True and "nccl" in info["error"]
    assert "nccl" in cpu.capabilities()["multiprocess"].reason


def test_ccl_comm_backend_needs_oneccl_bindings(cpu, monkeypatch):
    import importlib.util

    monkeypatch.setenv("ACCEL_CPU_COMM_BACKEND", "ccl")
    if importlib.util.find_spec("oneccl_bindings_for_pytorch") is not None:
        assert cpu.comm_backend == "ccl"
        return
    with pytest.raises(BackendUnavailableError, match="oneccl_bindings_for_pytorch"):
        cpu.comm_backend
    # a capability report must survive the misconfiguration and say what is wrong
    caps = cpu.capabilities()
    assert not caps["multiprocess"] and "oneccl_bindings_for_pytorch" in caps["multiprocess"].reason
    assert caps["fp16"].supported
