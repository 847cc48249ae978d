"""The host as a device (``accel.backends.is_host_device``) and the rule it serves: outside ``accel/backends``
no code asks "is it the host?" by comparing a device type or a backend's name with ``"cpu"``.

The scan reads the syntax tree: a comparison (``==``, ``!=``, ``in``, ``not in``) between ``"cpu"`` (alone or
in a literal tuple/list/set) and a device-type expression (``x.type``, ``x.device_type``, a name ending in
``device_type``, ``getattr(x, "device_type")``, ``backend.name``). A device map's places (``d == "cpu"``,
``d in ("cpu", "disk")``) are the user's vocabulary, not a device type, and are not reported.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import Iterable

import pytest
import torch

from accel.backends import HOST_DEVICE_TYPE, get_registry, is_host_device
from accel.backends.cpu import CPUBackend
from accel.facts.backends import HOST_BACKEND

ROOT = Path(__file__).resolve().parents[3]
SCANNED = ("accel", "accel_harness", "accel_reports")
HOME = "accel/backends/"

#: (path, the comparison) -> why it stays for now; matched by text, so edits elsewhere in the file do not move it
PENDING: dict[tuple[str, str], str] = {}


def test_the_host_is_the_cpu_device_and_nothing_else():
    assert HOST_DEVICE_TYPE == HOST_BACKEND == CPUBackend().device_type
    assert is_host_device(torch.device("cpu")) and is_host_device(torch.empty(0).device)
    assert is_host_device("cpu") and is_host_device("cpu:0") and is_host_device(" cpu ")
    assert not any(is_host_device(d) for d in ("cuda", "cuda:1", "xpu:0", "meta", "disk", torch.device("meta"), 0, 3))


@pytest.mark.parametrize("bad", [None, 1.5, True, object()])
def test_is_host_device_refuses_what_is_no_device(bad):
    with pytest.raises(TypeError, match="is_host_device needs a torch.device"):
        is_host_device(bad)


def test_backend_is_host_agrees_with_its_device_type():
    registry = get_registry()
    for name in registry.names():
        backend = registry.get(name)
        assert backend.is_host is is_host_device(backend.device_type), name
    assert CPUBackend().is_host


# ---------------------------------------------------------------------------------------------- the scan
def _names_the_host(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value == HOST_DEVICE_TYPE
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(isinstance(e, ast.Constant) and e.value == HOST_DEVICE_TYPE for e in node.elts)
    return False


def _is_device_type(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute):
        if node.attr in ("type", "device_type"):
            return True
        return node.attr == "name" and ast.unparse(node.value).split(".")[-1].endswith("backend")
    if isinstance(node, ast.Name):
        return node.id.endswith("device_type")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
        return len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value == "device_type"
    return False


def find_host_checks(root: Path = ROOT, dirs: Iterable[str] = SCANNED) -> dict[tuple[str, int], str]:
    """(path, line) -> source of each host check outside ``accel/backends`` under ``root/dirs``."""
    hits = {}
    for top in dirs:
        for path in sorted((root / top).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            if relative.startswith(HOME):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, ast.Compare):
                    continue
                operands = [node.left, *node.comparators]
                if any(map(_names_the_host, operands)) and any(map(_is_device_type, operands)):
                    hits[(relative, node.lineno)] = ast.unparse(node)
    return hits


@functools.lru_cache(maxsize=1)
def repository_checks() -> dict[tuple[str, int], str]:
    """:func:`find_host_checks` of this repository, once per session (two tests read it)."""
    return find_host_checks()


def test_no_host_check_outside_backends():
    hits = {(path, line): text for (path, line), text in repository_checks().items() if (path, text) not in PENDING}
    assert not hits, ("ask accel.backends.is_host_device(device) or backend.is_host instead of comparing with "
                      "'cpu':\n  " + "\n  ".join(f"{p}:{n}: {text}" for (p, n), text in sorted(hits.items())))


def test_pending_entries_are_still_there():
    """A pending entry whose check is gone is removed, so the list only shrinks."""
    found = {(path, text) for (path, _), text in repository_checks().items()}
    assert not [entry for entry in PENDING if entry not in found]


def test_the_scan_finds_each_form(tmp_path):
    (tmp_path / "accel" / "backends").mkdir(parents=True)
    (tmp_path / "accel" / "backends" / "own.py").write_text('ok = device.type == "cpu"\n')
    (tmp_path / "accel" / "m.py").write_text(
        'a = device.type != "cpu"\nb = backend.device_type == "cpu"\nc = device_type != "cpu"\n'
        'd = t.type not in ("cpu", "meta")\ne = getattr(backend, "device_type", None) == "cpu"\n'
        'f = self.backend.name == "cpu"\n'
        'ok1 = d == "cpu"\nok2 = d in ("cpu", "disk")\nok3 = backend.is_host\nok4 = device.type == "meta"\n'
        'ok5 = name != "cpu"\nx = "device.type == \'cpu\'"\n')
    assert sorted(find_host_checks(tmp_path, ("accel",))) == [("accel/m.py", n) for n in range(1, 7)]
