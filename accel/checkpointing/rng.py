"""RNG states in a checkpoint: one snapshot per process, written as accel's JSON (what accel reads) and as
Accelerate's ``random_states_N.pkl`` (what Accelerate reads); read back, and applied through the backend."""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any, Sequence

import torch

from .context import CheckpointContext
from .layout import FORMAT, FORMAT_VERSION, RNG_STATE_NAME, CheckpointError, plural
from .loaders import generator_of
from .manifest import entry_path
from .serialization import b64decode_tensor, b64encode_tensor, load_json, torch_load

logger = logging.getLogger(__name__)


def rng_snapshot(ctx: CheckpointContext, dataloaders: Sequence[Any] = ()) -> dict[str, Any]:
    """This process's RNG states (and those of ``dataloaders``' generators), taken once so that accel's JSON
    file and Accelerate's pkl agree exactly."""
    snapshot: dict[str, Any] = {"step": int(ctx.step), "python": random.getstate(),
                                "torch": torch.get_rng_state(), "numpy": None, "device": None, "generators": {}}
    try:
        import numpy as np

        snapshot["numpy"] = np.random.get_state()
    except ImportError:
        pass
    backend = ctx.backend
    if not backend.is_host:
        # the process's own device for accel; every visible device for Accelerate (its get_rng_state_all)
        snapshot["device"] = {"index": ctx.device.index,
                              "current": backend.get_rng_state(ctx.device.index),
                              "all": [backend.get_rng_state(i) for i in range(backend.device_count())]}
    for i, loader in enumerate(dataloaders):
        generator = generator_of(loader)
        if generator is not None:
            snapshot["generators"][str(i)] = generator.get_state()
    return snapshot


