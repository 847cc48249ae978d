"""Accelerate's ``test_state_checkpointing.py::test_map_location`` scenario on emu, in a child process.

The upstream test moves the prepared model to the host (``model.cpu()``) before ``save_state``, loads
with ``map_location="cpu"`` and expects the optimizer's first parameter on the host; then moves the
model back and loads with ``map_location="on_device"``. ``load_state`` moves no parameter: the
optimizer sees the host only because ``Module.cpu()`` moves the *same* Parameter objects, which a
device does when its tensors are shallow-copy compatible with host tensors (emu registers
``_has_compatible_shallow_copy_type``). The optimizer's state follows its parameters.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

if importlib.util.find_spec("accel_emu") is None:
    pytest.skip("the accel-emu plug-in is not installed (pip install -e plugins/accel-emu)", allow_module_level=True)

SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from accel import Accelerator
    from accel.state import AcceleratorState, GradientState
    from accel.utils import ProjectConfiguration


    def scenario(project, safe):
        AcceleratorState._reset_state()  # each scenario with an Accelerator of its own
        GradientState._reset_state()
        torch.manual_seed(0)
        model = torch.nn.Linear(1, 1)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        x = torch.randn(16, 1)
        loader = DataLoader(TensorDataset(x, 3 * x + 1), batch_size=4)
        accelerator = Accelerator(project_dir=project, project_config=ProjectConfiguration(automatic_checkpoint_naming=True))
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        for xb, yb in loader:
            optimizer.zero_grad()
            accelerator.backward(torch.nn.functional.mse_loss(model(xb), yb))
            optimizer.step()

        def devices():
            param = optimizer.param_groups[0]["params"][0]
            state = optimizer.state[param]
            return param.device.type, state["exp_avg"].device.type

        print("trained", *devices())
        model = model.cpu()
        print("after model.cpu()", *devices())
        accelerator.save_state(safe_serialization=safe)
        folder = f"{project}/checkpoints/checkpoint_0"
        accelerator.load_state(folder, map_location="cpu")
        print("loaded cpu", *devices())
        model.to(accelerator.device)
        accelerator.load_state(folder, map_location="on_device")
        print("loaded on_device", *devices())
        try:
            accelerator.load_state(folder, map_location="invalid")
        except TypeError as exc:
            print("invalid refused")
            print("wording", "Unsupported optimizer map location passed" in str(exc))


    for serialization in sys.argv[2:]:
        print("==", serialization)
        scenario(f"{sys.argv[1]}/{serialization}", serialization == "safetensors")
    """
)
SERIALIZATIONS = ("safetensors", "pickle")


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict[str, list[str]]]:
    """One child process runs the scenario for each serialization (torch and emu load once): the process and
    the non-empty lines it printed per serialization."""
    tmp_path = tmp_path_factory.mktemp("map_location")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCEL_", "ACCELERATE_", "PYTEST_"))}
    if "ACCEL_EMU_BUILD_DIR" in os.environ:
        env["ACCEL_EMU_BUILD_DIR"] = os.environ["ACCEL_EMU_BUILD_DIR"]
    env.update(ACCEL_DEVICE="emu", OMP_NUM_THREADS="1")
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "project"), *SERIALIZATIONS],
                            capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    lines: dict[str, list[str]] = {}
    for line in result.stdout.splitlines():
        if line.startswith("== "):
            lines[line[3:]] = []
        elif line.strip() and lines:
            lines[next(reversed(lines))].append(line)
    return result, lines


@pytest.mark.parametrize("serialization", SERIALIZATIONS)
def test_map_location_follows_the_parameters_on_emu(serialization, outputs):
    result, printed = outputs
    assert result.returncode == 0, result.stderr[-4000:]
    lines = printed.get(serialization, [])
    assert lines[:5] == [
        "trained emu emu",
        "after model.cpu() cpu emu",  # the optimizer holds the moved Parameter objects
        "loaded cpu cpu cpu",
        "loaded on_device emu emu",
        "invalid refused",
    ], result.stdout


def test_an_unknown_map_location_is_refused_in_accelerates_words(outputs):
    result, printed = outputs
    assert result.returncode == 0, result.stderr[-4000:]
    assert printed["pickle"][5:] == ["wording True"], result.stdout
