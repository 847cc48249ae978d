"""Does DeepSpeed pick the same accelerator as accel?

DeepSpeed chooses its accelerator by itself, through ``deepspeed.accelerator.get_accelerator()``:
``DS_ACCELERATOR`` when set, else its own probe order. Where that choice differs from accel's
registry, a DeepSpeed job and accel's Accelerator on the same machine put their work on different
devices or use different collective libraries. ``accel env`` and the conformance suites report the
two side by side.

A device outside DeepSpeed's list brings its own accelerator class (``Backend.deepspeed_accelerator``);
:func:`install_deepspeed_accelerator` hands it to DeepSpeed's ``set_accelerator``, and the probe here
does the same in its child, so the answer is what a DeepSpeed run through accel gets.

DeepSpeed is asked in a child process: its choice is a process-wide cache, importing it logs and
takes about a second, and a broken install must not take the caller down with it.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Mapping

__all__ = ["COMM_FAMILIES", "clear_rejected_ds_accelerator", "compare", "deepspeed_accelerator_problem",
           "deepspeed_accelerator_types", "deepspeed_installed", "install_deepspeed_accelerator", "probe_deepspeed",
           "provided_accelerator"]

#: collective library names that are the same library under two names (Intel's oneCCL: the
#: oneccl_bindings "ccl" and torch's built-in "xccl" from 2.7)
COMM_FAMILIES = ({"ccl", "xccl"},)

#: printed by the child as its last line: what DeepSpeed chose
_PROBE = """
import importlib
import json
import sys
import deepspeed
from deepspeed.accelerator import get_accelerator
provided = sys.argv[1] if len(sys.argv) > 1 else ""
if provided:
    from deepspeed.accelerator import set_accelerator
    module, _, name = provided.partition(":")
    set_accelerator(getattr(importlib.import_module(module), name)())
accelerator = get_accelerator()
try:
    comm = accelerator.communication_backend_name()
except Exception as exc:
    comm = None
print(json.dumps({"version": deepspeed.__version__, "device": accelerator.device_name(),
                  "communication_backend": comm, "class": type(accelerator).__name__}))
"""


def deepspeed_installed() -> bool:
    """True when DeepSpeed can be imported here (found, not imported)."""
    return importlib.util.find_spec("deepspeed") is not None


def provided_accelerator(backend: Any) -> str | None:
    """The ``"module:Class"`` of the DeepSpeed accelerator ``backend`` brings, or None (DeepSpeed chooses).

    Any object is accepted: one without the capability, or whose answer fails, brings none.
    """
    try:
        spec = getattr(backend, "deepspeed_accelerator", None)
    except Exception:  # a broken plug-in answer must not break a skip decision or a report
        return None
    return spec if isinstance(spec, str) and spec else None


def deepspeed_accelerator_problem(backend: Any) -> str | None:
    """Why DeepSpeed cannot run on ``backend``'s device, or None when it can: DeepSpeed's own list names
    the device, the backend brings its own accelerator, or the list cannot be read (then DeepSpeed is let try)."""
    if provided_accelerator(backend):
        return None
    device_type = getattr(backend, "device_type", None)
    supported = deepspeed_accelerator_types()
    if device_type and supported and device_type not in supported:
        return f"DeepSpeed has no accelerator for {device_type} (DS_ACCELERATOR accepts {', '.join(supported)})"
    return None


def _without_rejected_ds_accelerator(environ: dict[str, str]) -> dict[str, str]:
    """``environ`` less a ``DS_ACCELERATOR`` DeepSpeed's import would reject (a name outside its list, such as a
    plug-in device's own): with an accelerator installed by ``set_accelerator`` the variable chooses nothing."""
    known = deepspeed_accelerator_types()
    if known and environ.get("DS_ACCELERATOR") not in (None, *known):
        environ = {k: v for k, v in environ.items() if k != "DS_ACCELERATOR"}
    return environ


def clear_rejected_ds_accelerator() -> None:
    """Remove a ``DS_ACCELERATOR`` DeepSpeed's import would raise on from this process's environment, before
    DeepSpeed is imported (for a backend that brings its own accelerator, the variable chooses nothing)."""
    if "deepspeed.accelerator" in sys.modules or "DS_ACCELERATOR" not in os.environ:
        return
    if "DS_ACCELERATOR" not in _without_rejected_ds_accelerator(dict(os.environ)):
        del os.environ["DS_ACCELERATOR"]


