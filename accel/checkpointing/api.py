"""``save_state`` and ``load_state``, the Accelerator-facing halves that tie the parts together: the
transaction, the files of each prepared object, the manifest and its checks, RNG states.

The Accelerator passes what it prepared as a :class:`~accel.strategies.context.PreparedObjects` and
its state pre-hooks as values; both functions return what the Accelerator must apply (the next
checkpoint iteration, the restored step) instead of writing into it.
"""

from __future__ import annotations

import logging
import os
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from ..strategies.base import Strategy
from ..strategies.context import PreparedObjects
from ..io.files import fsync_dir
from . import serialization
from .context import CheckpointContext
from .layout import (
    CHECKPOINT_DIR,
    CHECKPOINTS_FOLDER,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_NAME,
    MODEL_NAME,
    OPTIMIZER_NAME,
    RNG_STATE_NAME,
    SAFE_MODEL_NAME,
    SAMPLER_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
    CUSTOM_NAME,
    CheckpointError,
    index_suffix,
    plural,
)
from .loaders import dataloader_state, restore_dataloader
from .manifest import (
    accel_version,
    accelerate_manifest,
    check_entries,
    check_integrity,
    checksums_enabled,
    compute_checksums,
    entry_path,
)
from .rng import read_rng, restore_rng, rng_for_accelerate, rng_json, rng_snapshot
from .serialization import check_plain, json_save, load_json, load_safetensors, tensors_for_safetensors, torch_load
from .transaction import clean_leftovers, commit, is_writer, list_checkpoints, retire, retired_by_limit, shared_token

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SavedState:
    """What ``save_state`` did: the folder it wrote (as given) and the iteration the next automatic name takes."""

    path: str
    iteration: int


@dataclass(frozen=True)
class LoadedState:
    """What ``load_state`` restored that the Accelerator holds: ``step`` and the next ``iteration`` (None: unchanged)."""

    folder: str
    step: int | None = None
    iteration: int | None = None


