"""The host fallback's two paths, and tensor-type compatibility between emu and the host.

The direct path computes on host tensors over the operands' host windows: in-place and ``out=``
results must land in the device tensors themselves, an ``out=`` tensor of the wrong shape must be
resized on the device, and nothing may hand out a host tensor that aliases device memory.
"""

from __future__ import annotations

import torch

import accel_emu
from conftest import run_python


def _calls() -> dict[str, tuple[str, int]]:
    return {name: (path, calls) for name, path, calls in accel_emu.fallback_calls() if calls}


def test_in_place_and_out_land_in_the_device_tensor(emu):
    x = torch.arange(6.0, device="emu").reshape(2, 3)
    storage_before = x.untyped_storage().data_ptr()
    x.mul_(2).add_(1)
    assert x.untyped_storage().data_ptr() == storage_before
    assert x.cpu().tolist() == [[1.0, 3.0, 5.0], [7.0, 9.0, 11.0]]

    out = torch.empty(2, 3, device="emu")
    result = torch.add(x, 1, out=out)
    assert result is out and out.cpu().tolist() == [[2.0, 4.0, 6.0], [8.0, 10.0, 12.0]]

    # a strided (non-contiguous) view written in place changes only its elements
    base = torch.zeros(3, 4, device="emu")
    base[:, 1].fill_(5)
    base.t()[2].add_(7)
    expected = torch.zeros(3, 4)
    expected[:, 1] = 5
    expected.t()[2].add_(7)
    assert torch.equal(base.cpu(), expected)


def test_an_out_tensor_of_the_wrong_shape_is_resized_on_the_device(emu):
    a = torch.arange(12.0, device="emu").reshape(3, 4)
    out = torch.empty(0, device="emu")
    torch.sum(a, dim=0, out=out)
    assert out.device.type == "emu" and out.shape == (4,)
    assert out.cpu().tolist() == [12.0, 15.0, 18.0, 21.0]

    grown = torch.empty(2, device="emu")
    torch.mul(a, 2, out=grown)  # needs more memory than it has (torch warns about resizing a non-empty out)
    assert grown.device.type == "emu" and grown.shape == (3, 4)
    assert torch.equal(grown.cpu(), torch.arange(12.0).reshape(3, 4) * 2)


def test_a_resized_out_tensor_takes_the_layout_the_host_gives_it(emu):
    """The host lays a resized ``out=`` like its inputs (transposed here); emu's tensor must match."""
    host_t = torch.arange(12.0).reshape(3, 4).t()
    host_out = torch.empty(0)
    torch.mul(host_t, 2, out=host_out)
    device_out = torch.empty(0, device="emu")
    torch.mul(host_t.to("emu"), 2, out=device_out)
    assert device_out.shape == host_out.shape and device_out.stride() == host_out.stride()
    assert torch.equal(device_out.cpu(), host_out)


def test_common_operators_take_the_direct_path(emu):
    accel_emu.reset_fallback_calls()
    model = torch.nn.Linear(8, 4).to("emu")
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    loss = model(torch.randn(5, 8, device="emu")).square().mean()
    loss.backward()
    opt.step()
    calls = _calls()
    assert calls, "no operator went through the fallback"
    copying = {name for name, (path, _) in calls.items() if path == "copying"}
    assert not copying, f"operators copied through the host: {sorted(copying)}"


def test_results_are_new_device_memory_not_host_aliases(emu):
    x = torch.randn(4, 4, device="emu")
    for result in (x.relu(), torch.cat([x, x]), x.sort(dim=1).values, x.clone()):
        assert result.device.type == "emu"
        assert result.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
        torch.emu.synchronize()


def test_factory_with_an_explicit_device_index(emu):
    t = torch.randperm(5, device="emu:1")
    assert t.device == torch.device("emu:1") and sorted(t.cpu().tolist()) == [0, 1, 2, 3, 4]