def install_deepspeed_accelerator(backend: Any) -> Any | None:
    """Hand the accelerator ``backend`` brings to DeepSpeed's ``set_accelerator`` in this process; returns it.

    None (and nothing done) for a backend that brings none. Idempotent: an accelerator of the same class
    already installed is kept. DeepSpeed's import itself asks ``get_accelerator()`` (its op builders and a few
    defaults are bound then), so the install follows the import and precedes every engine and collective.
    """
    spec = provided_accelerator(backend)
    if spec is None:
        return None
    clear_rejected_ds_accelerator()
    from deepspeed.accelerator import get_accelerator, set_accelerator

    current = get_accelerator()
    if f"{type(current).__module__}:{type(current).__qualname__}" == spec:
        return current
    accelerator = backend.create_deepspeed_accelerator()
    set_accelerator(accelerator)
    return accelerator


def probe_deepspeed(environ: Mapping[str, str] | None = None, timeout: float = 120.0,
                    backend: Any = None) -> dict[str, Any]:
    """What DeepSpeed's ``get_accelerator()`` chooses in a fresh process with ``environ``.

    With a ``backend`` that brings its own accelerator, the child installs it first, as accel does in a
    process running DeepSpeed (a ``DS_ACCELERATOR`` DeepSpeed would reject is left out then).

    Returns ``{"installed": False}`` without DeepSpeed, else ``installed``, ``version``, ``device``
    (DeepSpeed's ``device_name()``, e.g. ``cuda``), ``communication_backend``, ``class``,
    ``ds_accelerator`` (the variable as given), ``provided`` (the backend's ``"module:Class"``, only when
    it brings one), or ``error`` when the child failed.
    """
    if not deepspeed_installed():
        return {"installed": False}
    env = dict(os.environ if environ is None else environ)
    provided = provided_accelerator(backend) if backend is not None else None
    return dict(_probe(tuple(sorted(env.items())), timeout, provided))


@functools.lru_cache(maxsize=16)
def _probe(env_items: tuple[tuple[str, str], ...], timeout: float, provided: str | None = None) -> dict[str, Any]:
    """One child per distinct environment and provided accelerator: DeepSpeed's choice depends on nothing else."""
    env = dict(env_items)
    result: dict[str, Any] = {"installed": True, "ds_accelerator": env.get("DS_ACCELERATOR")}
    if provided:
        result["provided"] = provided
        env = _without_rejected_ds_accelerator(env)
    try:
        # -I would also drop PYTHONPATH (where a vendor may install DeepSpeed), so instead run from a
        # neutral folder: ``python -c`` puts the working directory first on sys.path
        proc = subprocess.run([sys.executable, "-c", _PROBE, *([provided] if provided else [])], env=env,
                              capture_output=True, text=True,
                              errors="replace", timeout=timeout, check=False, cwd=tempfile.gettempdir())
    except subprocess.TimeoutExpired:
        return {**result, "error": f"DeepSpeed's get_accelerator() did not answer within {timeout:g} s"}
    except OSError as exc:
        return {**result, "error": f"could not start a Python process to ask DeepSpeed: {exc}"}
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {**result, "error": f"DeepSpeed's get_accelerator() failed (exit {proc.returncode}): {tail}"}
    try:
        answer = json.loads(lines[-1])
    except json.JSONDecodeError:
        return {**result, "error": f"DeepSpeed's probe printed no JSON: {lines[-1][:200]!r}"}
    return {**result, **answer}


def _same_comm(a: str | None, b: str | None) -> bool:
    if a == b:
        return True
    return any(a in family and b in family for family in COMM_FAMILIES)


