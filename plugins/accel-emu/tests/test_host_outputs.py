"""Host kernels' results in device memory (adapter/host_outputs.cpp): a host kernel the fallback runs for
emu allocates its results, and its temporaries, in device memory, and the results become emu tensors
over that memory without a copy. Host tensors made anywhere else stay in host memory."""

from __future__ import annotations

import torch

import accel_emu


def test_emus_host_allocator_holds_the_hosts_place(emu):
    assert accel_emu.host_outputs_on_device()


def test_fallback_results_are_taken_over_not_copied_and_equal_the_hosts(emu):
    torch.manual_seed(0)
    a_cpu, b_cpu = torch.randn(32, 32), torch.randn(32, 32)
    a, b = a_cpu.to("emu"), b_cpu.to("emu")

    def ops(x, y):
        values, indices = torch.sort(x, dim=1)
        return [x + y, torch.relu(x), x.sum(), torch.mm(x, y), torch.softmax(x, -1), values, indices,
                torch.addcmul(x, x, y, value=0.5), torch.where(x > 0, x, y)]

    accel_emu.reset_fallback_calls()
    on_emu = ops(a, b)
    assert accel_emu.fallback_results_copied() == 0
    for got, expected in zip(on_emu, ops(a_cpu, b_cpu)):
        assert got.device.type == "emu"
        assert torch.equal(got.cpu(), expected)


def test_results_keep_the_layout_the_host_kernel_gave_them(emu):
    x_cpu = torch.randn(5, 4)
    x = x_cpu.to("emu")
    for make in (lambda t: t.t() * 2, lambda t: torch.exp(t[:, ::2])):
        got, expected = make(x), make(x_cpu)
        assert got.stride() == expected.stride() and got.storage_offset() == expected.storage_offset()
        assert torch.equal(got.cpu(), expected)


def test_results_and_temporaries_give_their_device_memory_back(emu):
    a = torch.randn(64, 64, device="emu")
    torch.emu.synchronize()
    before = torch.emu.memory_allocated()
    u, s, vh = torch.linalg.svd(a)  # LAPACK's host kernel allocates work buffers besides its results
    held = torch.emu.memory_allocated() - before
    assert held >= sum(t.numel() * t.element_size() for t in (u, s, vh))
    del u, s, vh
    assert torch.emu.memory_allocated() == before


def test_host_tensors_made_outside_a_kernel_stay_in_host_memory(emu):
    before = torch.emu.memory_allocated()
    host = torch.empty(1 << 20)
    host2 = torch.randn(100) + 1
    assert torch.emu.memory_allocated() == before
    assert host.untyped_storage().nbytes() == 4 << 20 and host2.device.type == "cpu"
