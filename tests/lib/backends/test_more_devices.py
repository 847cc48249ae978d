"""The devices Accelerate 1.15 knows beyond cuda/xpu/hpu/mps: npu, mlu, musa, sdaa, neuron and xla.

The vendor extensions are not installed here, so each backend is driven through an injected fake
device module (the real code paths of accel/backends run) and availability is patched as in the
cuda/xpu/hpu tests. The per-backend facts are checked against the installed Accelerate's source.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from accel.backends import Backend, DeviceModuleBackend, get_registry
from accel.backends.extension import ExtensionBackend
from accel.backends.mlu import MLUBackend
from accel.backends.musa import MUSABackend
from accel.backends.neuron import NeuronBackend
from accel.backends.npu import NPUBackend
from accel.backends.sdaa import SDAABackend
from accel.backends.xla import XLABackend
from accel.utils.dataclasses import DistributedType

from _backend_fakes import FakeDeviceModule
from _waits import SAFETY_NET_S

# name: (class, extension package, collective backend, visible-devices variable, distributed type, Accelerate RNG key)
FACTS = {
    "npu": (NPUBackend, "torch_npu", "hccl", "ASCEND_RT_VISIBLE_DEVICES", "MULTI_NPU", "torch_cuda_manual_seed"),
    "mlu": (MLUBackend, "torch_mlu", "cncl", "MLU_VISIBLE_DEVICES", "MULTI_MLU", "torch_mlu_manual_seed"),
    "musa": (MUSABackend, "torch_musa", "mccl", "MUSA_VISIBLE_DEVICES", "MULTI_MUSA", "torch_musa_manual_seed"),
    "sdaa": (SDAABackend, "torch_sdaa", "tccl", "SDAA_VISIBLE_DEVICES", "MULTI_SDAA", "torch_sdaa_manual_seed"),
    "neuron": (NeuronBackend, "torch_neuronx", "neuron", "NEURON_RT_VISIBLE_CORES", "MULTI_NEURON", "torch_neuron_manual_seed"),
}
EXTENSIONS = [pytest.param(name, id=name) for name in FACTS]


def make(name: str, **fake_kwargs):
    fake = FakeDeviceModule(**fake_kwargs)
    return FACTS[name][0](module=fake, accelerator=None), fake


# ---------------------------------------------------------------------- facts
@pytest.mark.parametrize("name", EXTENSIONS)
def test_static_facts(name):
    cls, package, collective, visible, distributed, rng_key = FACTS[name]
    assert issubclass(cls, ExtensionBackend) and issubclass(cls, DeviceModuleBackend)
    assert cls.name == cls.device_type == name
    assert (cls.extension_package, cls.collective_backend, cls.visible_devices_env) == (package, collective, visible)
    assert DistributedType(cls.distributed_type).value == distributed and cls.start_method == "spawn"
    assert cls.accelerate_rng_key == rng_key
    assert XLABackend.distributed_type == "XLA" and XLABackend.accelerate_rng_key == "xm_seed"


def _accelerate_source(module: str) -> str:
    accelerate = pytest.importorskip("accelerate", reason="the installed Accelerate is the reference for the facts")
    return inspect.getsource(importlib.import_module(f"accelerate.{module}")) if accelerate else ""


@pytest.mark.parametrize("name", EXTENSIONS)
def test_facts_agree_with_accelerates_source(name):
    cls, _, collective, visible, distributed, rng_key = FACTS[name]
    state = _accelerate_source("state")
    # _prepare_backend: "elif is_<name>_available(): backend = ...; distributed_type = DistributedType.<...>"
    branch = re.search(rf"is_{name}_available\(\):\s*\n\s*backend = \"(\w+)\"\s*\n\s*distributed_type = DistributedType\.(\w+)",
                       state)
    assert branch is not None, f"Accelerate's state.py has no {name} branch in _prepare_backend"
    assert branch.groups() == (collective, distributed)
    launch = _accelerate_source("utils.launch")
    assert re.search(rf"is_{name}_available\(\):\s*\n\s*current_env\[\"{visible}\"\]", launch)
    checkpointing = _accelerate_source("checkpointing")
    if name != "npu":  # Accelerate keeps NPU states under cuda's key (its fallback branch)
        assert f'states["{rng_key}"] = torch.{name}.get_rng_state_all()' in checkpointing
    assert 'states["xm_seed"] = xm.get_rng_state()' in checkpointing


def test_registry_order_follows_accelerate():
    names = get_registry().names()
    builtin = [n for n in names if n in ("xla", "mlu", "sdaa", "musa", "npu", "cuda", "xpu", "hpu", "neuron", "mps", "cpu")]
    # Accelerate: torch_xla first; mlu, sdaa, musa, npu (before cuda: transfer_to_npu), hpu, cuda, xpu, neuron
    assert builtin == ["xla", "mlu", "sdaa", "musa", "npu", "cuda", "xpu", "hpu", "neuron", "mps", "cpu"]
    for name in FACTS:
        assert isinstance(get_registry().get(name), FACTS[name][0])


# ---------------------------------------------------------------------- availability
@pytest.mark.parametrize("name", EXTENSIONS)
def test_missing_extension_names_the_package(name, monkeypatch):
    cls, package = FACTS[name][0], FACTS[name][1]
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda mod, *a: None if mod == package else real(mod, *a))
    backend = cls()
    assert not backend.is_available()
    assert backend.availability.reason.startswith(f"{package} is not installed")
    assert backend.device_count() == 0


@pytest.mark.parametrize("name", EXTENSIONS)
def test_available_through_the_device_module(name):
    backend, fake = make(name, count=3)
    assert backend.is_available() and backend.device_count() == 3
    assert "3 device(s)" in backend.availability.reason
    fake.current = 1
    assert backend.current_device() == 1 and fake.called("current_device")
    # the device module sets the device (and refuses an index it lacks; this fake accepts any)
    backend.set_device(2)
    assert fake.called("set_device") == [(2,)] and backend.current_device() == 2


@pytest.mark.parametrize("name", EXTENSIONS)
def test_unavailable_device_hints_at_the_visibility_variable(name, monkeypatch):
    visible = FACTS[name][3]
    monkeypatch.setenv(visible, "7")
    backend, _ = make(name, available=False)
    assert not backend.is_available()
    assert f"{visible}='7' may hide devices" in backend.availability.reason


def test_mlu_probes_without_initialising_the_driver(monkeypatch):
    monkeypatch.delenv("PYTORCH_CNDEV_BASED_MLU_CHECK", raising=False)
    seen = []

    class CndevFake(FakeDeviceModule):
        def is_available(self):
            import os

            seen.append(os.environ.get("PYTORCH_CNDEV_BASED_MLU_CHECK"))
            return super().is_available()

    backend = MLUBackend(module=CndevFake(), accelerator=None)
    assert backend.is_available() and seen == ["1"]
    import os

    assert "PYTORCH_CNDEV_BASED_MLU_CHECK" not in os.environ


# ---------------------------------------------------------------------- collectives, RNG, memory
@pytest.mark.parametrize("name", EXTENSIONS)
def test_collective_backend(name):
    backend, _ = make(name)
    assert backend.comm_backend == FACTS[name][2] and backend.supports_multiprocess()


@pytest.mark.parametrize("name", EXTENSIONS)
def test_rng_state_round_trip_and_seeding(name):
    backend, fake = make(name, count=2)
    backend.manual_seed(1234)
    assert fake.called("manual_seed_all") == [(1234,)]
    state = backend.get_rng_state(1)
    assert torch.equal(state, torch.full((8,), 1, dtype=torch.uint8))
    backend.set_rng_state(torch.full((8,), 9, dtype=torch.uint8), 0)
    assert torch.equal(fake.rng_states[0], torch.full((8,), 9, dtype=torch.uint8))
    assert fake.called("get_rng_state") == [(1,)] and fake.called("set_rng_state") == [(0,)]


@pytest.mark.parametrize("name", EXTENSIONS)
def test_memory_statistics_forward_the_index(name):
    backend, fake = make(name, count=2)
    assert backend.has_memory_stats
    assert backend.memory_allocated(1) == 1001 and backend.max_memory_allocated(0) == 3000
    assert backend.mem_get_info(1) == fake.free_total[1]


@pytest.mark.parametrize("name", EXTENSIONS)
def test_oom_messages(name):
    backend, _ = make(name)
    assert backend.is_oom_error(RuntimeError(f"{backend.oom_messages[0]}. Tried to allocate 2.00 GiB"))
    assert not backend.is_oom_error(RuntimeError("shape mismatch"))


@pytest.mark.parametrize("name", EXTENSIONS)
def test_is_available_helpers_ask_the_registry(name, monkeypatch):
    import accel.utils.imports as imports

    helper = getattr(imports, f"is_{name}_available")
    assert helper() is False  # no extension on this machine
    monkeypatch.setattr(FACTS[name][0], "is_available", lambda self: True)
    assert helper() is True


# ---------------------------------------------------------------------- xla
class FakeXLA:
    """torch_xla's xla_model and runtime, as far as the backend uses them."""

    def __init__(self, kind: str = "TPU", seed: int = 42):
        self.kind, self.seed = kind, seed
        self.calls: list[str] = []
        self.xla_model = SimpleNamespace(
            mark_step=lambda: self.calls.append("mark_step"),
            wait_device_ops=lambda: self.calls.append("wait_device_ops"),
            get_rng_state=lambda device=None: self.seed,
            set_rng_state=self._set_seed,
            get_memory_info=lambda device=None: {"bytes_used": 100, "bytes_limit": 1000, "peak_bytes_used": 300},
        )
        self.runtime = SimpleNamespace(device_type=lambda: self.kind, addressable_runtime_device_count=lambda: 1)

    def _set_seed(self, seed: int, device=None) -> None:
        self.calls.append(f"set_rng_state({seed})")
        self.seed = seed