def compare(backend: Any, deepspeed: Mapping[str, Any]) -> dict[str, Any]:
    """Compare accel's ``backend`` with a :func:`probe_deepspeed` answer.

    ``agree`` is True when both use the same device type and the same collective library
    (``ccl``/``xccl`` count as one; a backend on which accel runs no collectives, such as mps, only
    gets a note); ``problems`` says what differs, in words. None when DeepSpeed is not installed or
    its probe failed (``problems`` then says why).
    """
    out: dict[str, Any] = {"accel_backend": backend.name, "accel_device": backend.device_type,
                           "deepspeed_device": deepspeed.get("device"),
                           "deepspeed_communication_backend": deepspeed.get("communication_backend")}
    try:
        out["accel_communication_backend"] = backend.comm_backend
    except Exception as exc:  # an unusable collective setting is itself worth reporting
        out["accel_communication_backend"] = None
        out["accel_communication_error"] = f"{type(exc).__name__}: {exc}"
    if not deepspeed.get("installed"):
        return {**out, "agree": None, "problems": ["DeepSpeed is not installed"]}
    if deepspeed.get("error"):
        return {**out, "agree": None, "problems": [deepspeed["error"]]}
    problems = []
    notes = []
    accel_comm = out["accel_communication_backend"]
    provided = deepspeed.get("provided")
    if provided:
        notes.append(f"the {backend.name} backend's plug-in provides DeepSpeed's accelerator ({provided}), "
                     "installed with deepspeed.accelerator.set_accelerator")
    if deepspeed.get("device") != backend.device_type:
        if provided:
            how = f"the accelerator {provided} the backend provides"
        elif deepspeed.get("ds_accelerator"):
            how = f"DS_ACCELERATOR={deepspeed['ds_accelerator']}"
        else:
            how = "its own detection"
        known = deepspeed_accelerator_types()
        if provided_accelerator(backend) and not provided:
            advice = (f"the {backend.name} backend provides its own DeepSpeed accelerator "
                      f"({provided_accelerator(backend)}), which accel installs in every process that runs DeepSpeed "
                      "on it; DS_ACCELERATOR cannot name it")
        elif provided:
            advice = f"the accelerator the {backend.name} backend provides names another device"
        elif known and backend.device_type not in known:  # only advice that works: DS_ACCELERATOR={it} raises
            advice = (f"DeepSpeed has no accelerator for {backend.device_type!r} (DS_ACCELERATOR accepts "
                      f"{', '.join(known)}), so DeepSpeed cannot run on this backend; run DeepSpeed on another "
                      "backend with ACCEL_DEVICE")
        else:
            advice = f"set DS_ACCELERATOR={backend.device_type} or ACCEL_DEVICE to match"
        problems.append(f"DeepSpeed uses {deepspeed.get('device')!r} ({how}) but accel uses {backend.device_type!r} "
                        f"(backend {backend.name}): {advice}")
    elif accel_comm is None and "accel_communication_error" not in out:
        # single-process backends (mps): accel runs no collectives there, so there is nothing to disagree on
        notes.append(f"accel's {backend.name} backend runs no collectives; DeepSpeed names "
                     f"{deepspeed.get('communication_backend')!r}")
    elif not _same_comm(deepspeed.get("communication_backend"), accel_comm):
        problems.append(f"DeepSpeed's collectives use {deepspeed.get('communication_backend')!r} but accel's "
                        f"{backend.name} backend uses {accel_comm!r}")
    return {**out, "agree": not problems, "problems": problems, "notes": notes}


@functools.lru_cache(maxsize=None)
def deepspeed_accelerator_types() -> tuple[str, ...]:
    """The device types the installed DeepSpeed has an accelerator for, read from its source without importing
    it (importing DeepSpeed takes seconds); empty when DeepSpeed or that list cannot be found."""
    import ast
    from pathlib import Path

    try:
        spec = importlib.util.find_spec("deepspeed")
    except (ImportError, ValueError):
        return ()
    for location in list(spec.submodule_search_locations or []) if spec else []:
        try:
            tree = ast.parse((Path(location) / "accelerator" / "real_accelerator.py").read_text())
        except (OSError, SyntaxError, ValueError):
            continue
        for node in tree.body:
            if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                    and node.targets[0].id == "SUPPORTED_ACCELERATOR_LIST"):
                try:
                    return tuple(str(v) for v in ast.literal_eval(node.value))
                except ValueError:
                    return ()
    return ()
