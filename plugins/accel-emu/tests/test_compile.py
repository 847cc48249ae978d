"""torch.compile with Inductor on emu: generated host C++ kernels run on protected emu memory.

Every test here runs with memory protection on (the default; checked first): a generated kernel that
touched device memory without opening it would end the process with SIGSEGV. Compiled results must
equal eager ones on emu and the host's, stay on the graph's emu device, and come from Inductor's own
code (the generated wrapper is read back with ``run_and_get_code``).

The default run keeps the cheapest tests that cover the contract (a model's forward and backward on a
device that is not the current one, random operators, the stream a kernel waits for, registration);
the others need ``RUN_SLOW=1`` (the first compile in a process costs seconds).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import run_python

import accel_emu
from accel.test_utils import slow
from accel_emu._extension import load_extension


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles its own graphs (and Dynamo forgets them afterwards)."""
    import torch._dynamo

    assert load_extension().protection_enabled(), "these tests are about generated code on protected memory"
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _compiled_with_code(fn, *args):
    from torch._inductor.utils import run_and_get_code

    return run_and_get_code(torch.compile(fn, backend="inductor"), *args)


def _pointwise_and_reduction(x, y):
    return (x * 2 + y).relu().sum(0), torch.tanh(x) @ y


@pytest.mark.slow
@slow
@pytest.mark.parametrize("index", [0, 1])
def test_compiled_function_matches_eager_and_host(index):
    device = f"emu:{index}"
    g = torch.Generator().manual_seed(0)
    x_host, y_host = torch.randn(16, 16, generator=g), torch.randn(16, 16, generator=g)
    x, y = x_host.to(device), y_host.to(device)

    (reduced, product), codes = _compiled_with_code(_pointwise_and_reduction, x, y)

    wrapper = "\n".join(codes)
    assert "emu_launch(cpp_fused_" in wrapper, "Inductor did not generate C++ kernels launched on emu"
    assert f"device='{device}'" in wrapper, f"buffers not allocated on {device}:\n{wrapper}"
    assert reduced.device == torch.device(device) and product.device == torch.device(device)
    eager = _pointwise_and_reduction(x, y)
    host = _pointwise_and_reduction(x_host, y_host)
    for compiled, on_emu, on_host in zip((reduced, product), eager, host):
        torch.testing.assert_close(compiled.cpu(), on_emu.cpu())
        torch.testing.assert_close(compiled.cpu(), on_host)


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.GELU(), torch.nn.Linear(16, 2))


@pytest.mark.slow
@slow
def test_compiled_module_forward_backward_matches_eager_and_host():
    from torch._inductor.utils import run_and_get_code

    g = torch.Generator().manual_seed(1)
    x_host, y_host = torch.randn(4, 8, generator=g), torch.randn(4, 2, generator=g)
    results = {}
    for name, device, compile_it in (("compiled", "emu", True), ("eager", "emu", False), ("host", "cpu", False)):
        model = _mlp().to(device)
        forward = torch.compile(model) if compile_it else model

        def step():
            loss = F.mse_loss(forward(x_host.to(device)), y_host.to(device))
            loss.backward()
            return loss

        loss, codes = run_and_get_code(step) if compile_it else (step(), [])
        if compile_it:
            assert len(codes) == 2, f"expected a forward and a backward graph, got {len(codes)}"
            assert all("emu_launch(" in code for code in codes), "a graph ran without emu's kernel launcher"
        assert loss.device.type == device.split(":")[0]
        assert all(p.grad is not None and p.grad.device.type == device for p in model.parameters())
        results[name] = (loss.detach().cpu(), [p.grad.cpu() for p in model.parameters()])
    for name in ("eager", "host"):
        torch.testing.assert_close(results["compiled"][0], results[name][0], msg=f"loss vs {name}")
        for compiled, other in zip(results["compiled"][1], results[name][1]):
            torch.testing.assert_close(compiled, other, msg=f"gradient vs {name}")


def _padded_labels_and_hits(logits, labels):
    """A causal LM's shifted labels (padded with the ignored index) and a cross-entropy backward's
    one-hot comparison of an index expression with the labels."""
    shifted = F.pad(labels, (0, 1), value=-100)[:, 1:]
    hits = torch.arange(logits.shape[-1], device=logits.device) == labels.unsqueeze(-1)
    return shifted, (logits * hits).sum(-1)


def test_compiled_masked_load_and_index_expression_match_eager_and_host():
    """Inductor's code shared by its generators must take the C++ branch in emu's kernels: a padded
    tensor is a masked load (whose C++ result is a string where a Triton variable has a dtype) and an
    ``arange`` compared with labels is an index expression (the C++ vectorised ``arange`` asserts its
    dtype). Both failed to compile on emu while Inductor took emu for a Triton device."""
    device = "emu:1"
    g = torch.Generator().manual_seed(2)
    logits_host, labels_host = torch.randn(2, 6, 11, generator=g), torch.randint(0, 11, (2, 6), generator=g)
    (shifted, picked), codes = _compiled_with_code(_padded_labels_and_hits, logits_host.to(device), labels_host.to(device))

    wrapper = "\n".join(codes)
    assert "emu_launch(cpp_fused_" in wrapper, "Inductor did not generate C++ kernels launched on emu"
    assert f"device='{device}'" in wrapper, f"buffers not allocated on {device}:\n{wrapper}"
    assert shifted.device == picked.device == torch.device(device)
    eager = _padded_labels_and_hits(logits_host.to(device), labels_host.to(device))
    host = _padded_labels_and_hits(logits_host, labels_host)
    for compiled, on_emu, on_host in zip((shifted, picked), eager, host):
        torch.testing.assert_close(compiled.cpu(), on_emu.cpu())
        torch.testing.assert_close(compiled.cpu(), on_host)


