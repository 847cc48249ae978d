"""`accel to-fsdp2`: rewrite a config file's FSDP1 settings as FSDP2 settings and say what changed.

FSDP2 (``fully_shard``) drops some FSDP1 options and renames one: ``fsdp_sharding_strategy`` becomes
``fsdp_reshard_after_forward`` (FULL_SHARD/HYBRID_SHARD -> true, SHARD_GRAD_OP/HYBRID_SHARD_ZERO2/
NO_SHARD -> false); ``fsdp_backward_prefetch``, ``fsdp_sync_module_states`` and ``fsdp_use_orig_params``
no longer exist; ``fsdp_forward_prefetch`` has no FSDP2 equivalent yet. Other keys are kept, and
``fsdp_version`` becomes 2. Each change is reported (printed by the command, logged by the function).
"""

from __future__ import annotations

import argparse
import enum
import logging
from pathlib import Path
from typing import Any

from accel.facts.yaml_safe import preview

__all__ = [
    "ARGUMENT_KEY_MAPPING",
    "ARGUMENT_VALUE_MAPPING",
    "ConversionStatus",
    "add_arguments",
    "convert_config_to_fsdp2",
    "load_config",
    "run",
    "to_fsdp2_command",
    "to_fsdp2_command_parser",
]

logger = logging.getLogger(__name__)


class ConversionStatus(enum.Enum):
    """What happens to an FSDP1 key that has no FSDP2 counterpart."""

    NOT_YET_IMPLEMENTED = 0
    REMOVED = -1


#: FSDP1 key -> FSDP2 key, or why it is dropped
ARGUMENT_KEY_MAPPING: dict[str, Any] = {
    "fsdp_version": "fsdp_version",
    "fsdp_reshard_after_forward": "fsdp_reshard_after_forward",
    "fsdp_auto_wrap_policy": "fsdp_auto_wrap_policy",
    "fsdp_backward_prefetch": ConversionStatus.REMOVED,
    "fsdp_forward_prefetch": ConversionStatus.NOT_YET_IMPLEMENTED,
    "fsdp_cpu_ram_efficient_loading": "fsdp_cpu_ram_efficient_loading",
    "fsdp_offload_params": "fsdp_offload_params",
    "fsdp_sharding_strategy": "fsdp_reshard_after_forward",
    "fsdp_state_dict_type": "fsdp_state_dict_type",
    "fsdp_sync_module_states": ConversionStatus.REMOVED,
    "fsdp_transformer_layer_cls_to_wrap": "fsdp_transformer_layer_cls_to_wrap",
    "fsdp_min_num_params": "fsdp_min_num_params",
    "fsdp_use_orig_params": ConversionStatus.REMOVED,
    "fsdp_activation_checkpointing": "fsdp_activation_checkpointing",
}
_RESHARD = {"FULL_SHARD": True, "SHARD_GRAD_OP": False, "HYBRID_SHARD": True, "HYBRID_SHARD_ZERO2": False, "NO_SHARD": False}
#: FSDP1 values -> FSDP2 values, per FSDP1 key (sharding strategies become reshard-after-forward)
ARGUMENT_VALUE_MAPPING: dict[str, dict[Any, Any]] = {"fsdp_sharding_strategy": _RESHARD, "fsdp_reshard_after_forward": _RESHARD}


