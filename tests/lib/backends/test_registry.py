"""The backend registry: probe order, ACCEL_DEVICE override, registration rules, reset."""

from __future__ import annotations

import pytest

import accel
import accel.backends as backends
from accel.backends import (
    OVERRIDE_ENV,
    Availability,
    Backend,
    BackendError,
    BackendRegistry,
    BackendUnavailableError,
    UnknownBackendError,
    available_backends,
    get_backend,
    get_registry,
    register_backend,
    reset_registry,
)
from accel.backends.cpu import CPUBackend
from accel.backends.cuda import CUDABackend
from accel.backends.hpu import HPUBackend
from accel.backends.mps import MPSBackend
from accel.backends.registry import _builtin_factories
from accel.backends.xpu import XPUBackend

# Accelerate's order: torch_xla first when enabled, the vendor extensions (npu before cuda), neuron after hpu
BUILTIN_ORDER = ["xla", "mlu", "sdaa", "musa", "npu", "cuda", "xpu", "hpu", "neuron", "mps", "cpu"]


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch):
    monkeypatch.delenv(OVERRIDE_ENV, raising=False)
    reset_registry()
    yield
    reset_registry()


class _TestBackend(CPUBackend):
    """A CPU-backed backend whose availability the test decides."""

    name = "testdev"
    priority = 500
    available = True

    def _probe(self) -> Availability:
        return Availability(self.available, "test device" if self.available else "switched off by the test")


def _make(name: str, priority: int = 500, available: bool = True) -> type[_TestBackend]:
    return type(f"Test_{name}", (_TestBackend,), {"name": name, "priority": priority, "available": available})


def _builtin_only() -> BackendRegistry:
    return BackendRegistry(_builtin_factories(), load_plugins=False)


# ---------------------------------------------------------------------- probe order
def test_builtin_probe_order():
    reg = _builtin_only()
    assert reg.names() == BUILTIN_ORDER
    priorities = [b.priority for b in reg.probe_order()]
    assert priorities == sorted(priorities) and len(set(priorities)) == len(priorities)
    order = [type(b) for b in reg.probe_order()]
    assert [cls for cls in order if cls in (CUDABackend, XPUBackend, HPUBackend, MPSBackend, CPUBackend)] == [
        CUDABackend, XPUBackend, HPUBackend, MPSBackend, CPUBackend]


def test_global_registry_keeps_builtin_order():
    names = get_registry().names()
    assert [n for n in names if n in BUILTIN_ORDER] == BUILTIN_ORDER


def test_probe_order_sorts_by_priority_then_registration_order():
    reg = BackendRegistry(load_plugins=False)
    for name, prio in [("late", 300), ("first_b", 100), ("first_a", 100), ("mid", 200)]:
        reg.register(_make(name, prio))
    assert reg.names() == ["first_b", "first_a", "mid", "late"]


def test_select_picks_first_available_backend():
    reg = get_registry()
    chosen = reg.select()
    assert chosen.is_available()
    earlier = reg.probe_order()[: reg.probe_order().index(chosen)]
    assert all(not b.is_available() for b in earlier), [(b.name, b.availability) for b in earlier]
    assert get_backend() is chosen
    assert available_backends()[0] is chosen


def test_select_returns_cpu_on_a_machine_without_accelerators():
    reg = get_registry()
    accelerators = [b for b in reg.probe_order() if b.name != "cpu" and b.is_available()]
    if accelerators:
        pytest.skip(f"this machine has an accelerator backend: {accelerators[0].name}")
    assert reg.select().name == "cpu"
    assert [b.name for b in reg.available()] == ["cpu"]
    for b in reg.probe_order()[:-1]:
        assert b.availability.reason, f"{b.name} gives no reason for being unavailable"


def test_select_skips_unavailable_backends():
    reg = BackendRegistry(load_plugins=False)
    reg.register(_make("off", 1, available=False))
    reg.register(_make("on", 2))
    reg.register(CPUBackend)
    assert reg.select().name == "on"
    assert [b.name for b in reg.available()] == ["on", "cpu"]


def test_select_with_nothing_available_raises():
    reg = BackendRegistry(load_plugins=False)
    reg.register(_make("off", 1, available=False))
    with pytest.raises(BackendUnavailableError, match="no backend is available"):
        reg.select()


