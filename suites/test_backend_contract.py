"""The Backend contract, asked of the backend under test.

Every method either answers with a value that makes sense or raises ``UnsupportedFeatureError``
with a reason; no other exception is acceptable, because callers (state, precision, the harness,
reports) rely on that to say *why* a feature is missing. Where a capability says "supported", the
feature is exercised for real on the device.
"""

from __future__ import annotations

import json
import multiprocessing
import time
import warnings

import pytest
import torch
import torch.distributed as dist

from _suite_utils import contract_call, to_host_list
from accel.backends.base import Availability, Capability, DeviceProperties, Timer, UnsupportedFeatureError
from accel.utils.dataclasses import DistributedType

SIZEABLE_BYTES = 64 * 2**20  # above glibc's largest mmap threshold, so host memory is fresh pages


def _capability(name: str, cap: object) -> Capability:
    assert isinstance(cap, Capability), f"{name} must be a Capability, got {type(cap).__name__}"
    assert isinstance(cap.supported, bool), f"{name}.supported must be a bool, got {cap.supported!r}"
    assert isinstance(cap.reason, str) and cap.reason.strip(), f"{name} answers {cap.supported} without a reason"
    return cap


def test_identity_and_availability(backend):
    assert isinstance(backend.name, str) and backend.name == backend.name.strip().lower() and backend.name
    assert isinstance(backend.device_type, str) and backend.device_type
    availability = backend.availability
    assert isinstance(availability, Availability)
    assert availability.available is True and backend.is_available() is True
    assert isinstance(availability.reason, str) and availability.reason.strip(), "availability without a reason"
    backend.require_available()
    assert backend.start_method in multiprocessing.get_all_start_methods()
    assert isinstance(backend.priority, int)
    assert isinstance(backend.use_host_timers, bool)
    assert isinstance(backend.compile_backend, str) and backend.compile_backend
    assert backend.visible_devices_env is None or (isinstance(backend.visible_devices_env, str) and backend.visible_devices_env)
    DistributedType(backend.distributed_type)  # a member Accelerate knows
    assert isinstance(backend.torch_version.release, tuple)
    assert isinstance(backend.autocast_device_type, str) and backend.autocast_device_type
    for message in backend.oom_messages:
        assert isinstance(message, str) and message.strip()


def test_devices_and_synchronize(backend, device):
    count = backend.device_count()
    assert isinstance(count, int) and count >= 1
    devices = backend.devices()
    assert len(devices) == count
    assert all(isinstance(d, torch.device) and d.type == backend.device_type for d in devices)
    assert device.type == backend.device_type
    current = backend.current_device()
    assert isinstance(current, int) and 0 <= current < count
    assert backend.device() == backend.device(current)
    with pytest.raises(ValueError):
        backend.device(count)  # out of range: a clear ValueError, not a torch crash
    backend.set_device(current)
    assert backend.current_device() == current
    t = torch.arange(6, device=device, dtype=torch.float32) * 2
    backend.synchronize()
    backend.synchronize(current)
    assert t.device.type == backend.device_type
    assert to_host_list(t) == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]


def test_rng_seed_and_state_round_trip_on_device(backend, device):
    saved = backend.get_rng_state()
    assert isinstance(saved, torch.Tensor)
    try:
        backend.manual_seed(1234)
        first = torch.rand(16, device=device)
        backend.manual_seed(1234)
        again = torch.rand(16, device=device)
        assert torch.equal(first, again), "manual_seed did not reproduce the device's draws"
        backend.manual_seed(4321)
        assert not torch.equal(torch.rand(16, device=device), first), "different seeds gave the same draws"

        state = backend.get_rng_state()
        assert isinstance(state, torch.Tensor)
        drawn = torch.rand(16, device=device)
        torch.rand(16, device=device)  # move on
        backend.set_rng_state(state)
        replay = torch.rand(16, device=device)
        assert torch.equal(drawn, replay), "set_rng_state(get_rng_state()) did not replay the device's draws"
        index = backend.current_device()
        state_at_index = backend.get_rng_state(index)
        drawn = torch.rand(4, device=device)
        backend.set_rng_state(state_at_index, index)
        assert torch.equal(drawn, torch.rand(4, device=device))
    finally:
        backend.set_rng_state(saved)


