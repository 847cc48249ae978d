"""Memory budgets per device and the device map that fits a model into them.

Integer device ids are devices of the active backend (``0`` is ``cuda:0`` on CUDA, ``xpu:0`` on XPU);
``"cpu"`` and ``"disk"`` are host RAM and the offload folder."""

from __future__ import annotations

import logging
import warnings
from collections import OrderedDict
from typing import Any, Mapping, Optional, Union

import torch
import torch.nn as nn

from .sizes import (
    _is_leaf_layer,
    _top_level_entries,
    compute_module_sizes,
    compute_module_total_buffer_size,
    convert_file_size_to_int,
    get_max_layer_size,
    get_module_leaves,
)
from .ties import _getattr_path, check_tied_parameters_in_config, find_tied_parameters

logger = logging.getLogger(__name__)

_HOST_KEYS = ("mps", "cpu", "disk")


def _backend():
    from accel.backends import get_backend

    return get_backend()


def _accelerator():
    """The active backend when it drives an accelerator (not the host), else None."""
    backend = _backend()
    return None if backend.is_host else backend


def get_max_memory(max_memory: Optional[dict[Union[int, str], Union[int, str]]] = None) -> dict[Union[int, str], int]:
    """Memory budget per device: the free memory of every device when ``None``, else ``max_memory`` in bytes.

    Keys are ordered accelerator ids first (ascending), then ``"mps"``, ``"cpu"``, ``"disk"``. Free memory
    comes from the active backend; a device that cannot report it is left out (logged).
    """
    import psutil

    if max_memory is None:
        budget: dict[Union[int, str], int] = {}
        backend = _accelerator()
        if backend is not None:
            for index in range(backend.device_count()):
                try:
                    torch.zeros(1, device=backend.device(index))  # initialise the device's context
                    budget[index] = int(backend.mem_get_info(index)[0])
                except Exception as exc:
                    logger.info(f"Device {index} seems unavailable ({type(exc).__name__}: {exc}), proceeding to check subsequent devices.")
        budget["cpu"] = int(psutil.virtual_memory().available)
        return budget

    budget = {}
    for key, value in max_memory.items():
        budget[key] = convert_file_size_to_int(value) if isinstance(value, str) else value
    ids = sorted(k for k in budget if isinstance(k, int) and not isinstance(k, bool))
    backend = _accelerator()
    count = backend.device_count() if backend is not None else 0
    for index in ids:
        if not 0 <= index < count:
            logger.warning(f"Device {index} is not available, available devices are {list(range(count))}")
    order = ids + [k for k in _HOST_KEYS if k in budget]
    unknown = [k for k in budget if k not in order]
    if unknown:
        raise ValueError(
            f"Device {unknown[0]} is not recognized, available devices are integers(for GPU/XPU), 'mps', 'cpu' and 'disk'"
        )
    return {k: budget[k] for k in order}


def _normalise_no_split(no_split_module_classes: Any) -> list[str]:
    if no_split_module_classes is None:
        return []
    if isinstance(no_split_module_classes, str):
        return [no_split_module_classes]
    return list(no_split_module_classes)


