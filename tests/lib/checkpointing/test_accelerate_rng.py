"""Checkpoints across accel and Hugging Face Accelerate (the reference, installed in the venv): a checkpoint
saved by either resumes under the other with the same RNG draws, data order and dropout."""

from __future__ import annotations

import json
import logging
import random
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import accel
from accel import checkpointing as C
from accel.state import AcceleratorState, GradientState

accelerate = pytest.importorskip("accelerate", reason="Hugging Face accelerate (the reference) is not installed")


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    yield
    accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)
    accelerate.state.GradientState._reset_state()


class Run:
    """The same small training setup, prepared by accel or by Accelerate."""

    def __init__(self, lib):
        self.acc = lib.Accelerator()
        torch.manual_seed(0)
        data = torch.Generator().manual_seed(1234)
        x = torch.randn(16, 4, generator=data)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
        loader = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4, shuffle=True)
        self.model, self.optimizer, self.scheduler, self.loader = self.acc.prepare(model, optimizer, scheduler, loader)

    def epoch(self) -> list[str]:
        """One epoch's losses (float.hex: bitwise); shuffling and dropout draw from the global torch RNG."""
        losses = []
        for x, y in self.loader:
            loss = torch.nn.functional.mse_loss(self.model(x), y)
            self.acc.backward(loss)
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad()
            losses.append(loss.item().hex())
        return losses

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.acc.unwrap_model(self.model).state_dict().items()}


def disturb() -> None:
    """Move every global generator on, as the rest of a training run would before a resume."""
    random.random()
    np.random.rand(5)
    torch.rand(5)


def draws() -> tuple:
    return random.random(), np.random.rand(3).tolist(), torch.rand(3).tolist()


def reset_accel() -> None:
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def accelerate_load(run: Run, folder: Path, caplog) -> None:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="accelerate"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run.acc.load_state(str(folder))


def saved_by_accel(tmp_path: Path) -> tuple[Path, dict, tuple, list[str]]:
    """An accel checkpoint after one epoch, with what accel draws and trains after resuming it."""
    run = Run(accel)
    run.epoch()
    run.acc.step = 5
    folder = Path(run.acc.save_state(tmp_path / "ck"))
    weights = run.weights()
    disturb()
    run.acc.load_state(folder)
    expected = draws()
    assert run.acc.step == 5
    run.acc.load_state(folder)
    losses = run.epoch()
    reset_accel()
    return folder, weights, expected, losses


# ---------------------------------------------------------------------------------------------- accel -> Accelerate
def test_accelerate_resumes_an_accel_checkpoint_with_the_same_rng(tmp_path, caplog):
    folder, weights, expected, losses = saved_by_accel(tmp_path)
    assert (folder / "random_states_0.pkl").is_file()

    ref = Run(accelerate)
    disturb()
    accelerate_load(ref, folder, caplog)
    assert "All random states loaded successfully" in caplog.text
    assert "Could not load random states" not in caplog.text
    assert all(torch.equal(ref.weights()[k], weights[k]) for k in weights)
    assert ref.acc.step == 5
    assert draws() == expected  # python, numpy and torch: bitwise the same numbers as accel's resume

    accelerate_load(ref, folder, caplog)
    assert ref.epoch() == losses  # data order and dropout masks too


def test_without_the_pkl_accelerate_loses_the_rng(tmp_path, caplog):
    """The failure the pkl prevents: Accelerate notes the miss at INFO only and goes on with other draws."""
    folder, _, expected, losses = saved_by_accel(tmp_path)
    (folder / "random_states_0.pkl").unlink()
    ref = Run(accelerate)
    disturb()
    accelerate_load(ref, folder, caplog)
    assert "Could not load random states" in caplog.text
    assert draws() != expected


# ---------------------------------------------------------------------------------------------- Accelerate -> accel
def test_accel_resumes_an_accelerate_checkpoint_with_the_same_rng(tmp_path, caplog):
    ref = Run(accelerate)
    ref.epoch()
    ref.acc.step = 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        folder = Path(ref.acc.save_state(str(tmp_path / "acc")))
    weights = ref.weights()
    disturb()
    accelerate_load(ref, folder, caplog)
    expected = draws()
    accelerate_load(ref, folder, caplog)
    losses = ref.epoch()
    accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)
    accelerate.state.GradientState._reset_state()

    ours = Run(accel)
    disturb()
    with pytest.warns(UserWarning, match="written by Accelerate"):
        ours.acc.load_state(folder)
    assert all(torch.equal(ours.weights()[k], weights[k]) for k in weights)
    assert ours.acc.step == 3
    assert draws() == expected
    with pytest.warns(UserWarning, match="written by Accelerate"):
        ours.acc.load_state(folder)
    assert ours.epoch() == losses