def test_memory_statistics(backend, device):
    cap = _capability("memory_stats_capability", backend.memory_stats_capability)
    assert backend.has_memory_stats is cap.supported
    features = ("memory_allocated", "memory_reserved", "max_memory_allocated", "reset_peak_memory_stats", "mem_get_info")
    if not cap.supported:
        for feature in features:
            with pytest.raises(UnsupportedFeatureError) as info:
                getattr(backend, feature)()
            assert info.value.reason.strip()
        backend.empty_cache()
        return

    for feature in ("memory_allocated", "memory_reserved", "max_memory_allocated"):
        ok, value = contract_call(feature, getattr(backend, feature))
        if ok:
            assert isinstance(value, int) and value >= 0, f"{feature}() = {value!r}"
    ok, info = contract_call("mem_get_info", backend.mem_get_info)
    if ok:
        free, total = info
        assert isinstance(free, int) and isinstance(total, int)
        assert total > 0 and 0 <= free <= total, f"mem_get_info() = {info!r}"

    backend.synchronize()
    has_allocated, before = contract_call("memory_allocated", backend.memory_allocated)
    has_reset, _ = contract_call("reset_peak_memory_stats", backend.reset_peak_memory_stats)
    has_peak, peak_before = contract_call("max_memory_allocated", backend.max_memory_allocated)
    assert has_allocated or (has_reset and has_peak), "memory stats are 'supported' but neither current nor peak is measurable"
    block = torch.ones(SIZEABLE_BYTES // 4, dtype=torch.float32, device=device)
    backend.synchronize()
    grew = []
    if has_allocated:
        grew.append(backend.memory_allocated() - before)
    if has_reset and has_peak:
        grew.append(backend.max_memory_allocated() - peak_before)
    del block
    backend.empty_cache()
    backend.synchronize()
    assert max(grew) >= SIZEABLE_BYTES // 2, (
        f"allocating {SIZEABLE_BYTES} bytes on {device} raised memory_allocated/peak only by {grew} bytes"
    )


def test_empty_cache_and_pin_memory(backend, device):
    backend.empty_cache()  # never raises: a no-op where there is no cache
    host = torch.arange(8, dtype=torch.float32)
    ok, pinned = contract_call("pin_memory", backend.pin_memory, host)
    if ok:
        assert isinstance(pinned, torch.Tensor) and pinned.device.type == "cpu"
        assert torch.equal(pinned, host)
        on_device = pinned.to(device, non_blocking=True)
        backend.synchronize()
        assert to_host_list(on_device) == host.tolist()


def test_streams_and_events(backend, device):
    ok_stream, stream = contract_call("stream", backend.stream)
    ok_current, _ = contract_call("current_stream", backend.current_stream)
    if ok_stream:
        assert ok_current, "stream() works but current_stream() does not"
        ok_ctx, ctx = contract_call("stream_context", backend.stream_context, stream)
        assert ok_ctx, "stream() works but stream_context() does not"
        with ctx:
            t = torch.full((4,), 3.0, device=device) * 2
        backend.synchronize()
        assert to_host_list(t) == [6.0] * 4
    else:
        ok_ctx, _ = contract_call("stream_context", backend.stream_context, None)
        assert not ok_ctx, "stream_context() works while stream() says streams are unsupported"

    ok_event, start = contract_call("event", backend.event, enable_timing=True)
    if not backend.use_host_timers:
        assert ok_event, "device-event timing is used (use_host_timers=False), but event() is unsupported"
    if ok_event:
        end = backend.event(enable_timing=True)
        start.record()
        torch.ones(64, 64, device=device) @ torch.ones(64, 64, device=device)
        end.record()
        end.synchronize()
        assert start.elapsed_time(end) >= 0


def test_timer_measures_a_known_sleep(backend, device):
    timer = backend.timer()
    assert isinstance(timer, Timer)
    with timer as measured:
        time.sleep(0.05)
    assert measured is timer and isinstance(timer.elapsed, float)
    assert 0.025 <= timer.elapsed <= 5.0, f"a 50 ms sleep measured {timer.elapsed:.4f} s"
    a = torch.ones(128, 128, device=device)
    with timer:
        for _ in range(4):
            a = a @ a / 128
    assert 0.0 <= timer.elapsed <= 5.0
    assert to_host_list(a[0, :2]) == [1.0, 1.0]


def test_dtype_capabilities(backend, device):
    for name in ("supports_fp16", "supports_bf16", "supports_fp8"):
        _capability(name, getattr(backend, name))
    for dtype, cap in ((torch.float16, backend.supports_fp16), (torch.bfloat16, backend.supports_bf16)):
        assert backend.dtype_capability(dtype) == cap
        if cap.supported:  # it really computes there
            a = torch.full((8, 8), 0.5, dtype=dtype, device=device)
            b = a @ a + a
            assert b.dtype == dtype and b.device.type == backend.device_type
            assert to_host_list(b[0, :3]) == [2.5, 2.5, 2.5]
    caps = backend.capabilities()
    assert {"memory_stats", "multiprocess", "fp16", "bf16", "fp8", "fp16_amp", "bf16_amp", "grad_scaler"} <= set(caps)
    for key, cap in caps.items():
        _capability(f"capabilities()[{key!r}]", cap)
    assert caps["multiprocess"].supported == (backend.comm_backend is not None)