def get_balanced_memory(
    model: nn.Module,
    max_memory: Optional[dict[Union[int, str], Union[int, str]]] = None,
    no_split_module_classes: Optional[list[str]] = None,
    dtype: Optional[Union[str, torch.dtype]] = None,
    special_dtypes: Optional[dict[str, Union[str, torch.dtype]]] = None,
    low_zero: bool = False,
) -> dict[Union[int, str], int]:
    """A ``max_memory`` for ``infer_auto_device_map`` that spreads the model evenly over the accelerators.

    Every device but the last gets the model size divided by the number of devices plus a margin
    (1.25 x the larger of the biggest no-split block and the mean leaf-module size); the last keeps
    its whole budget. ``low_zero`` keeps device 0 as empty as possible (e.g. for ``generate``).
    """
    user_set = max_memory is not None
    budget = get_max_memory(max_memory)
    devices = [k for k in budget if (isinstance(k, int) or k == "mps") and budget[k] > 0]
    if not devices:
        return budget
    if len(devices) == 1:
        low_zero = False
        if not user_set:
            for key in budget:
                if isinstance(key, int):
                    budget[key] = int(budget[key] * 0.9)
                    logger.info(
                        f"We will use 90% of the memory on device {key} for storing the model, and 10% for the buffer to avoid OOM. "
                        "You can set `max_memory` in to a higher value to use more memory (at your own risk)."
                    )
                    break

    sizes = compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes)
    per_device = sizes[""] // (len(devices) - 1 if low_zero else len(devices))

    no_split = _normalise_no_split(no_split_module_classes)
    block = 0
    if no_split:
        seen: dict[str, int] = {}
        for name, size in sizes.items():
            if not name:
                continue
            try:
                cls_name = type(_getattr_path(model, name)).__name__
            except AttributeError:
                continue
            if cls_name in no_split and cls_name not in seen:
                seen[cls_name] = size
                if len(seen) == len(set(no_split)):
                    break
        block = max(seen.values(), default=0)

    # leaves of the size table are tensors; without them, the leaves are the innermost modules
    tensor_names = set(get_module_leaves(sizes))
    module_only = {n: v for n, v in sizes.items() if n not in tensor_names}
    innermost = get_module_leaves(module_only)
    mean_leaf = int(sum(module_only[n] for n in innermost) / max(len(innermost), 1))
    per_device += int(1.25 * max(block, mean_leaf))

    ids = sorted(k for k, v in budget.items() if isinstance(k, int) and v > 0)
    for index in ids[:-1]:
        cap = budget[0] if (low_zero and index == 0) else per_device
        budget[index] = min(cap, budget[index])
    if low_zero:
        rest = sum(budget.get(i, 0) for i in range(1, len(devices)))
        budget[0] = min(max(0, sizes[""] - rest), budget[0])
    return budget


# ---------------------------------------------------------------------------------------------- device maps
def clean_device_map(device_map: dict[str, Any], module_name: str = "") -> dict[str, Any]:
    """Merge entries: a module whose submodules all go to one device becomes one entry (in place)."""
    prefix = f"{module_name}." if module_name else ""
    inside = [k for k in device_map if k.startswith(prefix)]
    values = [device_map[k] for k in inside]
    if len(values) > 1 and len({_hashable(v) for v in values}) == 1:
        for key in inside:
            del device_map[key]
        device_map[module_name] = values[0]
    depth = len(module_name.split(".")) + 1 if module_name else 1
    children = {".".join(k.split(".")[:depth]) for k in device_map if k.startswith(prefix) and len(k) > len(module_name)}
    for child in children:
        clean_device_map(device_map, module_name=child)
    return device_map


def _hashable(value: Any) -> Any:
    return str(value) if isinstance(value, torch.device) else value


def _contains(outer: str, name: str) -> bool:
    """True when ``name`` is ``outer`` or inside it (``a.1`` does not contain ``a.10``)."""
    return outer == "" or name == outer or name.startswith(outer + ".")


def check_device_map(model: nn.Module, device_map: Mapping[str, Any]) -> None:
    """Check ``device_map`` gives exactly one device to every tensor of ``model``.

    Raises ``ValueError`` naming the tensors left without a device, or the two entries that give one
    module different devices (``{"block": 0, "block.attn": "cpu"}``); warns about keys naming no module.
    """
    known = set(dict(model.named_modules())) | set(model.state_dict()) | {n for n, _ in model.named_parameters()}
    unknown = [k for k in device_map if k != "" and k not in known]
    if unknown:
        warnings.warn(f"The following device_map keys do not match any submodules in the model: {unknown}", UserWarning)
    for inner in device_map:
        probe = inner
        while probe:  # every enclosing entry must agree with this one
            probe = probe.rsplit(".", 1)[0] if "." in probe else ""
            if probe in device_map and _hashable(device_map[probe]) != _hashable(device_map[inner]):
                raise ValueError(
                    f"The device_map gives module {inner!r} two devices: {device_map[inner]!r} from its own entry and "
                    f"{device_map[probe]!r} from {probe!r}. Give each module one device."
                )
    if "" in device_map:
        return
    uncovered = [name for name in model.state_dict() if not any(_contains(k, name) for k in device_map)]
    if uncovered:
        raise ValueError(
            f"The device_map provided does not give any device for the following parameters: {', '.join(uncovered)}"
        )


def get_module_size_with_ties(
    tied_params: list[str],
    module_size: int,
    module_sizes: Mapping[str, int],
    modules_to_treat: list[tuple[str, Any]],
) -> tuple[int, list[str], list[Any]]:
    """Size of a module plus the modules holding the weights tied to it, and those modules (names, objects)."""
    if not tied_params:
        return module_size, [], []
    names, modules = [], []
    total = module_size
    for param in tied_params:
        owner = next(((n, m) for n, m in modules_to_treat if param.startswith(n + ".")), None)
        if owner is None:
            raise ValueError(f"tied parameter {param!r} belongs to none of the modules left to place")
        names.append(owner[0])
        modules.append(owner[1])
        total += module_sizes[owner[0]] - module_sizes[param]
    return total, names, modules


