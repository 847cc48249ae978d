"""A backend outside DeepSpeed's list brings its own DeepSpeed accelerator (``Backend.deepspeed_accelerator``):
the capability, its install with ``set_accelerator``, and the skip and agreement logic that accept it.

DeepSpeed is a stand-in package here (written under tmp_path) with DeepSpeed's ``get_accelerator`` /
``set_accelerator`` pair and an import that rejects a ``DS_ACCELERATOR`` outside its list, as DeepSpeed's does.
"""

from __future__ import annotations

import os
import sys
import textwrap
import types

import pytest

from accel.backends import deepspeed_agreement as agreement
from accel.backends.base import BackendError, UnsupportedFeatureError
from accel.backends.cpu import CPUBackend
from accel_harness import marker_checks, markers

SPEC = "fake_vendor_accel:VendorAccelerator"

FILES = {
    "deepspeed/__init__.py": """
        __version__ = '9.9.9'
        from .accelerator import get_accelerator
        get_accelerator()  # DeepSpeed's import asks too, as the real one does
    """,
    "deepspeed/accelerator/__init__.py": """
        import os

        KNOWN = ("cuda", "cpu")
        _chosen = None

        class DeepSpeedAccelerator:
            pass

        class Builtin(DeepSpeedAccelerator):
            def __init__(self, name):
                self._name = name
            def device_name(self, index=None):
                return self._name
            def communication_backend_name(self):
                return {"cpu": "gloo", "cuda": "nccl"}[self._name]

        name = os.environ.get("DS_ACCELERATOR")
        if name is not None and name not in KNOWN:
            raise ValueError(f"DS_ACCELERATOR must be one of {list(KNOWN)}, got {name!r}")

        def get_accelerator():
            global _chosen
            if _chosen is None:
                _chosen = Builtin(os.environ.get("DS_ACCELERATOR") or "cpu")
            return _chosen

        def set_accelerator(accelerator):
            global _chosen
            assert isinstance(accelerator, DeepSpeedAccelerator), "not a DeepSpeedAccelerator"
            _chosen = accelerator
    """,
    "fake_vendor_accel.py": """
        from deepspeed.accelerator import DeepSpeedAccelerator

        class VendorAccelerator(DeepSpeedAccelerator):
            def device_name(self, index=None):
                return "vendor" if index is None else f"vendor:{index}"
            def communication_backend_name(self):
                return "vendor_ccl"
    """,
}


class VendorBackend(CPUBackend):
    """A backend for a device DeepSpeed does not know, bringing its own accelerator."""

    name = device_type = "vendor"
    deepspeed_accelerator = SPEC

    @property
    def comm_backend(self):
        return "vendor_ccl"


@pytest.fixture
def fake_deepspeed(tmp_path, monkeypatch):
    """The stand-in DeepSpeed first on the path of this process and its children, not yet imported."""
    for relative, text in FILES.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    monkeypatch.setattr(agreement, "deepspeed_accelerator_types", lambda: ("cuda", "cpu"))
    monkeypatch.setattr(agreement, "deepspeed_installed", lambda: True)
    agreement._probe.cache_clear()
    for name in [n for n in sys.modules if n == "deepspeed" or n.startswith(("deepspeed.", "fake_vendor_accel"))]:
        monkeypatch.delitem(sys.modules, name)
    yield tmp_path
    agreement._probe.cache_clear()
    for name in [n for n in sys.modules if n == "deepspeed" or n.startswith(("deepspeed.", "fake_vendor_accel"))]:
        sys.modules.pop(name, None)  # the real DeepSpeed, if a test imported it before, comes back with monkeypatch


# ---------------------------------------------------------------------- the capability
def test_a_backend_brings_no_accelerator_by_default():
    backend = CPUBackend()
    assert backend.deepspeed_accelerator is None
    assert agreement.provided_accelerator(backend) is None
    with pytest.raises(UnsupportedFeatureError, match="brings none"):
        backend.create_deepspeed_accelerator()


def test_the_named_class_is_built(fake_deepspeed):
    accelerator = VendorBackend().create_deepspeed_accelerator()
    assert type(accelerator).__name__ == "VendorAccelerator" and accelerator.device_name() == "vendor"


def test_a_name_without_a_class_is_an_error():
    class Broken(VendorBackend):
        deepspeed_accelerator = "fake_vendor_accel"

    with pytest.raises(BackendError, match="'module:Class'"):
        Broken().create_deepspeed_accelerator()


def test_a_failing_or_odd_answer_counts_as_none():
    class Failing:
        @property
        def deepspeed_accelerator(self):
            raise RuntimeError("plug-in broke")

    assert agreement.provided_accelerator(Failing()) is None
    assert agreement.provided_accelerator(types.SimpleNamespace(deepspeed_accelerator=3)) is None
    assert agreement.provided_accelerator(types.SimpleNamespace()) is None