def convert_config_to_fsdp2(config: dict[str, Any], changes: list[str] | None = None) -> dict[str, Any]:
    """``config`` (a config file's mapping) with its ``fsdp_config`` turned into FSDP2 settings.

    A config without FSDP settings, or already at ``fsdp_version: 2``, comes back unchanged (with a
    logged warning for the latter). ``changes``, when given, receives one line per change made.
    """
    changes = [] if changes is None else changes
    fsdp = config.get("fsdp_config") or {}
    if not fsdp:
        logger.info("No FSDP config found in the config file, skipping conversion...")
        return config
    if str(fsdp.get("fsdp_version", 1)) == "2":
        logger.warning("Config already specifies FSDP2, skipping conversion...")
        logger.warning("If its keys are still FSDP1 names, set `fsdp_version` to 1 and run the command again.")
        return config
    converted: dict[str, Any] = {}
    for key, value in fsdp.items():
        target = ARGUMENT_KEY_MAPPING.get(key)
        if target is None:  # not an FSDP1 key we know: kept as it is
            converted[key] = value
            continue
        if isinstance(target, ConversionStatus):
            why = "removed in FSDP2" if target is ConversionStatus.REMOVED else "not implemented for FSDP2 yet"
            logger.warning(f"Argument {key} is {why}, skipping this key...")
            changes.append(f"dropped {key}: {preview(value, 200)} ({why})")
            continue
        new_value = ARGUMENT_VALUE_MAPPING.get(key, {}).get(value, value)
        converted[target] = new_value
        if target != key or new_value != value:
            changes.append(f"{key}: {preview(value, 200)} -> {target}: {preview(new_value, 200)}")
    if fsdp.get("fsdp_version") != 2:
        changes.append(f"fsdp_version: {fsdp.get('fsdp_version', 1)!r} -> 2")
    converted["fsdp_version"] = 2
    config["fsdp_config"] = converted
    return config


def load_config(config_file: str) -> dict[str, Any]:
    """The raw mapping in ``config_file`` (ValueError when it is empty, or refused by accel.facts.yaml_safe)."""
    from accel.facts import yaml_safe

    data = yaml_safe.read(config_file)
    if not data:
        raise ValueError(f"Config file {config_file} is empty")
    return data


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`accel to-fsdp2`'s options (Accelerate's)."""
    parser.description = "Convert a config file's FSDP1 settings to FSDP2 and list what changed."
    parser.add_argument("--config_file", type=str, required=True, help="the config file to convert")
    parser.add_argument("--overwrite", action="store_true", default=False, help="write the result over --config_file")
    parser.add_argument("--output_file", type=str, default=None, help="where to write the converted config (needed without --overwrite)")


def to_fsdp2_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Accelerate's entry point: the `to-fsdp2` parser (added to ``subparsers`` when given)."""
    description = "Convert a config file from FSDP1 to FSDP2"
    parser = subparsers.add_parser("to-fsdp2", description=description) if subparsers is not None \
        else argparse.ArgumentParser("accel to-fsdp2", description=description)
    add_arguments(parser)
    parser.set_defaults(func=to_fsdp2_command)
    return parser


def to_fsdp2_command(args: argparse.Namespace) -> list[str]:
    """Convert ``args.config_file`` into ``args.output_file`` (or over itself with ``--overwrite``);
    returns the changes. FileNotFoundError/ValueError/FileExistsError name the problem."""
    from accel.io.files import atomic_write

    if not Path(args.config_file).exists():
        raise FileNotFoundError(f"Config file {args.config_file} not found")
    if not args.overwrite and args.output_file is None:
        raise ValueError("If --overwrite is not set, --output_file must be provided")
    if not args.overwrite and Path(args.output_file).exists():
        raise FileExistsError(f"Output file {args.output_file} already exists and --overwrite is not set")
    import yaml

    output = args.output_file or args.config_file
    changes: list[str] = []
    converted = convert_config_to_fsdp2(load_config(args.config_file), changes)
    text = yaml.safe_dump(converted, sort_keys=False)
    atomic_write(Path(output), lambda tmp: tmp.write_text(text, encoding="utf-8"), keep_mode=0o644)
    return changes


def run(args: argparse.Namespace) -> int:
    """`accel to-fsdp2` through the `accel` entry point: convert and print each change."""
    from accel.commands import UsageError

    try:
        changes = to_fsdp2_command(args)
    except (FileNotFoundError, FileExistsError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    for change in changes:
        print(f"  {change}")
    output = args.output_file or args.config_file
    print(f"accel to-fsdp2: wrote {output}" + (f" ({len(changes)} change(s))" if changes else " (nothing to change)"))
    return 0