def _tie_groups_crossing(name: str, tied_parameters: list[list[str]]) -> list[str]:
    """Parameters tied to something inside ``name`` that live outside it."""
    inside = lambda p: (p + ".").startswith(name + ".") or name == ""  # noqa: E731
    out: list[str] = []
    for group in tied_parameters:
        if any(inside(p) for p in group) and not all(inside(p) for p in group):
            out.extend(p for p in group if not inside(p))
    return out


def _children_with_params(name: str, module: nn.Module) -> list[tuple[str, Any]]:
    entries = list(module.named_parameters(recurse=False)) + list(module.named_children())
    return [(f"{name}.{n}", v) for n, v in entries]


def fallback_allocate(
    modules: list[tuple[str, Any]],
    module_sizes: Mapping[str, int],
    size_limit: Union[int, str],
    no_split_module_classes: Optional[list[str]] = None,
    tied_parameters: Optional[list[list[str]]] = None,
) -> tuple[Optional[str], Any, list[tuple[str, Any]]]:
    """Breadth-first search for a (sub)module that fits ``size_limit``; returns it and the remaining list.

    ``(None, None, modules)`` when nothing fits.
    """
    try:
        limit = convert_file_size_to_int(size_limit)
    except ValueError:
        return None, None, modules
    no_split = no_split_module_classes or []
    tied_parameters = tied_parameters or []
    queue = list(modules)
    found = None
    while queue:
        name, module = queue.pop(0)
        ties = _tie_groups_crossing(name, tied_parameters)
        size, _, _ = get_module_size_with_ties(ties, module_sizes[name], module_sizes, queue)
        if size <= limit:
            found = (name, module)
            break
        if isinstance(module, torch.Tensor) or _is_leaf_layer(module, no_split):
            continue
        queue[:0] = _children_with_params(name, module)
    if found is None:
        return None, None, modules
    name = found[0]
    # expand the found module's ancestors in ``modules`` so it is directly in the list, then take it out
    remaining = list(modules)
    parts = name.split(".")
    for depth in range(1, len(parts)):
        parent = ".".join(parts[:depth])
        names = [n for n, _ in remaining]
        if parent in names:
            i = names.index(parent)
            remaining[i : i + 1] = _children_with_params(parent, remaining[i][1])
    names = [n for n, _ in remaining]
    taken = remaining.pop(names.index(name))
    return taken[0], taken[1], remaining