def test_xla_availability_and_switch(monkeypatch):
    monkeypatch.delenv("USE_TORCH_XLA", raising=False)
    backend = XLABackend(module=FakeXLA())
    assert backend.is_available() and backend.availability.reason == "XLA device type TPU"
    assert backend.device_count() == 1 and backend.comm_backend == "xla"
    monkeypatch.setenv("USE_TORCH_XLA", "0")
    off = XLABackend(module=FakeXLA())
    assert not off.is_available() and "USE_TORCH_XLA" in off.availability.reason
    monkeypatch.delenv("USE_TORCH_XLA")
    if importlib.util.find_spec("torch_xla") is None:
        assert XLABackend().availability.reason.startswith("torch_xla is not installed")


def test_xla_rng_is_one_integer_seed():
    fake = FakeXLA(seed=42)
    backend = XLABackend(module=fake)
    state = backend.get_rng_state()
    assert state.tolist() == [42]
    backend.set_rng_state(torch.tensor([7]))
    backend.manual_seed(5)
    assert fake.calls == ["set_rng_state(7)", "set_rng_state(5)"] and fake.seed == 5


def test_xla_sync_memory_and_precision():
    fake = FakeXLA(kind="TPU")
    backend = XLABackend(module=fake)
    backend.synchronize()
    assert fake.calls == ["mark_step", "wait_device_ops"]
    assert not backend.supports_fp16_amp and "TPUs have no fp16 autocast" in backend.supports_fp16_amp.reason
    assert backend.supports_bf16_amp and not backend.grad_scaler_capability
    gpu = XLABackend(module=FakeXLA(kind="CUDA"))
    assert gpu.supports_fp16_amp and gpu.grad_scaler_capability
    assert isinstance(backend, Backend) and backend.device_properties().name == "XLA TPU"