def save_state(ctx: CheckpointContext, prepared: PreparedObjects, output_dir: str | os.PathLike | None = None,
               safe_serialization: bool = True, pre_hooks: Sequence[Callable[..., None]] = (),
               **save_model_func_kwargs: Any) -> SavedState:
    """Save models, optimizers, schedulers, data loader positions, scaler, registered objects and RNG states.

    ``ctx`` gives the process layout, the project configuration, the strategy and state dicts;
    ``prepared`` what to save; ``pre_hooks`` run before the models are written (Accelerate's protocol).
    """
    cfg = ctx.project_configuration
    automatic = cfg.automatic_checkpoint_naming
    strategy = ctx.strategy
    doomed: list[Path] = []  # checkpoints total_limit retires once this one is in place
    if save_model_func_kwargs and type(strategy).save_checkpoint is Strategy.save_checkpoint:
        warnings.warn(
            f"save_state: {sorted(save_model_func_kwargs)} are used by DeepSpeed's save_checkpoint only and are "
            f"ignored by the {strategy.name!r} strategy", stacklevel=3,
        )
        save_model_func_kwargs = {}
    if automatic:
        if cfg.project_dir is None:
            raise ValueError("automatic_checkpoint_naming needs a project_dir (Accelerator(project_dir=...) or ProjectConfiguration)")
        if output_dir is not None:
            warnings.warn(
                f"save_state({output_dir!r}) ignores output_dir: automatic_checkpoint_naming saves to "
                f"{cfg.project_dir}/{CHECKPOINTS_FOLDER}/checkpoint_<iteration>", stacklevel=3,
            )
        target = Path(os.path.expanduser(cfg.project_dir)) / CHECKPOINTS_FOLDER / f"checkpoint_{cfg.iteration}"
        if cfg.total_limit is not None:
            doomed = retired_by_limit(target.parent, cfg.total_limit)
        if target.exists() and target.name not in {p.name for p in doomed}:
            raise ValueError(
                f"checkpoint directory {target} already exists (iteration {cfg.iteration}); set "
                "ctx.project_configuration.iteration to the number to continue from"
            )
        in_scope: Callable[[str], bool] = lambda name: CHECKPOINT_DIR.fullmatch(name) is not None  # noqa: E731
    else:
        if output_dir is None:
            raise ValueError(
                "save_state needs an output_dir, or ProjectConfiguration(project_dir=..., "
                "automatic_checkpoint_naming=True) to name checkpoints itself"
            )
        target = Path(os.path.expanduser(os.fspath(output_dir)))
        if target.is_symlink():
            target = Path(os.path.realpath(target))
        if target.exists() and not target.is_dir():
            raise ValueError(f"save_state: {target} exists and is not a directory")
        in_scope = lambda name: name == target.name  # noqa: E731
    returned = str(target)
    target = Path(os.path.abspath(target))
    parent = target.parent
    writer = is_writer(ctx)

    if writer:
        parent.mkdir(parents=True, exist_ok=True)
        clean_leftovers(parent, in_scope)
    ctx.wait_for_everyone()  # nobody creates the new temp dir while a writer is still cleaning up
    token = shared_token(ctx)
    tmp = parent / f".{target.name}.tmp-{token}"
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        # what the strategy stores itself (DeepSpeed engine files, FSDP shards), on every process
        part = strategy.save_checkpoint(tmp, prepared, **save_model_func_kwargs)
        owns = set(part.owns) if part is not None else set()
        weights = [] if "models" in owns else [ctx.get_state_dict(model) for model in prepared.models]
        # hooks get the directory being written, so whatever they save is part of the atomic checkpoint;
        # a hook that saves a model itself pops its entry from `weights` (Accelerate's protocol)
        for hook in pre_hooks:
            hook(list(prepared.models), weights, str(tmp))
        manifest = write_state_files(ctx, prepared, tmp, weights, safe_serialization, writer, owns)
        if part is not None:
            manifest["strategy"] = part.to_manifest()
        snapshot = rng_snapshot(ctx, prepared.dataloaders)
        json_save(rng_json(ctx, snapshot), tmp / f"{RNG_STATE_NAME}_{ctx.process_index}.json")
        serialization.torch_save(rng_for_accelerate(ctx, snapshot), tmp / f"{RNG_STATE_NAME}_{ctx.process_index}.pkl")
        ctx.wait_for_everyone()  # every rank's files are in before the manifest marks it complete
        if writer:
            if checksums_enabled():
                manifest["checksums"] = compute_checksums(tmp)
            json_save(manifest, tmp / MANIFEST_NAME)
            fsync_dir(tmp)
            # a folder total_limit retires anyway is replaced outright, as Accelerate deletes it first
            commit(tmp, target, token, carry=target.name not in {p.name for p in doomed})
    except BaseException:
        if writer:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    ctx.wait_for_everyone()
    if automatic and cfg.total_limit is not None and ctx.is_main_process:
        retire(doomed, target, cfg.total_limit, token)
    ctx.wait_for_everyone()
    logger.info("state saved in %s", target)
    return SavedState(returned, cfg.iteration + 1)