def test_emu_and_host_tensors_are_shallow_copy_compatible(emu):
    param = torch.nn.Parameter(torch.ones(3))
    host, device = torch.zeros(3), torch.zeros(3, device="emu")
    assert torch._has_compatible_shallow_copy_type(device, host)
    assert torch._has_compatible_shallow_copy_type(host, device)
    param.data = device
    assert param.device.type == "emu" and isinstance(param, torch.nn.Parameter)
    param.data = host  # FSDP1's offload of a full state dict to the host does this
    assert param.device.type == "cpu"
    assert not torch._has_compatible_shallow_copy_type(device, torch.zeros(3).to_sparse())


def test_module_to_keeps_parameters_and_tied_weights(emu):
    embedding = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = embedding.weight  # tied
    model = torch.nn.ModuleDict({"embedding": embedding, "head": head})
    before = [id(p) for p in model.parameters()]
    model.to("emu")
    assert [id(p) for p in model.parameters()] == before, "Module.to replaced the Parameter objects"
    assert model["head"].weight is model["embedding"].weight and model["head"].weight.device.type == "emu"
    model.cpu()
    assert model["head"].weight is model["embedding"].weight and model["head"].weight.device.type == "cpu"


def test_host_code_still_cannot_read_device_memory():
    # the direct path opens memory only while a kernel runs: a host read afterwards still faults
    result = run_python(
        """
        import ctypes, torch, accel_emu
        accel_emu.load()
        x = torch.ones(1024, device="emu")
        y = (x * 2).sum()
        print("value", y.item(), flush=True)
        ctypes.c_float.from_address(x.data_ptr()).value
        print("read device memory from the host")
        """
    )
    assert "value 2048.0" in result.stdout, result.stderr[-2000:]
    assert "read device memory from the host" not in result.stdout
    assert result.returncode != 0


def test_a_kernel_that_flips_the_conj_bit_of_its_out_tensor(emu):
    # linalg_lu_solve(left=False) leaves conjugated values in `out` and sets its conj bit instead of
    # conjugating them; the bit set on the host alias must reach the device tensor's values
    g = torch.Generator().manual_seed(0)
    a = torch.randn(3, 3, dtype=torch.complex64, generator=g) + 3 * torch.eye(3)
    b = torch.randn(4, 3, dtype=torch.complex64, generator=g)
    lu, pivots = torch.linalg.lu_factor(a)
    for adjoint in (False, True):
        want = torch.linalg.lu_solve(lu, pivots, b, left=False, adjoint=adjoint)
        got = torch.linalg.lu_solve(lu.to("emu"), pivots.to("emu"), b.to("emu"), left=False, adjoint=adjoint)
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)
        out = torch.empty(4, 3, dtype=torch.complex64, device="emu")
        torch.linalg.lu_solve(lu.to("emu"), pivots.to("emu"), b.to("emu"), left=False, adjoint=adjoint, out=out)
        torch.testing.assert_close(out.cpu(), want, rtol=0, atol=0)


def test_sparse_tensors_are_refused_with_a_clear_error(emu):
    import pytest

    dense = torch.tensor([[0.0, 1.0], [2.0, 0.0]])
    attempts = {
        "csr to emu": lambda: dense.to_sparse_csr().to("emu"),
        "csc to emu": lambda: dense.to_sparse_csc().to("emu"),
        "coo to emu": lambda: dense.to_sparse().to("emu"),
        "to_sparse on emu": lambda: dense.to("emu").to_sparse(),
        "to_sparse_csr on emu": lambda: dense.to("emu").to_sparse_csr(),
        "csr factory": lambda: torch.sparse_csr_tensor(
            torch.tensor([0, 1, 2]), torch.tensor([1, 0]), torch.tensor([1.0, 2.0]), (2, 2), device="emu"
        ),
        "empty coo": lambda: torch.empty(2, 2, layout=torch.sparse_coo, device="emu"),
    }
    for name, attempt in attempts.items():
        with pytest.raises(NotImplementedError, match="emu supports only strided"):
            attempt()
    # the dense tensor and the device are untouched
    assert torch.equal((dense.to("emu") * 2).cpu(), dense * 2)