# ---------------------------------------------------------------------------------------------- the two RNG files
def test_the_pkl_and_the_json_hold_the_same_states(tmp_path):
    run = Run(accel)
    run.epoch()
    folder = Path(run.acc.save_state(tmp_path / "ck"))
    manifest = json.loads((folder / C.MANIFEST_NAME).read_text())
    assert manifest["random_states"] == ["random_states_0.json"]
    assert manifest["accelerate_random_states"] == ["random_states_0.pkl"]
    assert "random_states_0.pkl" in manifest["checksums"]

    own = C.rng.read_rng(run.acc, folder, 1)
    (folder / "random_states_0.json").unlink()
    via_pkl = C.rng.read_rng(run.acc, folder, 1)  # accel's weights-only reader with its numpy allowlist
    assert torch.equal(own["torch_tensor"], via_pkl["torch_tensor"])
    assert own["python_state"] == via_pkl["python_state"]
    assert own["numpy"] == via_pkl["numpy"]
    assert own["step"] == via_pkl["step"]


def test_accel_resumes_its_own_checkpoint_from_the_pkl_alone(tmp_path):
    run = Run(accel)
    run.epoch()
    folder = Path(run.acc.save_state(tmp_path / "ck"))
    disturb()
    run.acc.load_state(folder)
    expected = draws()
    manifest_path = folder / C.MANIFEST_NAME
    (folder / "random_states_0.json").unlink()
    manifest_path.unlink()  # read as Accelerate's layout: the RNG comes from the pkl
    disturb()
    with pytest.warns(UserWarning, match="written by Accelerate"):
        run.acc.load_state(folder)
    assert draws() == expected


def test_the_pkl_holds_only_what_a_weights_only_load_with_accelerates_allowlist_accepts(tmp_path):
    run = Run(accel)
    folder = Path(run.acc.save_state(tmp_path / "ck"))
    with pytest.raises(Exception, match="numpy"):  # numpy's state array is the one non-plain object...
        torch.load(folder / "random_states_0.pkl", weights_only=True)
    from accelerate.utils import load  # ...and Accelerate's own loader (its allowlist) reads it weights-only

    states = load(folder / "random_states_0.pkl")
    assert set(states) >= {"step", "random_state", "numpy_random_seed", "torch_manual_seed"}
    assert states["numpy_random_seed"][0] == "MT19937" and states["numpy_random_seed"][1].dtype == np.uint32


def test_device_rng_states_go_under_accelerates_key_for_the_device_type(tmp_path):
    """A process on device 1 of a two-device backend: the pkl holds both devices (Accelerate's
    ``get_rng_state_all``) under ``torch_<device type>_manual_seed``; reading it back picks this process's."""
    from types import SimpleNamespace

    class TwoDevices:
        name, device_type, is_host = "fake", "xpu", False

        def device_count(self) -> int:
            return 2

        def get_rng_state(self, index=None) -> torch.Tensor:
            return torch.full((16,), 10 + index, dtype=torch.uint8)

    backend = TwoDevices()
    stub = SimpleNamespace(step=2, backend=backend, device=SimpleNamespace(index=1), _dataloaders=[], process_index=0)
    snapshot = C.rng.rng_snapshot(stub)
    pkl = C.rng.rng_for_accelerate(stub, snapshot)
    assert [int(t[0]) for t in pkl["torch_xpu_manual_seed"]] == [10, 11]
    assert C.rng.rng_json(stub, snapshot)["device"]["index"] == 1
    torch.save(pkl, tmp_path / "random_states_0.pkl")
    back = C.rng.read_accelerate_rng(tmp_path / "random_states_0.pkl", backend, 1)
    assert back["device"]["backend"] == "fake" and int(back["device"]["tensor"][0]) == 11
    assert back["step"] == 2 and torch.equal(back["torch_tensor"], snapshot["torch"])


@pytest.mark.parametrize("device_type, declared, state, expected", [
    ("npu", "torch_cuda_manual_seed", torch.arange(8, dtype=torch.uint8), "list"),  # the backend's own key wins
    ("xla", "xm_seed", torch.tensor([1234], dtype=torch.int64), 1234),  # one integer seed, as Accelerate keeps it
])
def test_a_backend_names_its_accelerate_key(tmp_path, device_type, declared, state, expected):
    from types import SimpleNamespace

    backend = SimpleNamespace(name=device_type, device_type=device_type, is_host=False, accelerate_rng_key=declared,
                              device_count=lambda: 1, get_rng_state=lambda index=None: state.clone())
    stub = SimpleNamespace(step=0, backend=backend, device=SimpleNamespace(index=0), _dataloaders=[], process_index=0)
    pkl = C.rng.rng_for_accelerate(stub, C.rng.rng_snapshot(stub))
    assert f"torch_{device_type}_manual_seed" not in pkl
    if expected == "list":
        assert isinstance(pkl[declared], list) and torch.equal(pkl[declared][0], state)
    else:
        assert pkl[declared] == expected and type(pkl[declared]) is int
    torch.save(pkl, tmp_path / "random_states_0.pkl")
    back = C.rng.read_accelerate_rng(tmp_path / "random_states_0.pkl", backend, 0)
    assert torch.equal(back["device"]["tensor"], state)
