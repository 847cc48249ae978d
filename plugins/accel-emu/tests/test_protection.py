"""Host code may not read device memory: device addresses are mapped without access; the device's
kernels and copies reach the same pages through a host window of their own."""

from __future__ import annotations

import signal

from conftest import run_python

_READ_DEVICE_POINTER = """
    import ctypes, torch, accel_emu
    accel_emu.load()
    t = torch.full((4,), 7.0, device="emu")
    print("value", t.cpu().tolist(), flush=True)
    print("host read", ctypes.c_float.from_address(t.data_ptr()).value, flush=True)
"""


def test_host_read_of_device_memory_segfaults():
    result = run_python(_READ_DEVICE_POINTER)
    assert "value [7.0, 7.0, 7.0, 7.0]" in result.stdout, result.stderr
    assert "host read" not in result.stdout
    assert result.returncode == -signal.SIGSEGV, (result.returncode, result.stderr[-2000:])


def test_protection_can_be_switched_off():
    result = run_python(_READ_DEVICE_POINTER, env={"ACCEL_EMU_PROTECT": "0"})
    assert result.returncode == 0, result.stderr
    assert "host read 7.0" in result.stdout


def test_protection_is_on_by_default(emu):
    from accel_emu._extension import load_extension

    assert load_extension().protection_enabled()


_READ_PAST_THE_END = """
    import ctypes, struct, torch, accel_emu
    from accel_emu._extension import load_extension
    accel_emu.load()
    before = torch.zeros(1024, device="emu")  # a closed neighbour, mapped right after or before
    block = torch.full((1024,), 3.0, device="emu")  # exactly one page: the tensor ends at a page boundary
    # what a host vector kernel does at a tensor's end: load a whole vector, use its first lanes
    vector = load_extension().launch(lambda t: ctypes.string_at(t.data_ptr() + t.nbytes - 4, 64), block)
    print("last element", struct.unpack("f", vector[:4])[0], flush=True)
"""


def test_kernel_may_load_a_vector_past_the_end_of_a_block():
    """Inductor's vectorised C++ kernels load a whole vector at a tensor's end and use only its first
    lanes; a block ending at a page boundary stays readable for that in the kernel's host window."""
    result = run_python(_READ_PAST_THE_END)
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    assert "last element 3.0" in result.stdout


_READ_DEVICE_ADDRESS_DURING_A_KERNEL = """
    import ctypes, torch, accel_emu
    from accel_emu._extension import load_extension
    accel_emu.load()
    t = torch.full((4,), 7.0, device="emu")
    address = t.data_ptr()
    def kernel(host):
        ctypes.c_float.from_address(host.data_ptr() + 4).value = 9.0  # the kernel writes through its window
        print("kernel sees", ctypes.c_float.from_address(host.data_ptr()).value, host.device, host.data_ptr() != address,
              flush=True)
    load_extension().launch(kernel, t)
    print("value", t.cpu().tolist(), flush=True)
    print("device address during a kernel", load_extension().launch(
        lambda host: ctypes.c_float.from_address(address).value, t), flush=True)
"""


def test_device_addresses_stay_closed_while_a_kernel_runs():
    """A kernel reads and writes the tensor through its host window; the tensor's own (device) address
    faults even while the kernel runs, so no other host code can read device memory at that moment."""
    result = run_python(_READ_DEVICE_ADDRESS_DURING_A_KERNEL)
    assert "kernel sees 7.0 cpu True" in result.stdout, (result.stdout, result.stderr[-2000:])
    assert "value [7.0, 9.0, 7.0, 7.0]" in result.stdout, result.stdout
    assert "device address during a kernel" not in result.stdout
    assert result.returncode == -signal.SIGSEGV, (result.returncode, result.stderr[-2000:])
