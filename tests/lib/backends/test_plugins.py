"""Out-of-tree backends found through the ``accel.backends`` entry-point group.

Each test builds a real (tiny) installed distribution in ``tmp_path``: a package plus a
``*.dist-info`` folder with ``METADATA`` and ``entry_points.txt``. With ``tmp_path`` on
``sys.path``, ``importlib.metadata`` finds it exactly like a pip-installed plug-in.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest

from accel.backends import (
    ENTRY_POINT_GROUP,
    OVERRIDE_ENV,
    BackendRegistry,
    BackendUnavailableError,
    get_backend,
    get_registry,
    reset_registry,
)
from accel.backends.registry import _builtin_factories
from _waits import SAFETY_NET_S

PLUGIN_PACKAGE = "fakedev_plugin"

PLUGIN_INIT = '''
"""A plug-in backend package as a vendor would ship it."""

from accel.backends import Availability, DeviceModuleBackend
from accel.backends.cpu import CPUBackend


class FakeDevBackend(CPUBackend):
    """Runs on the host CPU under the hood; probes before every built-in backend."""

    name = "fakedev"
    priority = 5

    def _probe(self):
        return Availability(True, "fake device (host CPU underneath)")


class _GpuModule:
    """Just enough of a device module for the shared device-module logic."""

    def is_available(self):
        return True

    def device_count(self):
        return 4

    def current_device(self):
        return 0


class FakeGpuBackend(DeviceModuleBackend):
    name = "fakegpu"
    device_type = "cpu"
    priority = 6

    @property
    def comm_backend(self):
        return "gloo"


def make_fakegpu():
    return FakeGpuBackend(module=_GpuModule(), accelerator=None)


class SwitchedOff(CPUBackend):
    name = "fakeoff"
    priority = 1

    def _probe(self):
        return Availability(False, "fakeoff hardware not plugged in")


class DuplicateCPU(CPUBackend):
    """Clashes with the built-in cpu backend."""


def not_a_backend():
    return {"name": "oops"}
'''

BROKEN_MODULE = '''
raise ImportError("fakedev broken plug-in fails on import on purpose")
'''

ENTRY_POINTS = f"""
[{ENTRY_POINT_GROUP}]
fakedev = {PLUGIN_PACKAGE}:FakeDevBackend
fakegpu = {PLUGIN_PACKAGE}:make_fakegpu
fakeoff = {PLUGIN_PACKAGE}:SwitchedOff
broken = {PLUGIN_PACKAGE}.broken:Backend
dupcpu = {PLUGIN_PACKAGE}:DuplicateCPU
notabackend = {PLUGIN_PACKAGE}:not_a_backend
missing = {PLUGIN_PACKAGE}:NoSuchAttribute
"""

METADATA = """\
Metadata-Version: 2.1
Name: fakedev-plugin
Version: 0.1
Summary: accel test plug-in
"""


def _forget_plugin_modules() -> None:
    for name in list(sys.modules):
        if name == PLUGIN_PACKAGE or name.startswith(PLUGIN_PACKAGE + "."):
            del sys.modules[name]


@pytest.fixture
def plugin_dist(tmp_path: Path, monkeypatch) -> Path:
    package = tmp_path / PLUGIN_PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent(PLUGIN_INIT))
    (package / "broken.py").write_text(BROKEN_MODULE)
    dist_info = tmp_path / f"{PLUGIN_PACKAGE}-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(METADATA)
    (dist_info / "entry_points.txt").write_text(ENTRY_POINTS)
    monkeypatch.delenv(OVERRIDE_ENV, raising=False)
    _forget_plugin_modules()
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    reset_registry()
    yield tmp_path
    reset_registry()
    _forget_plugin_modules()


def _errors_by_name(registry: BackendRegistry) -> dict[str, str]:
    return {e.entry_point.split(" = ")[0]: e.error for e in registry.plugin_errors}


def test_distribution_is_visible_to_importlib_metadata(plugin_dist):
    names = {ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}
    assert {"fakedev", "fakegpu", "broken"} <= names
    assert metadata.version("fakedev-plugin") == "0.1"


def test_fresh_registry_loads_plugins_into_probe_order(plugin_dist):
    reg = BackendRegistry(_builtin_factories())
    names = reg.names()
    # by priority, built-ins first among equals: fakeoff 1, xla 2, mlu 4, sdaa 5, fakedev 5, musa 6, fakegpu 6, npu 7, ...
    expected = ["fakeoff", "xla", "mlu", "sdaa", "fakedev", "musa", "fakegpu", "npu", "cuda", "xpu", "hpu", "neuron", "mps", "cpu"]
    assert [n for n in names if n in expected] == expected  # other installed plug-ins may sit in between
    assert reg.select().name == "fakedev"  # fakeoff probes first but is unavailable
    assert [b.name for b in reg.available()][:2] == ["fakedev", "fakegpu"]
    assert type(reg.get("fakedev")).__module__ == PLUGIN_PACKAGE


def test_global_registry_includes_plugin_and_selects_it(plugin_dist, monkeypatch):
    reg = get_registry()
    assert "fakedev" in reg.names()
    backend = get_backend()
    assert backend.name == "fakedev"
    assert backend.device().type == "cpu"
    monkeypatch.setenv(OVERRIDE_ENV, "fakegpu")
    chosen = get_backend()
    assert chosen.name == "fakegpu"
    assert chosen.device_count() == 4 and chosen.availability.reason == "4 device(s) visible"
    monkeypatch.setenv(OVERRIDE_ENV, "fakeoff")
    with pytest.raises(BackendUnavailableError, match="fakeoff hardware not plugged in"):
        get_backend()


def test_broken_entry_points_are_recorded_not_raised(plugin_dist):
    reg = BackendRegistry(_builtin_factories())  # must not raise
    errors = _errors_by_name(reg)
    assert set(errors) == {"broken", "dupcpu", "notabackend", "missing"}
    assert "ImportError" in errors["broken"] and "fails on import on purpose" in errors["broken"]
    assert "ValueError" in errors["dupcpu"] and "already registered" in errors["dupcpu"]
    assert "TypeError" in errors["notabackend"]
    assert "AttributeError" in errors["missing"]
    labels = [e.entry_point for e in reg.plugin_errors]
    assert f"broken = {PLUGIN_PACKAGE}.broken:Backend" in labels
    # the built-in cpu survived the clash
    assert type(reg.get("cpu")).__module__ == "accel.backends.cpu"
    # the good plug-ins were still loaded
    assert {"fakedev", "fakegpu", "fakeoff"} <= set(reg.names())


def test_global_registry_records_plugin_errors(plugin_dist):
    assert "broken" in _errors_by_name(get_registry())


def test_load_plugins_false_ignores_entry_points(plugin_dist):
    reg = BackendRegistry(_builtin_factories(), load_plugins=False)
    assert reg.names() == ["xla", "mlu", "sdaa", "musa", "npu", "cuda", "xpu", "hpu", "neuron", "mps", "cpu"]
    assert reg.plugin_errors == []


def test_plugins_disappear_when_uninstalled(plugin_dist):
    assert "fakedev" in get_registry().names()
    sys.path.remove(str(plugin_dist))
    importlib.invalidate_caches()
    reset_registry()
    assert "fakedev" not in get_registry().names()
    assert get_backend().name != "fakedev"


SELF_REGISTERING_INIT = '''
"""A plug-in that also registers itself in-process when imported (both paths at once)."""

from accel.backends import Availability, register_backend
from accel.backends.cpu import CPUBackend


class SelfRegBackend(CPUBackend):
    name = "selfreg"
    priority = 7

    def _probe(self):
        return Availability(True, "registers itself on import")


register_backend(SelfRegBackend)
'''

CHILD_SCRIPT = '''
import faulthandler, json, sys
import accel.backends as backends  # torch is imported here, outside the watchdog
faulthandler.dump_traceback_later({watchdog}, exit=True)
registry = backends.get_registry()
faulthandler.cancel_dump_traceback_later()
print(json.dumps({{"names": registry.names(), "errors": [e.error for e in registry.plugin_errors]}}))
'''


def test_plugin_that_registers_itself_on_import_does_not_deadlock(tmp_path):
    """An entry point whose module calls ``register_backend()`` while being loaded.

    ``get_registry()`` loads entry points while holding the registry lock; the plug-in's
    ``register_backend()`` then calls ``get_registry()`` again on the same thread. That must
    not hang. Run in a child process so a hang cannot take this test session down with it.
    """
    package = tmp_path / "selfreg_plugin"
    package.mkdir()
    (package / "__init__.py").write_text(SELF_REGISTERING_INIT)
    dist_info = tmp_path / "selfreg_plugin-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: selfreg-plugin\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nselfreg = selfreg_plugin:SelfRegBackend\n")

    env = dict(os.environ)
    env.pop(OVERRIDE_ENV, None)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path)] + [p for p in [env.get("PYTHONPATH")] if p])
    watchdog = 5
    proc = subprocess.run(
        [sys.executable, "-c", CHILD_SCRIPT.format(watchdog=watchdog)],
        env=env, capture_output=True, text=True, timeout=SAFETY_NET_S,
    )
    assert proc.returncode == 0, (
        f"get_registry() did not return within {watchdog} s (deadlock on the registry lock?) "
        f"or failed; child stderr:\n{proc.stderr[-3000:]}"
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "selfreg" in result["names"], result
    assert result["names"][-1] == "cpu"