def write_state_files(ctx: CheckpointContext, prepared: PreparedObjects, out: Path, weights: list[dict[str, torch.Tensor]],
                      safe_serialization: bool, writer: bool, owned: set[str] = frozenset()) -> dict[str, Any]:
    """Write the shared files (on the writer only) and return the manifest describing them."""
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "accel_version": accel_version(),
        "torch_version": torch.__version__,
        "num_processes": ctx.num_processes,
        "iteration": ctx.project_configuration.iteration,
        "step": int(ctx.step),
        "safe_serialization": bool(safe_serialization),
        "models": [],
        "optimizers": [],
        "schedulers": [],
        "dataloaders": [],
        "custom_objects": [],
        "scaler": None,
        "random_states": [f"{RNG_STATE_NAME}_{r}.json" for r in range(ctx.num_processes)],
        # the same states in Accelerate's format, for accelerate.Accelerator.load_state (accel reads the JSON)
        "accelerate_random_states": [f"{RNG_STATE_NAME}_{r}.pkl" for r in range(ctx.num_processes)],
    }
    for i, state_dict in enumerate(weights):
        if safe_serialization:
            name = f"{SAFE_MODEL_NAME}{index_suffix(i)}.safetensors"
            if writer:
                serialization.safetensors_save(tensors_for_safetensors(state_dict, f"model {i}'s state_dict"), out / name)
        else:
            name = f"{MODEL_NAME}{index_suffix(i)}.bin"
            if writer:
                check_plain(state_dict, f"model {i}'s state_dict")
                serialization.torch_save({k: v.detach().cpu() for k, v in state_dict.items()}, out / name)
        manifest["models"].append(name)

    def plain(kind: str, name: str, obj: Any, label: str) -> None:
        if writer:
            state = obj.state_dict()
            check_plain(state, label)
            serialization.torch_save(state, out / name)
        manifest[kind].append(name)

    for i, optimizer in enumerate(() if "optimizers" in owned else prepared.optimizers):
        plain("optimizers", f"{OPTIMIZER_NAME}{index_suffix(i)}.bin", optimizer, f"optimizer {i}'s state_dict")
    for i, scheduler in enumerate(prepared.schedulers):
        plain("schedulers", f"{SCHEDULER_NAME}{index_suffix(i)}.bin", scheduler, f"scheduler {i}'s state_dict")
    for i, loader in enumerate(prepared.dataloaders):
        name = f"{SAMPLER_NAME}{index_suffix(i)}.bin"
        if writer:
            serialization.torch_save(dataloader_state(loader), out / name)
        manifest["dataloaders"].append(name)
    if prepared.scaler is not None:
        plain_name = SCALER_NAME
        if writer:
            state = prepared.scaler.state_dict()
            check_plain(state, "the grad scaler's state_dict")
            serialization.torch_save(state, out / plain_name)
        manifest["scaler"] = plain_name
    for i, obj in enumerate(prepared.custom_objects):
        plain("custom_objects", f"{CUSTOM_NAME}_{i}.pkl", obj,
              f"registered object {i} ({type(obj).__name__})'s state_dict")
    return manifest


def resolve_input_dir(ctx: CheckpointContext, input_dir: str | os.PathLike | None) -> Path:
    """The checkpoint folder to load: ``input_dir`` (or the copy an interrupted save moved aside), else the newest ``checkpoint_N``."""
    cfg = ctx.project_configuration
    if input_dir is not None:
        path = Path(os.path.expanduser(os.fspath(input_dir)))
        if path.is_dir():
            return path
        # a save replacing this directory may have died between moving it aside and renaming the new one in
        aside = sorted(p for p in path.parent.glob(f".{path.name}.old-*") if p.is_dir() and (p / MANIFEST_NAME).is_file()) \
            if path.parent.is_dir() else []
        if aside:
            warnings.warn(f"{path} is missing; loading {aside[-1]}, the copy an interrupted save moved aside", stacklevel=4)
            return aside[-1]
        raise CheckpointError(f"load_state: checkpoint directory {path} does not exist")
    if not cfg.automatic_checkpoint_naming:
        raise ValueError("load_state needs an input_dir unless ProjectConfiguration(automatic_checkpoint_naming=True)")
    if cfg.project_dir is None:
        raise ValueError("automatic_checkpoint_naming needs a project_dir to find checkpoints in")
    root = Path(os.path.expanduser(cfg.project_dir)) / CHECKPOINTS_FOLDER
    found = list_checkpoints(root)
    complete = [(n, p) for n, p in found if (p / MANIFEST_NAME).is_file()]
    if not found:
        raise CheckpointError(f"load_state: no checkpoint_<N> directory in {root}")
    return (complete or found)[-1][1]


def pick_input_dir(ctx: CheckpointContext, input_dir: str | os.PathLike | None) -> Path:
    """The main process decides (so every rank loads the same checkpoint); errors are raised everywhere."""
    if not ctx.use_distributed:
        return resolve_input_dir(ctx, input_dir)
    from ..utils.operations import broadcast_object_list

    choice: list[Any] = [None]
    if ctx.is_main_process:
        try:
            choice[0] = ("ok", str(resolve_input_dir(ctx, input_dir)))
        except Exception as exc:  # noqa: BLE001
            choice[0] = ("error", f"{type(exc).__name__}: {exc}")
    broadcast_object_list(choice, from_process=0)
    status, value = choice[0]
    if status == "error":
        raise CheckpointError(f"load_state (decided on the main process): {value}")
    return Path(value)