def _dtype_under_autocast(context_factory, device: torch.device) -> torch.dtype | None:
    layer = torch.nn.Linear(4, 4).to(device)
    x = torch.ones(2, 4, device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns and disables autocast for an unsupported dtype
        try:
            with context_factory():
                return layer(x).dtype
        except (RuntimeError, ValueError, TypeError, AssertionError):
            return None


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_amp_capability_matches_autocast(backend, device, dtype):
    cap = _capability(f"amp_capability({dtype})", backend.amp_capability(dtype))
    short = {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]
    assert getattr(backend, f"supports_{short}_amp") == cap
    raw = _dtype_under_autocast(lambda: torch.autocast(backend.autocast_device_type, dtype=dtype), device)
    through_backend = _dtype_under_autocast(lambda: backend.autocast(dtype), device)
    if cap.supported:
        assert raw == dtype, f"amp_capability says {dtype} autocast works ({cap.reason}) but the Linear ran in {raw}"
        assert through_backend == dtype
    else:
        assert raw != dtype, f"amp_capability says no ({cap.reason}) but autocast ran the Linear in {dtype}"
    disabled = _dtype_under_autocast(lambda: backend.autocast(dtype, enabled=False), device)
    assert disabled == torch.float32


def test_grad_scaler_when_capable(backend, device):
    cap = _capability("grad_scaler_capability", backend.grad_scaler_capability)
    if not cap.supported:
        with pytest.raises(UnsupportedFeatureError) as info:
            backend.grad_scaler()
        assert info.value.reason.strip()
        return
    assert backend.supports_fp16_amp.supported, "a GradScaler without fp16 autocast makes no sense"
    scaler = backend.grad_scaler(init_scale=16.0)
    assert isinstance(scaler, torch.amp.GradScaler)
    weight = torch.nn.Parameter(torch.ones(3, device=device))
    optimizer = torch.optim.SGD([weight], lr=0.5)
    loss = (weight * 2).sum()
    scaled = scaler.scale(loss)
    assert to_host_list(scaled) == pytest.approx(6.0 * 16.0)
    scaled.backward()
    scaler.step(optimizer)
    scaler.update()
    assert to_host_list(weight.detach()) == pytest.approx([0.0, 0.0, 0.0])  # 1 - 0.5 * 2 after unscaling


def test_oom_error_recognition(backend):
    assert backend.is_oom_error(torch.OutOfMemoryError("synthetic"))
    for message in backend.oom_messages:
        synthetic = RuntimeError(f"synthetic: {message}. Tried to allocate 2.00 GiB")
        assert backend.is_oom_error(synthetic), f"{message!r} not recognised as out-of-memory"
    assert not backend.is_oom_error(RuntimeError("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)"))
    assert not backend.is_oom_error(ValueError("out of patience"))
    assert not backend.is_oom_error(KeyError("memory"))


def test_device_properties_and_describe(backend):
    props = backend.device_properties(0)
    assert isinstance(props, DeviceProperties)
    assert isinstance(props.name, str) and props.name.strip()
    assert isinstance(props.total_memory, int) and props.total_memory > 0, f"total_memory = {props.total_memory!r}"
    json.dumps(props.as_dict())
    described = backend.describe()
    text = json.dumps(described)  # JSON-serialisable as it is
    again = json.loads(text)
    assert again["name"] == backend.name and again["available"] is True
    assert again["device_count"] == backend.device_count()
    assert len(again["devices"]) == backend.device_count()
    assert "error" not in again and not any("error" in d for d in again["devices"]), again


def test_comm_backend_is_known_to_torch(backend):
    comm = backend.comm_backend
    if comm is None:
        reason = backend.comm_backend_reason()
        assert isinstance(reason, str) and reason.strip(), "no collective backend and no reason"
        assert backend.supports_multiprocess() is False
        return
    assert isinstance(comm, str) and comm
    assert dist.is_available(), f"comm_backend {comm!r} without torch.distributed"
    assert dist.is_backend_available(comm), f"torch.distributed does not know the collective backend {comm!r}"
    assert backend.supports_multiprocess() is True


@pytest.mark.require_deepspeed
def test_deepspeed_agrees_when_told_this_backend(backend):
    """DS_ACCELERATOR=<this device type>, or the accelerator the backend brings (installed as accel does):
    DeepSpeed must use the same device and collective library."""
    import os

    from accel.backends.deepspeed_agreement import compare, probe_deepspeed

    answer = probe_deepspeed({**os.environ, "DS_ACCELERATOR": backend.device_type}, backend=backend)
    result = compare(backend, answer)
    assert result["agree"], "; ".join(result["problems"])


@pytest.mark.require_deepspeed
def test_deepspeed_detects_the_backend_accel_selects(backend):
    """Left to itself (no DS_ACCELERATOR), DeepSpeed must pick what accel's registry picks (a backend that brings
    its own DeepSpeed accelerator has it installed, as accel does wherever DeepSpeed runs on it)."""
    import os

    from accel.backends import get_registry
    from accel.backends.deepspeed_agreement import compare, probe_deepspeed
    from accel_harness import markers

    if os.environ.get("ACCEL_DEVICE", "").strip():
        pytest.skip(markers.format_skip(markers.SkipReason(
            markers.NOT_ON_BACKEND, "ACCEL_DEVICE overrides accel's detection, so there is no detection to compare")))
    selected = get_registry().select()
    if selected.name != backend.name:
        pytest.skip(markers.format_skip(markers.SkipReason(
            markers.BACKEND_NOT_SELECTED, f"accel selects {selected.name} on this machine, not {backend.name}")))
    environ = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    result = compare(backend, probe_deepspeed(environ, backend=backend))
    assert result["agree"], "; ".join(result["problems"])