def rng_json(ctx: CheckpointContext, snapshot: dict[str, Any]) -> dict[str, Any]:
    """accel's own RNG file (``random_states_N.json``): plain JSON, read back without any unpickling."""
    version, internal, gauss = snapshot["python"]
    state: dict[str, Any] = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "process_index": ctx.process_index,
        "step": snapshot["step"],
        "python": {"version": version, "state": list(internal), "gauss_next": gauss},
        "torch": b64encode_tensor(snapshot["torch"]),
    }
    if snapshot["numpy"] is not None:
        name, keys, pos, has_gauss, cached = snapshot["numpy"]
        state["numpy"] = {"name": name, "keys": [int(k) for k in keys], "pos": int(pos),
                          "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
    device = snapshot["device"]
    if device is not None:
        state["device"] = {"backend": ctx.backend.name, "index": device["index"],
                           "state": b64encode_tensor(device["current"])}
    state["generators"] = {key: b64encode_tensor(value) for key, value in snapshot["generators"].items()}
    return state


def rng_for_accelerate(ctx: CheckpointContext, snapshot: dict[str, Any]) -> dict[str, Any]:
    """Accelerate's RNG file (``random_states_N.pkl``), so that ``accelerate.Accelerator.load_state`` resumes
    the same draws: its keys, and only types its weights-only loader accepts (tensors, python's state tuple,
    numpy's state tuple with its uint32 array). accel itself reads the JSON twin."""
    state: dict[str, Any] = {"step": snapshot["step"], "random_state": snapshot["python"],
                             "torch_manual_seed": snapshot["torch"]}
    if snapshot["numpy"] is not None:
        state["numpy_random_seed"] = snapshot["numpy"]
    device = snapshot["device"]
    if device is not None:
        if _is_seed(device["current"]):
            # a generator whose state is one integer seed (XLA): Accelerate keeps that integer, for this device
            state[accelerate_device_key(ctx.backend)] = int(device["current"].reshape(-1)[0])
        else:
            state[accelerate_device_key(ctx.backend)] = device["all"]
    return state


def _is_seed(state: torch.Tensor) -> bool:
    return state.dtype == torch.int64 and state.numel() == 1


def accelerate_device_key(backend: Any) -> str:
    """The key under which Accelerate keeps this backend's device RNG states: the one the backend declares
    (``accelerate_rng_key``, e.g. npu's states under the cuda key), else ``torch_<device type>_manual_seed``."""
    return getattr(backend, "accelerate_rng_key", "") or f"torch_{backend.device_type}_manual_seed"


def read_accelerate_rng(path: Path, backend: Any, index: int | None) -> dict[str, Any]:
    """Accelerate's ``random_states_N.pkl``, read weights-only with an allowlist of exactly the numpy types its
    state tuple holds (the array, its dtype, numpy's array rebuild function); nothing else is unpickled.

    Returns the decoded form ``restore_rng`` applies; a value of the wrong shape is named as corrupt.
    """
    import numpy as np

    allowed: list[Any] = [np.ndarray, np.dtype]
    core = getattr(np, "_core", None) or getattr(np, "core")
    allowed.append(core.multiarray._reconstruct)
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None:
        allowed.append(dtypes.UInt32DType)
    safe_globals = getattr(torch.serialization, "safe_globals", None)
    if safe_globals is None:
        raise CheckpointError(f"{path}: reading Accelerate's pickled RNG states needs torch >= 2.5")
    with safe_globals(allowed):
        raw = torch_load(path, "Accelerate's RNG states (torch.save of plain data and numpy arrays)")
    try:
        if not isinstance(raw, dict) or not isinstance(raw.get("torch_manual_seed"), torch.Tensor):
            raise ValueError("expected a dict with a 'torch_manual_seed' tensor")
        state: dict[str, Any] = {"step": int(raw.get("step", 0)), "torch_tensor": raw["torch_manual_seed"],
                                 "generators": {}}
        if "random_state" in raw:
            version, internal, gauss = raw["random_state"]
            state["python_state"] = (int(version), tuple(int(x) for x in internal), gauss)
        if "numpy_random_seed" in raw:
            name, keys, pos, has_gauss, cached = raw["numpy_random_seed"]
            state["numpy"] = {"name": str(name), "keys": [int(k) for k in keys], "pos": int(pos),
                              "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
        devices = raw.get(accelerate_device_key(backend))
        if devices is not None:
            if isinstance(devices, int) and not isinstance(devices, bool):
                devices = [torch.tensor([devices], dtype=torch.int64)] * ((index or 0) + 1)  # one seed (XLA)
            chosen = devices[index or 0]
            if not isinstance(chosen, torch.Tensor):
                raise ValueError(f"{accelerate_device_key(backend)} holds a {type(chosen).__name__}, not tensors")
            state["device"] = {"backend": backend.name, "tensor": chosen}
    except (TypeError, ValueError, IndexError) as exc:
        raise CheckpointError(f"{path} is corrupt: not Accelerate's RNG states ({exc})") from None
    return state


def read_rng(ctx: CheckpointContext, folder: Path, saved_processes: int | None) -> dict[str, Any]:
    """This process's RNG states: accel's JSON file, or (a checkpoint written by Accelerate) its pkl."""
    rank = ctx.process_index
    path = entry_path(folder, f"{RNG_STATE_NAME}_{rank}.json", "the RNG state file")
    legacy = entry_path(folder, f"{RNG_STATE_NAME}_{rank}.pkl", "the RNG state file")
    if not path.exists() and legacy.exists():
        return read_accelerate_rng(legacy, ctx.backend, ctx.device.index)
    if not path.exists() and saved_processes is not None and rank >= saved_processes:
        raise CheckpointError(
            f"{path} is missing: the checkpoint was saved by {plural(saved_processes, 'process')} and this is "
            f"process {rank}; resume with the same number of processes"
        )
    state = load_json(path, f"the RNG states of process {rank} (JSON)")
    if not isinstance(state, dict) or "torch" not in state or "python" not in state:
        raise CheckpointError(f"{path} is corrupt: expected the RNG states of process {rank} (keys 'python', 'torch')")
    try:
        state["torch_tensor"] = b64decode_tensor(state["torch"])
        if "device" in state:
            state["device"]["tensor"] = b64decode_tensor(state["device"]["state"])
        state["generators"] = {int(k): b64decode_tensor(v) for k, v in state.get("generators", {}).items()}
        python = state["python"]
        state["python_state"] = (python["version"], tuple(int(x) for x in python["state"]), python["gauss_next"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path} is corrupt: {type(exc).__name__}: {exc}") from None
    return state


def restore_rng(ctx: CheckpointContext, state: dict[str, Any], folder: Path, dataloaders: Sequence[Any] = ()) -> int | None:
    """Apply the RNG states ``read_rng`` returned to this process, its device and ``dataloaders``' generators.

    Returns the step saved with them (None when the file has none), for the Accelerator to apply.
    """
    if "python_state" in state:
        random.setstate(state["python_state"])
    elif "python" in state:
        p = state["python"]
        random.setstate((p["version"], tuple(p["state"]), p["gauss_next"]))
    if state.get("numpy") is not None:
        import numpy as np

        n = state["numpy"]
        np.random.set_state((n["name"], np.asarray(n["keys"], dtype=np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    if state.get("torch_tensor") is not None:
        torch.set_rng_state(state["torch_tensor"])
    device = state.get("device")
    backend = ctx.backend
    if device is not None:
        if device.get("backend") == backend.name and not backend.is_host:
            backend.set_rng_state(device["tensor"], ctx.device.index)
        else:
            logger.warning("%s: device RNG state of backend %r not restored on backend %r",
                           folder, device.get("backend"), backend.name)
    for i, loader in enumerate(dataloaders):
        saved = state.get("generators", {}).get(i)
        generator = generator_of(loader)
        if saved is not None and generator is not None:
            generator.set_state(saved)
    return int(state["step"]) if "step" in state else None