def load_state(ctx: CheckpointContext, prepared: PreparedObjects, input_dir: str | os.PathLike | None = None,
               load_kwargs: dict | None = None, pre_hooks: Sequence[Callable[..., None]] = (),
               **load_model_func_kwargs: Any) -> LoadedState:
    """Restore what ``save_state`` saved into ``prepared``; returns the step and iteration the Accelerator applies.

    docs/checkpoints.md says what is and is not restored.
    """
    verify = load_model_func_kwargs.pop("verify_checksums", None)
    verify = checksums_enabled() if verify is None else bool(verify)
    folder = pick_input_dir(ctx, input_dir)
    logger.info("loading state from %s", folder)
    manifest_path = entry_path(folder, MANIFEST_NAME, "the manifest")  # a link to a file outside is refused
    models = list(prepared.models)
    for hook in pre_hooks:
        hook(models, str(folder))  # a hook that loads a model itself removes it from `models`

    if manifest_path.exists():
        manifest = load_json(manifest_path, "the checkpoint manifest written by save_state")
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise CheckpointError(f"{manifest_path} is not an accel checkpoint manifest")
        if manifest.get("version", 0) > FORMAT_VERSION:
            raise CheckpointError(
                f"{manifest_path} has checkpoint format version {manifest['version']}; this accel reads up to "
                f"{FORMAT_VERSION} (upgrade accel)"
            )
    else:
        # lexists: a link is judged by check_entries, never by whether what it points to exists
        if os.path.lexists(folder / f"{RNG_STATE_NAME}_{ctx.process_index}.json"):
            raise CheckpointError(
                f"{manifest_path} is missing: {folder} is an incomplete accel checkpoint (the manifest is written last)"
            )
        warnings.warn(f"{folder} has no {MANIFEST_NAME}: reading it as a checkpoint written by Accelerate", stacklevel=3)
        manifest = accelerate_manifest(folder, models, len(prepared.optimizers), len(prepared.schedulers))
    check_entries(folder, manifest)  # before any file the manifest names is opened
    check_integrity(ctx, folder, manifest, verify)

    # --- the strategy's own part: the same strategy must load it
    saved_strategy = manifest.get("strategy")
    strategy = ctx.strategy
    probe = type(strategy).save_checkpoint is not Strategy.save_checkpoint
    if saved_strategy is not None and saved_strategy.get("name") != strategy.name:
        raise CheckpointError(
            f"checkpoint {folder} was saved by the {saved_strategy.get('name')!r} strategy and holds its own files; "
            f"this run uses {strategy.name!r}: load it with the same strategy"
        )
    if saved_strategy is None and probe and manifest_path.exists():
        raise CheckpointError(
            f"checkpoint {folder} has no {strategy.name!r} files: it was saved without {strategy.name}; load it with "
            "the strategy that saved it"
        )
    owned = set(saved_strategy.get("owns", [])) if saved_strategy else set()
    optimizers = [] if "optimizers" in owned else list(prepared.optimizers)
    if "models" in owned:
        models = []

    # --- check that the checkpoint fits what was prepared, before anything is changed
    for key, found, word in (
        ("models", models, "model"),
        ("optimizers", optimizers, "optimizer"),
        ("schedulers", prepared.schedulers, "scheduler"),
        ("dataloaders", prepared.dataloaders, "data loader"),
        ("custom_objects", prepared.custom_objects, "registered object"),
    ):
        saved = manifest.get(key)
        if saved is None:
            continue
        if len(saved) != len(found):
            note = " (after load_state pre-hooks)" if key == "models" and pre_hooks else ""
            raise CheckpointError(
                f"checkpoint {folder} holds {plural(len(saved), word)} but {plural(len(found), word)} "
                f"{'was' if len(found) == 1 else 'were'} prepared{note}; load it into the same set of "
                "objects, in the same order, as when it was saved"
            )
    if prepared.scaler is not None and manifest.get("scaler") is None:
        raise CheckpointError(
            f"{folder / SCALER_NAME} is missing: this run uses an fp16 grad scaler but the checkpoint was saved without one"
        )
    saved_processes = manifest.get("num_processes")

    map_location = load_model_func_kwargs.pop("map_location", None)
    if map_location not in (None, "cpu", "on_device"):
        raise TypeError(
            "Unsupported optimizer map location passed, please choose one of `None`, `'cpu'`, or `'on_device'` "
            f"(got {map_location!r})"
        )
    strict = load_model_func_kwargs.pop("strict", True)

    # --- read everything (any bad file fails here, with nothing changed yet)
    model_states = []
    for i, name in enumerate(manifest["models"]):
        what = f"the weights of model {i}"
        if name.endswith(".safetensors"):
            model_states.append(load_safetensors(folder / name, f"{what} (safetensors)"))
        else:
            model_states.append(torch_load(folder / name, f"{what} (a torch state_dict)", load_kwargs))
    optimizer_states = [torch_load(folder / n, f"the state_dict of optimizer {i}", load_kwargs)
                        for i, n in enumerate(manifest["optimizers"])]
    scheduler_states = [torch_load(folder / n, f"the state_dict of scheduler {i}", load_kwargs)
                        for i, n in enumerate(manifest["schedulers"])]
    loader_states = [torch_load(folder / n, f"the position of data loader {i}", load_kwargs)
                     for i, n in enumerate(manifest["dataloaders"] or [])]
    custom_states = [torch_load(folder / n, f"the state_dict of registered object {i}", load_kwargs)
                     for i, n in enumerate(manifest["custom_objects"])]
    scaler_state = None
    if prepared.scaler is not None:
        scaler_state = torch_load(folder / manifest["scaler"], "the grad scaler's state_dict", load_kwargs)
    elif manifest.get("scaler") is not None:
        logger.warning("%s: the checkpoint has a grad scaler state but this run has no scaler; ignored", folder)
    # a strategy whose shards reshard (FSDP's DCP) may resume at another world size; the per-process RNG
    # files belong to the old layout then, and every rank decides this alike from the manifest
    resharding = (saved_processes is not None and saved_processes != ctx.num_processes
                  and bool(saved_strategy and saved_strategy.get("reshardable")))
    rng = None if resharding else read_rng(ctx, folder, saved_processes)
    if resharding and ctx.is_main_process:
        warnings.warn(
            f"{folder} was saved by {plural(saved_processes, 'process')} and is resumed by "
            f"{plural(ctx.num_processes, 'process')}: the {saved_strategy.get('name')} shards are resharded, "
            "but per-process RNG states are not restored", stacklevel=3,
        )

    # --- apply
    if saved_strategy is not None:
        strategy.load_checkpoint(folder, saved_strategy, prepared, **load_model_func_kwargs)
    for i, (model, state) in enumerate(zip(models, model_states)):
        target = ctx.unwrap_model(model)
        try:
            target.load_state_dict(state, strict=strict, **load_model_func_kwargs)
        except RuntimeError as exc:
            raise CheckpointError(f"{folder / manifest['models'][i]} does not fit model {i}: {exc}") from None
    if scaler_state is not None:
        prepared.scaler.load_state_dict(scaler_state)
    for i, (optimizer, state) in enumerate(zip(optimizers, optimizer_states)):
        try:
            optimizer.load_state_dict(state)
        except (ValueError, KeyError, RuntimeError) as exc:
            raise CheckpointError(f"{folder / manifest['optimizers'][i]} does not fit optimizer {i}: {exc}") from None
    for scheduler, state in zip(prepared.schedulers, scheduler_states):
        scheduler.load_state_dict(state)
    for loader, state in zip(prepared.dataloaders, loader_states):
        restore_dataloader(loader, state)
    for obj, state in zip(prepared.custom_objects, custom_states):
        obj.load_state_dict(state)
    step = restore_rng(ctx, rng, folder, prepared.dataloaders) if rng is not None else None

    iteration = None
    cfg = ctx.project_configuration
    if cfg.automatic_checkpoint_naming and cfg.project_dir is not None:
        existing = list_checkpoints(Path(os.path.expanduser(cfg.project_dir)) / CHECKPOINTS_FOLDER)
        if existing:
            iteration = existing[-1][0] + 1
    logger.info("state loaded from %s", folder)
    return LoadedState(str(folder), step, iteration)