def test_xla_memory(monkeypatch):
    backend = XLABackend(module=FakeXLA())
    monkeypatch.setattr(XLABackend, "device", lambda self, index=None: torch.device("cpu"))
    assert backend.memory_allocated() == 100 and backend.max_memory_allocated() == 300
    assert backend.mem_get_info() == (900, 1000)


def test_torch_xla_available_helper(monkeypatch):
    from accel.utils import is_torch_xla_available

    assert is_torch_xla_available() is (get_registry().get("xla").is_available())
    monkeypatch.setattr(XLABackend, "is_available", lambda self: True)
    monkeypatch.setattr(XLABackend, "xla_device_type", property(lambda self: "TPU"))
    assert is_torch_xla_available() and is_torch_xla_available(check_is_tpu=True)
    assert not is_torch_xla_available(check_is_gpu=True)
    with pytest.raises(ValueError, match="cannot both be True"):
        is_torch_xla_available(check_is_tpu=True, check_is_gpu=True)


# ---------------------------------------------------------------------- cheap imports
def test_importing_accel_imports_no_vendor_extension():
    code = (
        "import sys, accel, accel.utils, accel.backends\n"
        "from accel.backends import get_registry\n"
        "get_registry().names()\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in "
        "('torch_npu', 'torch_mlu', 'torch_musa', 'torch_sdaa', 'torch_neuronx', 'torch_xla')]\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=SAFETY_NET_S)
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout


def test_checkpoints_use_accelerates_rng_key_per_backend():
    from accel.checkpointing.rng import accelerate_device_key
    from accel.backends.cuda import CUDABackend

    assert accelerate_device_key(make("npu")[0]) == "torch_cuda_manual_seed"
    assert accelerate_device_key(make("mlu")[0]) == "torch_mlu_manual_seed"
    assert accelerate_device_key(CUDABackend(module=FakeDeviceModule(), accelerator=None)) == "torch_cuda_manual_seed"
