"""Kernels: numerics equal to the host, autograd, random numbers from the device's generator."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _pair(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    host = torch.randn(*shape, generator=g)
    return host, host.to("emu")


def test_ops_match_cpu(emu):
    a, ea = _pair(8, 16, seed=1)
    b, eb = _pair(16, 4, seed=2)
    pairs = [
        (a @ b, ea @ eb),
        (F.softmax(a, dim=1), F.softmax(ea, dim=1)),
        (a.cumsum(0), ea.cumsum(0)),
        (a.sort(dim=1).values, ea.sort(dim=1).values),
        (a.t().contiguous(), ea.t().contiguous()),
        (a[:, 3:7] * 2 - 1, ea[:, 3:7] * 2 - 1),
        (a.sum(), ea.sum()),
        (a.to(torch.float16).to(torch.float32), ea.to(torch.float16).to(torch.float32)),
    ]
    for host, dev in pairs:
        assert dev.device.type == "emu"
        torch.testing.assert_close(dev.cpu(), host, rtol=0, atol=0)


def test_histc_counts_integer_tensors_as_a_device_does(emu):
    """transformers' MoE routers call torch.histc on int32 expert indices off the host; the host's kernel has no
    integer version, CUDA's has (counts in the input's dtype)."""
    experts = torch.tensor([0, 3, 3, 1, 0, 3, 2, 2, 3], dtype=torch.int32)
    counts = torch.histc(experts.to("emu"), bins=4, min=0, max=3)
    assert counts.device.type == "emu" and counts.dtype == torch.int32
    assert counts.cpu().tolist() == [2, 1, 2, 4]
    values, device_values = _pair(64, seed=3)
    torch.testing.assert_close(torch.histc(device_values, bins=7).cpu(), torch.histc(values, bins=7), rtol=0, atol=0)


def test_conv_matches_cpu(emu):
    x, ex = _pair(2, 3, 8, 8, seed=3)
    w, ew = _pair(4, 3, 3, 3, seed=4)
    torch.testing.assert_close(F.conv2d(ex, ew, padding=1).cpu(), F.conv2d(x, w, padding=1), rtol=0, atol=0)


def test_mlp_forward_backward_matches_cpu(emu):
    torch.manual_seed(0)
    host = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    dev = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    dev.load_state_dict(host.state_dict())
    dev.to("emu")
    x, ex = _pair(8, 16, seed=5)
    y, ey = _pair(8, 4, seed=6)
    F.mse_loss(host(x), y).backward()
    loss = F.mse_loss(dev(ex), ey)
    loss.backward()
    for (name, p_host), p_dev in zip(host.named_parameters(), dev.parameters()):
        assert p_dev.grad.device.type == "emu", name
        torch.testing.assert_close(p_dev.grad.cpu(), p_host.grad, rtol=1e-6, atol=1e-7, msg=name)
    opt = torch.optim.AdamW(dev.parameters(), lr=0.1)
    opt.step()
    assert all(p.device.type == "emu" for p in dev.parameters())


def test_manual_seed_controls_device_random_numbers(emu):
    emu.manual_seed(7)
    a = torch.randn(5, device="emu")
    emu.manual_seed(7)
    torch.randn(100)  # the host generator is independent
    b = torch.randn(5, device="emu")
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_each_device_has_its_own_generator(emu):
    emu.manual_seed_all(3)
    a0 = torch.rand(4, device="emu:0").cpu()
    a1 = torch.rand(4, device="emu:1").cpu()
    torch.testing.assert_close(a0, a1, rtol=0, atol=0)  # same seed, separate streams of numbers
    state1 = emu.get_rng_state(1)
    torch.rand(4, device="emu:0")  # advances device 0 only
    assert torch.equal(emu.get_rng_state(1), state1)
    x = torch.rand(4, device="emu:1").cpu()
    emu.set_rng_state(state1, 1)
    torch.testing.assert_close(torch.rand(4, device="emu:1").cpu(), x, rtol=0, atol=0)
    assert emu.initial_seed() == 3


def test_dropout_uses_the_device_generator(emu):
    x = torch.ones(64, device="emu")
    emu.manual_seed(11)
    a = F.dropout(x, p=0.5, training=True).cpu()
    emu.manual_seed(11)
    b = F.dropout(x, p=0.5, training=True).cpu()
    assert torch.equal(a, b)
    assert 0 < int((a == 0).sum()) < 64


def test_torch_manual_seed_seeds_emu(emu):
    torch.manual_seed(21)
    a = torch.randn(3, device="emu").cpu()
    torch.manual_seed(21)
    b = torch.randn(3, device="emu").cpu()
    assert torch.equal(a, b)


def test_explicit_generator(emu):
    g = torch.Generator(device="emu").manual_seed(5)
    a = torch.randn(3, device="emu", generator=g).cpu()
    g.manual_seed(5)
    assert torch.equal(torch.randn(3, device="emu", generator=g).cpu(), a)


def test_mse_loss_matches_cpu_for_every_reduction_without_a_warning(emu):
    import warnings

    torch.manual_seed(0)
    x, y = torch.randn(4, 3), torch.randn(4, 3)
    for reduction in ("mean", "sum", "none"):
        leaf = x.to("emu").requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the composite path's resize warning fails here
            loss = F.mse_loss(leaf, y.to("emu"), reduction=reduction)
            loss.sum().backward()
        host_leaf = x.clone().requires_grad_()
        host = F.mse_loss(host_leaf, y, reduction=reduction)
        host.sum().backward()
        assert loss.shape == host.shape
        assert torch.allclose(loss.cpu(), host)
        assert torch.allclose(leaf.grad.cpu(), host_leaf.grad)


def test_conjugate_and_negative_views_copy_and_compute():
    # a copy of a conjugate view to, from or within emu recursed until the stack overflowed
    # (SIGSEGV), so this runs in a child process
    from conftest import run_python

    result = run_python(
        """
        import torch, accel_emu
        accel_emu.load()
        g = torch.Generator().manual_seed(0)
        x = torch.randn(5, 6, 7, generator=g)
        c = torch.randn(4, 3, dtype=torch.complex64, generator=g)
        e = c.to("emu")
        checks = {
            "ifft of a real input": (torch.fft.ifft(x.to("emu"), n=10, dim=1).cpu(), torch.fft.ifft(x, n=10, dim=1)),
            "ihfft": (torch.fft.ihfft(x.to("emu")).cpu(), torch.fft.ihfft(x)),
            "conj to host": (e.conj().cpu(), c.conj()),
            "neg view to host": (e.conj().imag.cpu(), c.conj().imag),
            "clone of a conj view": (e.conj().clone().cpu(), c.conj()),
            "matmul with the adjoint": ((e @ e.mH).cpu(), c @ c.mH),
            "vdot": (torch.vdot(e[0], e[1]).cpu(), torch.vdot(c[0], c[1])),
        }
        into = torch.zeros(4, 3, dtype=torch.complex64, device="emu")
        into.conj().copy_(e)  # writes through a conjugate view
        checks["copy into a conj view"] = (into.cpu(), c.conj())
        host = torch.empty(4, 3, dtype=torch.complex64)
        host.copy_(e.conj())
        checks["copy to a host tensor"] = (host, c.conj())
        for name, (got, want) in checks.items():
            torch.testing.assert_close(got, want, rtol=0, atol=0, msg=name)
        leaf = e.clone().requires_grad_()
        (leaf.sin() * leaf.conj()).abs().sum().backward()  # complex gradients resolve conj views
        host_leaf = c.clone().requires_grad_()
        (host_leaf.sin() * host_leaf.conj()).abs().sum().backward()
        torch.testing.assert_close(leaf.grad.cpu(), host_leaf.grad, rtol=0, atol=0)
        print("all equal")
        """
    )
    assert result.returncode == 0, (result.returncode, result.stderr[-3000:])
    assert "all equal" in result.stdout


def test_operators_with_a_host_kernel_do_not_run_as_a_decomposition(emu):
    # PyTorch's composite kernels (layer norm through batch norm, addr, group norm, mish and silu
    # backward) outrank a backend fallback; on emu they gave other numbers than the host's kernels
    import accel_emu

    g = torch.Generator().manual_seed(0)
    one = torch.tensor([1.5])
    torch.testing.assert_close(F.layer_norm(one.to("emu"), (1,)).cpu(), torch.zeros(1), rtol=0, atol=0)

    x = torch.randn(2, 6, 3, generator=g).to(torch.bfloat16)
    w, b = torch.randn(6, generator=g).to(torch.bfloat16), torch.randn(6, generator=g).to(torch.bfloat16)
    a, v1, v2 = (torch.randn(*s, generator=g).to(torch.bfloat16) for s in ((5, 10), (5,), (10,)))
    dev = lambda *ts: [t.to("emu") for t in ts]  # noqa: E731
    pairs = {
        "layer_norm": (F.layer_norm(*dev(x), (3,)), F.layer_norm(x, (3,))),
        "group_norm": (F.group_norm(*dev(x), 2, *dev(w, b)), F.group_norm(x, 2, w, b)),
        "addr": (torch.addr(*dev(a, v1, v2), beta=0.3, alpha=1.7), torch.addr(a, v1, v2, beta=0.3, alpha=1.7)),
    }
    for name, (got, want) in pairs.items():
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, msg=name)

    h = torch.randn(16, 32, generator=g)
    for fn in (F.mish, F.silu):
        host_leaf, leaf = h.clone().requires_grad_(), h.to("emu").requires_grad_()
        fn(host_leaf).sum().backward()
        fn(leaf).sum().backward()
        torch.testing.assert_close(leaf.grad.cpu(), host_leaf.grad, rtol=0, atol=0, msg=fn.__name__)

    accel_emu.reset_fallback_calls()
    F.layer_norm(torch.randn(4, 8, device="emu"), (8,))
    assert "aten::native_layer_norm" in {name for name, _, calls in accel_emu.fallback_calls() if calls}


def test_composites_that_call_a_dispatch_stub_run_on_the_host(emu):
    # conj_physical_ and mode's out= form have only a device-generic kernel, which calls a DispatchStub
    # (no entry for emu) or refuses device types by name; linalg.svd's out= form reaches conj_physical_
    g = torch.Generator().manual_seed(0)
    z = torch.randn(3, 4, dtype=torch.complex128, generator=g)
    on_emu = z.to("emu")
    on_emu.conj_physical_()
    torch.testing.assert_close(on_emu.cpu(), z.conj_physical(), rtol=0, atol=0)

    u, s, vh = (torch.empty(0, dtype=t, device="emu") for t in (torch.complex128, torch.float64, torch.complex128))
    torch.linalg.svd(z.to("emu"), full_matrices=False, out=(u, s, vh))
    torch.testing.assert_close((u * s.to(u.dtype)) @ vh, z.to("emu"))

    x = torch.randint(0, 4, (5, 7), generator=g).to(torch.bfloat16)
    values, indices = torch.empty(0, dtype=torch.bfloat16, device="emu"), torch.empty(0, dtype=torch.long, device="emu")
    torch.mode(x.to("emu"), dim=1, out=(values, indices))
    want = torch.mode(x, dim=1)
    assert torch.equal(values.cpu(), want.values) and torch.equal(indices.cpu(), want.indices)
