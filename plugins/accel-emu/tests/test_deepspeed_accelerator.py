"""emu's DeepSpeed accelerator: the backend names it, and it answers DeepSpeed's interface on emu."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("deepspeed", reason="DeepSpeed is not installed")

from accel_emu import COMM_BACKEND  # noqa: E402
from accel_emu.backend import EmuBackend  # noqa: E402


@pytest.fixture(scope="module")
def accelerator():
    backend = EmuBackend()
    backend.request()
    return backend.create_deepspeed_accelerator()


def test_the_backend_names_an_accelerator_deepspeed_accepts(accelerator):
    from deepspeed.accelerator import DeepSpeedAccelerator
    from deepspeed.accelerator.real_accelerator import _validate_accelerator

    assert EmuBackend().deepspeed_accelerator == "accel_emu.deepspeed_accelerator:EmuAccelerator"
    assert isinstance(accelerator, DeepSpeedAccelerator)
    _validate_accelerator(accelerator)  # what set_accelerator checks


def test_device_names_and_communication_backend(accelerator):
    assert accelerator.device_name() == "emu" and accelerator.device_name(1) == "emu:1"
    assert accelerator.current_device_name() == f"emu:{torch.emu.current_device()}"
    assert accelerator.device_count() == torch.emu.device_count() >= 1
    assert accelerator.communication_backend_name() == COMM_BACKEND == EmuBackend().comm_backend
    assert torch.device(accelerator.device_name(0)).type == "emu"


def test_on_accelerator_tells_emu_tensors_from_host_ones(accelerator):
    assert accelerator.on_accelerator(torch.ones(2, device="emu"))
    assert not accelerator.on_accelerator(torch.ones(2))
    assert accelerator.FloatTensor([1.0, 2.0]).device.type == "emu"
    assert accelerator.HalfTensor([1.0]).dtype == torch.float16


def test_memory_statistics_follow_allocations(accelerator):
    accelerator.synchronize()
    before = accelerator.memory_allocated(0)
    block = torch.empty(1 << 20, dtype=torch.uint8, device="emu:0")
    assert accelerator.memory_allocated(0) >= before + (1 << 20)
    assert accelerator.max_memory_allocated(0) >= accelerator.memory_allocated(0)
    assert accelerator.memory_stats(0)["allocated_bytes.all.current"] == accelerator.memory_allocated(0)
    assert accelerator.memory_reserved(0) >= accelerator.memory_allocated(0)
    del block
    assert accelerator.memory_allocated(0) == before
    assert accelerator.total_memory(0) == torch.emu.get_device_properties(0).total_memory
    assert 0 < accelerator.available_memory(0) <= accelerator.total_memory(0)


def test_streams_and_events_are_emus(accelerator):
    stream = accelerator.Stream()
    with accelerator.stream(stream):
        assert accelerator.current_stream().stream_id == stream.stream_id
        start, end = accelerator.Event(enable_timing=True), accelerator.Event(enable_timing=True)
        start.record()
        torch.ones(64, 64, device="emu") @ torch.ones(64, 64, device="emu")
        end.record()
    end.synchronize()
    assert start.elapsed_time(end) >= 0.0
    assert accelerator.current_stream().stream_id == accelerator.default_stream().stream_id


def test_rng_state_round_trips(accelerator):
    accelerator.manual_seed(1234)
    state = accelerator.get_rng_state(0)
    first = torch.rand(4, device="emu:0")
    accelerator.set_rng_state(state, 0)
    assert torch.equal(torch.rand(4, device="emu:0"), first)
    assert accelerator.initial_seed() == 1234


def test_pinned_host_memory(accelerator):
    pinned = accelerator.pin_memory(torch.ones(8))
    assert pinned.is_pinned() and accelerator.is_pinned(pinned)


def test_host_op_builders_only(accelerator):
    from deepspeed.ops.op_builder.cpu import CPUAdamBuilder, NotImplementedBuilder

    assert accelerator.get_op_builder("CPUAdamBuilder") is CPUAdamBuilder  # offloaded optimizers run on the host
    assert accelerator.get_op_builder("FusedAdamBuilder") is NotImplementedBuilder  # no emu kernels to build
    assert isinstance(accelerator.create_op_builder("CPUAdamBuilder"), CPUAdamBuilder)


def test_accel_installs_it_for_deepspeed():
    from deepspeed.accelerator import get_accelerator, set_accelerator

    from accel.backends.deepspeed_agreement import install_deepspeed_accelerator

    previous = get_accelerator()
    backend = EmuBackend()
    backend.request()
    try:
        installed = install_deepspeed_accelerator(backend)
        assert get_accelerator() is installed and type(installed).__name__ == "EmuAccelerator"
        assert install_deepspeed_accelerator(backend) is installed
    finally:
        set_accelerator(previous)