def infer_auto_device_map(
    model: nn.Module,
    max_memory: Optional[dict[Union[int, str], Union[int, str]]] = None,
    no_split_module_classes: Optional[list[str]] = None,
    dtype: Optional[Union[str, torch.dtype]] = None,
    special_dtypes: Optional[dict[str, Union[str, torch.dtype]]] = None,
    verbose: bool = False,
    clean_result: bool = True,
    offload_buffers: bool = False,
    fallback_allocation: bool = False,
) -> dict[str, Union[int, str]]:
    """A device map filling accelerators in order, then the CPU, then the disk.

    Rules (Accelerate's): no device's budget is exceeded; the first accelerator and the CPU keep room
    for the largest layer (an offloaded layer is brought there to run); modules are split into their
    children only when they do not fit and are not in ``no_split_module_classes``; tied weights go to
    the device of the first module holding one of them. Works on meta models (sizes come from shapes
    and dtypes). Warns when the buffers of offloaded layers fit no accelerator (see ``offload_buffers``).
    """
    budget = get_max_memory(max_memory)
    no_split = _normalise_no_split(no_split_module_classes)
    devices = list(budget)
    if "disk" not in devices:
        devices.append("disk")
    accelerators = [d for d in devices if d not in ("cpu", "disk")]
    if "mps" in accelerators:
        reserve_on = ["mps"]
    elif accelerators:
        reserve_on = [accelerators[0], "cpu"]
    else:
        reserve_on = ["cpu"]

    sizes = compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes)
    tied_parameters = find_tied_parameters(model)
    if check_tied_parameters_in_config(model) and not tied_parameters:
        logger.warning(
            "The model weights are not tied. Please use the `tie_weights` method before using the `infer_auto_device` function."
        )
    queue: list[tuple[str, Any]] = _top_level_entries(model)

    def modules_in(entries: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
        return [(n, m) for n, m in entries if isinstance(m, nn.Module)]

    device_map: dict[str, Union[int, str]] = OrderedDict()
    used = {d: 0 for d in devices}
    buffer_bytes: dict[Any, int] = {}
    min_needed: dict[Any, int] = {}
    slot = 0
    largest, largest_names = get_max_layer_size(queue, sizes, no_split)

    def say(msg: str) -> None:
        if verbose:
            print(msg)

    while queue:
        name, module = queue.pop(0)
        say(f"\nTreating module {name}.")
        largest_names = [n for n in largest_names if n != name and not n.startswith(name + ".")]
        if not largest_names:
            largest, largest_names = get_max_layer_size(modules_in(queue), sizes, no_split)
        size = sizes[name]
        ties = _tie_groups_crossing(name, tied_parameters)
        device = devices[slot]
        limit = budget[device] if device != "disk" else None
        reserved = 0
        if device in reserve_on:
            limit -= largest
            reserved = largest
        size_with_ties, tied_names, tied_modules = get_module_size_with_ties(ties, size, sizes, queue)

        # 1. it fits, with whatever is tied to it
        if limit is None or used[device] + size_with_ties <= limit:
            say(f"Putting {name} (size={size_with_ties}) on {device}.")
            used[device] += size_with_ties
            device_map[name] = device
            for tied_name in tied_names:
                queue = [(n, m) for n, m in queue if n != tied_name]
                device_map[tied_name] = device
            if not offload_buffers and isinstance(module, nn.Module):
                buffer_bytes[device] = buffer_bytes.get(device, 0) + compute_module_total_buffer_size(
                    module, dtype=dtype, special_dtypes=special_dtypes
                )
            continue

        # 2. it fits alone: split one of the tied modules and retry
        if ties and used[device] + size <= limit:
            split = False
            for tied_name, tied_module in zip(tied_names, tied_modules):
                if _is_leaf_layer(tied_module, no_split):
                    continue
                say(f"Splitting {tied_name}.")
                i = next(i for i, (n, _) in enumerate(queue) if n == tied_name)
                queue = [(name, module)] + queue[:i] + _children_with_params(tied_name, tied_module) + queue[i + 1 :]
                largest, largest_names = get_max_layer_size(modules_in(queue), sizes, no_split)
                split = True
                break
            if split:
                continue
            say("None of the tied module can be split, going to the next device.")

        # 3. it does not fit: split it when possible
        if used[device] + size >= limit:
            if not isinstance(module, torch.Tensor) and not _is_leaf_layer(module, no_split):
                say(f"Splitting {name}.")
                queue = _children_with_params(name, module) + queue
                largest, largest_names = get_max_layer_size(modules_in(queue), sizes, no_split)
                continue
            say("This module cannot be split, going to the next device.")

        # 4. nothing placed here yet: look for any smaller module that fits
        if used[device] == 0 and fallback_allocation and device != "disk":
            room = budget[device] - max(largest, size_with_ties)
            fb_name, fb_module, rest = fallback_allocate(queue, sizes, room - used[device], no_split, tied_parameters)
            if fb_module is not None:
                queue = [(fb_name, fb_module), (name, module)] + rest
                continue

        # 5. next device
        if used[device] == 0:
            min_needed[device] = size_with_ties + reserved
        used[device] += reserved
        slot += 1
        queue.insert(0, (name, module))

    used = {d: m for d, m in used.items() if m > 0}
    if clean_result:
        device_map = clean_device_map(device_map)

    offloaded_buffers = buffer_bytes.get("cpu", 0) + buffer_bytes.get("disk", 0)
    if offloaded_buffers > 0 and not offload_buffers and accelerators:
        fits = any(mem >= offloaded_buffers + used.get(d, 0) for d, mem in budget.items() if d not in ("cpu", "disk"))
        if not fits:
            warnings.warn(
                f"Current model requires {offloaded_buffers} bytes of buffer for offloaded layers, which seems does "
                f"not fit any GPU's remaining memory. If you are experiencing a OOM later, please consider using "
                f"offload_buffers=True."
            )
    if min_needed:
        info = "\n".join(f"  - {d}: {m} bytes required" for d, m in min_needed.items())
        logger.info(
            "Based on the current allocation process, no modules could be assigned to the following devices due to "
            f"insufficient memory:\n{info}\nThese minimum requirements are specific to this allocation attempt and may "
            "vary. Consider increasing the available memory for these devices to at least the specified minimum, or "
            "adjusting the model config."
        )
    return device_map