class _TinyCausalLM(torch.nn.Module):
    """An embedding, a linear head and a causal LM's loss as transformers computes it: the labels are
    padded with the ignored index and shifted, then cross-entropy (the pattern of the zoo's llama; its
    backward is the CNN's classification loss's)."""

    def __init__(self, vocab: int = 11, width: int = 8):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, ids, labels):
        logits = self.head(self.embed(ids))
        shifted = F.pad(labels, (0, 1), value=-100)[:, 1:]
        return F.cross_entropy(logits.flatten(0, 1), shifted.flatten(), ignore_index=-100)


@pytest.mark.slow
@slow
def test_compiled_causal_lm_loss_matches_eager_and_host():
    """The zoo's failing patterns in a model, forward and backward: the padded labels of a causal LM's
    loss (a masked load) and the loss's backward (an index expression compared with the labels)."""
    from torch._inductor.utils import run_and_get_code

    g = torch.Generator().manual_seed(2)
    ids, labels = torch.randint(0, 11, (2, 6), generator=g), torch.randint(0, 11, (2, 6), generator=g)
    results = {}
    for name, device, compile_it in (("compiled", "emu:1", True), ("eager", "emu:1", False), ("host", "cpu", False)):
        torch.manual_seed(0)
        model = _TinyCausalLM().to(device)
        forward = torch.compile(model) if compile_it else model

        def step():
            loss = forward(ids.to(device), labels.to(device))
            loss.backward()
            return loss

        loss, codes = run_and_get_code(step) if compile_it else (step(), [])
        if compile_it:
            assert len(codes) == 2 and all("emu_launch(cpp_fused_" in code for code in codes), codes
            assert all(f"device='{device}'" in code for code in codes), f"buffers not allocated on {device}"
        assert loss.device == torch.device(device)
        results[name] = (loss.detach().cpu(), [p.grad.cpu() for p in model.parameters()])
    for name in ("eager", "host"):
        torch.testing.assert_close(results["compiled"][0], results[name][0], msg=f"loss vs {name}")
        for compiled, other in zip(results["compiled"][1], results[name][1]):
            torch.testing.assert_close(compiled, other, msg=f"gradient vs {name}")


def test_compiled_random_operators_draw_from_the_device_generator():
    """Random operators stay ATen operators on emu's generator: the same seed gives eager's numbers."""
    def noisy(x):
        return F.dropout(x, 0.5, training=True) + torch.rand_like(x)

    x = torch.ones(256, device="emu")
    torch.emu.manual_seed(3)
    expected = noisy(x)
    torch.emu.manual_seed(3)
    compiled, _ = _compiled_with_code(noisy, x)
    assert compiled.device.type == "emu"
    torch.testing.assert_close(compiled.cpu(), expected.cpu())


def test_generated_kernel_waits_for_the_current_stream():
    """A copy queued on the current stream lands before a compiled kernel reads its destination."""
    double = torch.compile(lambda a: a * 2, backend="inductor")
    source = torch.arange(1 << 20, dtype=torch.float32).pin_memory()
    stream = torch.emu.Stream()
    with torch.emu.stream(stream):
        target = torch.empty(1 << 20, device="emu")
        target.copy_(source, non_blocking=True)
        doubled = double(target)
    torch.emu.synchronize()
    assert torch.equal(doubled.cpu(), source * 2)


def test_backend_compiles_with_inductor():
    import torch._inductor.compile_fx  # noqa: F401 - registration follows this import

    from accel_emu.backend import EmuBackend

    assert EmuBackend.compile_backend == "inductor"
    assert accel_emu.compiler.is_registered() == {"device_interface": True, "inductor": True}


_LAZY = """
    import sys, torch, accel_emu
    accel_emu.load()
    torch.zeros(1, device="emu")
    print("dynamo imported by load:", "torch._dynamo" in sys.modules, flush=True)
    print("inductor imported by load:", "torch._inductor" in sys.modules, flush=True)
    from torch._dynamo.device_interface import get_interface_for_device
    print("interface:", get_interface_for_device("emu").__name__, get_interface_for_device("emu:1").device_count())
"""


@pytest.mark.slow
@slow
def test_registration_waits_for_torch_to_import_dynamo():
    result = run_python(_LAZY)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "dynamo imported by load: False" in result.stdout
    assert "inductor imported by load: False" in result.stdout
    assert "interface: EmuInterface 2" in result.stdout, result.stdout