# ---------------------------------------------------------------------- ACCEL_DEVICE
def test_env_cpu_selects_cpu(monkeypatch):
    monkeypatch.setenv(OVERRIDE_ENV, "cpu")
    assert get_registry().select().name == "cpu"
    assert type(get_backend()) is CPUBackend


def test_env_name_is_case_and_space_insensitive(monkeypatch):
    monkeypatch.setenv(OVERRIDE_ENV, "  CPU ")
    assert get_backend().name == "cpu"


def test_env_empty_means_autodetect(monkeypatch):
    monkeypatch.setenv(OVERRIDE_ENV, "")
    assert get_backend() is get_registry().available()[0]


def test_env_unknown_name_lists_known_backends(monkeypatch):
    monkeypatch.setenv(OVERRIDE_ENV, "bogus")
    with pytest.raises(UnknownBackendError) as info:
        get_backend()
    message = str(info.value)
    assert "'bogus'" in message
    for name in BUILTIN_ORDER:
        assert name in message
    # usable both as a backend error and where a KeyError is expected
    assert isinstance(info.value, BackendError) and isinstance(info.value, KeyError)


def test_env_unavailable_backend_raises_with_reason(monkeypatch):
    reg = get_registry()
    cuda = reg.get("cuda")
    if cuda.is_available():
        pytest.skip("CUDA is available here; the unavailable path needs a machine without it")
    monkeypatch.setenv(OVERRIDE_ENV, "cuda")
    with pytest.raises(BackendUnavailableError) as info:
        reg.select()
    message = str(info.value)
    assert "'cuda'" in message and OVERRIDE_ENV in message
    assert cuda.availability.reason in message
    import torch

    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        assert "built without CUDA" in message


def test_explicit_name_beats_env(monkeypatch):
    reg = BackendRegistry(load_plugins=False)
    reg.register(_make("alpha", 1))
    reg.register(_make("beta", 2))
    monkeypatch.setenv(OVERRIDE_ENV, "beta")
    assert reg.select().name == "beta"
    assert reg.select("alpha").name == "alpha"
    # even when the env var names something that does not exist
    monkeypatch.setenv(OVERRIDE_ENV, "bogus")
    assert reg.select("alpha").name == "alpha"
    with pytest.raises(UnknownBackendError):
        reg.select()


def test_explicit_unavailable_name_says_requested():
    reg = BackendRegistry(load_plugins=False)
    reg.register(_make("off", 1, available=False))
    with pytest.raises(BackendUnavailableError, match=r"'off' \(requested\).*switched off by the test"):
        reg.select("off")


# ---------------------------------------------------------------------- registration rules
def test_duplicate_registration_raises_unless_replace():
    reg = BackendRegistry(load_plugins=False)
    first = reg.register(_make("dup"))
    with pytest.raises(ValueError, match="'dup' is already registered"):
        reg.register(_make("dup"))
    assert reg.get("dup") is first
    second = reg.register(_make("dup"), replace=True)
    assert second is not first and reg.get("dup") is second
    assert reg.names() == ["dup"]


def test_duplicate_builtin_name_raises():
    reg = _builtin_only()
    with pytest.raises(ValueError, match="already registered"):
        reg.register(CPUBackend)


def test_factory_returning_non_backend_raises_type_error():
    reg = BackendRegistry(load_plugins=False)
    with pytest.raises(TypeError, match="did not produce an accel Backend"):
        reg.register(lambda: object())
    with pytest.raises(TypeError, match="str"):
        reg.register(lambda: "cpu")
    assert reg.names() == []


def test_backend_without_name_or_device_type_is_rejected():
    reg = BackendRegistry(load_plugins=False)
    nameless = type("Nameless", (_TestBackend,), {"name": ""})
    typeless = type("Typeless", (_TestBackend,), {"name": "typeless", "device_type": ""})
    with pytest.raises(ValueError, match="Nameless"):
        reg.register(nameless)
    with pytest.raises(ValueError, match="Typeless"):
        reg.register(typeless)
    assert reg.names() == []


