"""accel itself on emu: bugs emu found in accel, each with the test that shows it fixed."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from conftest import run_python


def test_optimizer_built_before_prepare_follows_replaced_parameters():
    # With torch's overwrite-on-conversion switch, Module.to("emu") puts new Parameter objects in
    # (as it does on any device that is not shallow-copy compatible with the host); prepare must
    # point the optimizer at them or training updates stale copies
    result = run_python(
        """
        import torch, torch.nn.functional as F
        from torch.utils.data import DataLoader, TensorDataset
        from accel import Accelerator
        torch.__future__.set_overwrite_module_params_on_conversion(True)
        g = torch.Generator().manual_seed(0)
        x = torch.randn(48, 4, generator=g)
        y = x @ torch.tensor([[1.0], [-1.0], [2.0], [0.5]])
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 1))
        old = list(model.parameters())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        acc = Accelerator()
        model, opt, loader = acc.prepare(model, opt, DataLoader(TensorDataset(x, y), batch_size=8))
        new = list(model.parameters())
        print("replaced", all(a is not b for a, b in zip(old, new)))
        print("follows", all(p is q for p, q in zip(opt.param_groups[0]["params"], new)))
        losses = []
        for xb, yb in loader:
            opt.zero_grad()
            loss = F.mse_loss(model(xb), yb)
            acc.backward(loss)
            opt.step()
            losses.append(loss.item())
        print("device", acc.device, "down", losses[-1] < 0.5 * losses[0])
        """,
        env={"ACCEL_DEVICE": "emu"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["replaced", "True", "follows", "True", "device", "emu:0", "down", "True"], result.stdout


def test_accelerator_in_process_with_mixed_precision(emu, monkeypatch):
    from accel import Accelerator
    from accel.backends import reset_registry

    monkeypatch.setenv("ACCEL_DEVICE", "emu")
    reset_registry()
    try:
        acc = Accelerator(mixed_precision="bf16")
        assert acc.device.type == "emu"
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        x = torch.randn(32, 4)
        loader = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8)
        model, opt, loader = acc.prepare(model, opt, loader)
        seen = []
        acc.unwrap_model(model)[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
        first = last = None
        for _ in range(5):
            for xb, yb in loader:
                assert xb.device.type == "emu"
                with acc.autocast():
                    loss = F.mse_loss(model(xb).float(), yb)
                acc.backward(loss)
                opt.step()
                opt.zero_grad()
                first = loss.item() if first is None else first
                last = loss.item()
        assert seen[0] == torch.bfloat16
        assert last < first
    finally:
        reset_registry()


def test_cpu_offload_takes_host_inputs_through_a_residual(emu):
    from accel.big_modeling import cpu_offload

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            return x + self.lin(x)  # the block's own input meets a submodule's output

    torch.manual_seed(0)
    model = torch.nn.Sequential(Block(), Block())
    x = torch.randn(2, 8)
    expected = model(x)
    offloaded = cpu_offload(model, execution_device=torch.device("emu:0"))
    with torch.no_grad():
        out = offloaded(x)
    assert out.device.type == "cpu"  # back on the input's device
    torch.testing.assert_close(out, expected.detach())


def test_a_safetensors_checkpoint_loads_onto_a_device_safetensors_does_not_know(tmp_path, monkeypatch):
    # safetensors' safe_open(device=...) knows a fixed list of device types ("device emu:0 is
    # invalid"); load_state_dict reads such a device's tensors through the host instead
    from safetensors.torch import save_file

    from accel.utils.modeling import load_state_dict

    monkeypatch.setenv("ACCEL_DEVICE", "emu")
    path = tmp_path / "model.safetensors"
    save_file({"a": torch.arange(4.0), "b": torch.ones(2)}, str(path))
    state = load_state_dict(str(path), device_map={"a": 0, "b": "cpu"})
    assert state["a"].device == torch.device("emu", 0) and state["b"].device.type == "cpu"
    assert state["a"].cpu().tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_prepared_data_loader_pickles_on_a_device_module_backend(monkeypatch):
    # the loader holds the backend, which cached torch.emu (a module cannot be pickled)
    import pickle

    from accel import Accelerator
    from accel.state import AcceleratorState, GradientState

    monkeypatch.setenv("ACCEL_DEVICE", "emu")
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    try:
        loader = Accelerator().prepare(DataLoader(TensorDataset(torch.arange(8.0)), batch_size=2))
        again = pickle.loads(pickle.dumps(loader))
        assert [b[0].tolist() for b in again] == [b[0].tolist() for b in loader]
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