# ---------------------------------------------------------------------- installing it
def test_install_hands_the_accelerator_to_set_accelerator_once(fake_deepspeed, monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "vendor")  # DeepSpeed's import would raise on it: it is dropped first
    installed = agreement.install_deepspeed_accelerator(VendorBackend())
    from deepspeed.accelerator import get_accelerator

    assert get_accelerator() is installed and installed.device_name() == "vendor"
    assert "DS_ACCELERATOR" not in os.environ
    assert agreement.install_deepspeed_accelerator(VendorBackend()) is installed  # the same class stays
    assert agreement.install_deepspeed_accelerator(CPUBackend()) is None  # brings none: DeepSpeed's own choice
    assert get_accelerator() is installed


def test_a_ds_accelerator_deepspeed_knows_is_left_alone(fake_deepspeed, monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    agreement.clear_rejected_ds_accelerator()
    assert os.environ["DS_ACCELERATOR"] == "cuda"


def test_the_strategy_installs_it_instead_of_setting_ds_accelerator(fake_deepspeed):
    from accel.strategies.deepspeed import align_deepspeed_accelerator

    align_deepspeed_accelerator(VendorBackend())
    from deepspeed.accelerator import get_accelerator

    assert get_accelerator().device_name() == "vendor"
    assert "DS_ACCELERATOR" not in os.environ


def test_the_strategy_still_sets_ds_accelerator_for_a_device_deepspeed_knows(fake_deepspeed, monkeypatch):
    from accel.strategies.deepspeed import align_deepspeed_accelerator

    monkeypatch.setenv("DS_ACCELERATOR", "")
    monkeypatch.delenv("DS_ACCELERATOR")
    align_deepspeed_accelerator(CPUBackend())
    from deepspeed.accelerator import get_accelerator

    assert os.environ["DS_ACCELERATOR"] == "cpu" and get_accelerator().device_name() == "cpu"


# ---------------------------------------------------------------------- asking DeepSpeed, comparing
def test_the_probe_installs_the_backends_accelerator_in_its_child(fake_deepspeed):
    environ = {**os.environ, "DS_ACCELERATOR": "vendor"}
    answer = agreement.probe_deepspeed(environ, backend=VendorBackend())
    assert answer["device"] == "vendor" and answer["communication_backend"] == "vendor_ccl"
    assert answer["provided"] == SPEC and answer["class"] == "VendorAccelerator"
    result = agreement.compare(VendorBackend(), answer)
    assert result["agree"] is True and result["problems"] == []
    assert any("plug-in provides DeepSpeed's accelerator (fake_vendor_accel:VendorAccelerator)" in n for n in result["notes"])


def test_without_the_backend_the_probe_sees_deepspeeds_own_choice_and_says_why(fake_deepspeed):
    answer = agreement.probe_deepspeed()
    assert answer["device"] == "cpu" and "provided" not in answer
    (problem,) = agreement.compare(VendorBackend(), answer)["problems"]
    assert "provides its own DeepSpeed accelerator (fake_vendor_accel:VendorAccelerator)" in problem


# ---------------------------------------------------------------------- skipping
def _mark(name: str) -> types.SimpleNamespace:
    return types.SimpleNamespace(name=name, args=(), kwargs={})


def test_require_deepspeed_runs_on_a_backend_that_brings_its_accelerator(monkeypatch):
    monkeypatch.setattr(marker_checks, "_deepspeed_accelerators", lambda: ("cuda", "cpu"))
    monkeypatch.setattr(marker_checks, "_package_check", lambda mark, name: (lambda: None))
    monkeypatch.setattr("accel_harness.extension_cache.settle_extension_cache", lambda: None)
    plain = types.SimpleNamespace(name="vendor", device_type="vendor", is_available=lambda: True)
    bringing = types.SimpleNamespace(**vars(plain), deepspeed_accelerator=SPEC)
    assert markers.evaluate([_mark("require_deepspeed")], plain, world_size=1).code == markers.NOT_ON_BACKEND
    assert markers.evaluate([_mark("require_deepspeed")], bringing, world_size=1) is None


def test_accelerates_decorators_agree_with_the_harness(monkeypatch):
    from accel.test_utils import testing

    monkeypatch.setattr(agreement, "deepspeed_accelerator_types", lambda: ("cuda", "cpu"))
    monkeypatch.setattr(testing, "_package_problem", lambda name: None)
    assert testing._need_deepspeed(types.SimpleNamespace(device_type="vendor"))[0] is False
    assert testing._need_deepspeed(VendorBackend())[0] is True
    assert agreement.deepspeed_accelerator_problem(VendorBackend()) is None
    assert "DeepSpeed has no accelerator for vendor" in agreement.deepspeed_accelerator_problem(
        types.SimpleNamespace(device_type="vendor"))