def test_register_accepts_instance_class_and_factory():
    reg = BackendRegistry(load_plugins=False)
    instance = _make("inst")()
    assert reg.register(instance) is instance
    from_class = reg.register(_make("cls"))
    assert isinstance(from_class, _TestBackend) and from_class.name == "cls"
    from_factory = reg.register(lambda: _make("fac")())
    assert reg.get("fac") is from_factory
    assert set(reg.names()) == {"inst", "cls", "fac"}


def test_registered_name_can_always_be_selected():
    """A name the registry accepts must work with get()/select()/ACCEL_DEVICE.

    ``get`` lower-cases the requested name, so a backend registered under a mixed-case name
    must either be rejected at registration or be found again under that same name.
    """
    reg = BackendRegistry(load_plugins=False)
    try:
        backend = reg.register(_make("MyDev"))
    except ValueError:
        return  # rejected up front: fine
    assert reg.get(backend.name) is backend
    assert reg.select(backend.name) is backend


def test_unknown_name_from_get_lists_known_names():
    reg = BackendRegistry(load_plugins=False)
    reg.register(_make("alpha"))
    with pytest.raises(UnknownBackendError, match="unknown backend 'nope'; known backends: alpha"):
        reg.get("nope")


def test_get_returns_registered_instances():
    reg = _builtin_only()
    for name in BUILTIN_ORDER:
        backend = reg.get(name)
        assert isinstance(backend, Backend) and backend.name == name
        assert reg.get(name) is backend  # one instance per registry: probes are cached


# ---------------------------------------------------------------------- process-wide registry
def test_get_registry_is_a_singleton_until_reset():
    first = get_registry()
    assert get_registry() is first
    reset_registry()
    second = get_registry()
    assert second is not first
    assert second.get("cpu") is not first.get("cpu")


def test_reset_registry_forgets_registrations_and_probes():
    cls = _make("tmpdev", 1)
    registered = register_backend(cls)
    assert get_backend() is registered
    assert "tmpdev" in get_registry().names()
    cached = registered.availability
    assert registered.__dict__.get("availability") is cached  # probed once, then cached
    reset_registry()
    assert "tmpdev" not in get_registry().names()
    with pytest.raises(UnknownBackendError):
        get_backend("tmpdev")


def test_register_backend_in_process():
    cls = _make("inproc", 3)
    backend = register_backend(cls)
    assert isinstance(backend, cls)
    assert get_registry().get("inproc") is backend
    assert get_backend("inproc") is backend
    assert get_registry().names().index("inproc") < get_registry().names().index("cpu")
    with pytest.raises(ValueError, match="already registered"):
        register_backend(cls)
    replacement = register_backend(cls, replace=True)
    assert get_backend("inproc") is replacement is not backend


def test_accel_exposes_get_backend_lazily(monkeypatch):
    monkeypatch.setenv(OVERRIDE_ENV, "cpu")
    assert accel.get_backend is backends.get_backend
    assert accel.get_backend().name == "cpu"


#: the methods every backend defines itself (Backend's abstract methods), the contract in one place
CONTRACT = {"_probe", "device_count", "set_device", "current_device", "synchronize", "comm_backend", "manual_seed",
            "get_rng_state", "set_rng_state", "grad_scaler_capability", "device_properties"}


def test_backend_is_an_abstract_class_with_its_contract_in_one_place():
    from accel.backends.base import Backend

    assert Backend.__abstractmethods__ == CONTRACT
    with pytest.raises(TypeError, match="abstract"):
        Backend()


def test_a_backend_that_leaves_out_part_of_the_contract_cannot_be_made():
    from accel.backends.base import Availability, Backend

    class Partial(Backend):
        name = device_type = "partial"

        def _probe(self):
            return Availability(True, "test")

    with pytest.raises(TypeError, match="device_count"):
        Partial()


def test_a_device_module_backend_names_its_collective_library_itself():
    from accel.backends.device_module import DeviceModuleBackend

    assert DeviceModuleBackend.__abstractmethods__ == {"comm_backend"}


def test_every_builtin_backend_fulfils_the_contract():
    for factory in _builtin_factories():
        backend = factory()
        assert not type(backend).__abstractmethods__, type(backend).__name__
