"""Flags over the config file over the defaults: the arguments a launch is planned from, merged the way
Accelerate merges them, and the options that cannot apply under accel refused with the reason."""

from __future__ import annotations

import argparse
import os
from typing import Any

from accel.commands import UsageError

from .options import _MEGATRON, _REFUSED_FLAG, _TPU, REFUSED, _given, _triple


def _load_defaults(args: argparse.Namespace) -> Any:
    """The config file as Accelerate's dataclass (None when there is none); errors name the file."""
    from accel.commands.config.config_args import load_config_from_file
    from accel.launch.config_file import CONFIG_ENV, ConfigError, default_config_path

    if args.config_file:
        path = os.path.expanduser(args.config_file)
        if not os.path.isfile(path):
            raise UsageError(f"config file not found: {args.config_file}")
    else:
        path = str(default_config_path())
        if not os.path.isfile(path):
            if os.environ.get(CONFIG_ENV):
                raise UsageError(f"{CONFIG_ENV} names a config file that does not exist: {path}")
            return None
    try:
        return load_config_from_file(path)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def sagemaker_config(args: argparse.Namespace) -> Any:
    """The config file's SageMaker settings when its ``compute_environment`` is AMAZON_SAGEMAKER, else None."""
    defaults = _load_defaults(args)
    if defaults is None:
        return None
    environment = getattr(defaults, "compute_environment", None)
    return defaults if str(getattr(environment, "value", environment)) == "AMAZON_SAGEMAKER" else None


#: prefixes Accelerate puts in front of a section's keys when it copies them onto the arguments
_SECTION_PREFIX = {"fsdp_config": "fsdp_", "fp8_config": "fp8_", "dynamo_config": "dynamo_"}
_PLAIN_TYPES = {"MULTI_GPU", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA", "MULTI_XPU", "MULTI_HPU", "MULTI_NEURON"}


def _validate_launch_command(args: argparse.Namespace) -> tuple[argparse.Namespace, Any, bool]:
    """Merge the config file into ``args`` the way Accelerate does and apply the defaults.

    A flag given on the command line wins; else the config file's value (its sections copied onto the
    arguments: ``fsdp_config.x`` -> ``fsdp_x``, ``deepspeed_config.x`` -> ``x``, ...); else the default.
    Returns ``(args, config or None, mixed precision came from the config)``. UsageError (a ValueError)
    on contradictory options.
    """
    chosen = [f"--{name}" for name in ("multi_gpu", "cpu", "tpu", "use_deepspeed", "use_fsdp") if getattr(args, name, False)]
    if len(chosen) > 1:
        raise UsageError(f"You can only use one of `--cpu`, `--multi_gpu`, `--tpu`, `--use_deepspeed`, `--use_fsdp` at a time (got {', '.join(chosen)})")
    if args.multi_gpu and args.num_processes is not None and args.num_processes < 2:
        raise UsageError("You need to use at least 2 processes to use `--multi_gpu`.")
    if args.use_parallelism_config and (not args.use_fsdp or str(args.fsdp_version) == "1"):
        raise UsageError("You cannot use `--use_parallelism_config` without `--use_fsdp` and `--fsdp_version=2`.")
    given = _given(args)
    defaults = _load_defaults(args)
    mp_from_config = False
    if defaults is not None:
        kind = str(getattr(defaults.distributed_type, "value", defaults.distributed_type))
        if not any(getattr(args, name, False) for name in ("multi_gpu", "tpu", "tpu_use_cluster", "use_deepspeed", "use_fsdp", "use_megatron_lm")):
            args.use_deepspeed = kind == "DEEPSPEED"
            args.multi_gpu = kind in _PLAIN_TYPES
            args.tpu = kind == "XLA"
            args.use_fsdp = kind == "FSDP"
            args.use_megatron_lm = kind == "MEGATRON_LM"
            args.tpu_use_cluster = bool(getattr(defaults, "tpu_use_cluster", False)) if args.tpu else False
            args.use_parallelism_config = bool(getattr(defaults, "parallelism_config", None))
        args.distributed_type_from_config = kind
        if args.gpu_ids is None:
            args.gpu_ids = getattr(defaults, "gpu_ids", None) or "all"
        if str(getattr(defaults.compute_environment, "value", defaults.compute_environment)) == "LOCAL_MACHINE":
            for name, value in vars(defaults).items():
                if isinstance(value, dict):  # a section: its keys become arguments
                    for key, item in value.items():
                        prefix = _SECTION_PREFIX.get(name)
                        if prefix and not key.startswith(prefix):
                            key = prefix + key
                        if key == "fp8_override_linear_precision" and isinstance(item, str):
                            item = _triple(item)
                        if key not in given:
                            setattr(args, key, item)
                elif name not in ("compute_environment", "mixed_precision", "distributed_type") and name not in given \
                        and value is not None and not (name == "debug" and args.debug):
                    setattr(args, name, value)
        if not args.debug:
            args.debug = bool(defaults.debug)
        if not args.mixed_precision:
            args.mixed_precision = defaults.mixed_precision or "no"
            mp_from_config = defaults.mixed_precision not in (None, "no")
        if args.dynamo_backend is None:
            args.dynamo_backend = "no"
        if getattr(args, "num_processes", None) == -1:
            raise UsageError(f"the config file ({args.config_file or 'default'}) leaves the number of processes open: pass --num_processes")
    else:
        args.distributed_type_from_config = None
        if args.gpu_ids is None:
            args.gpu_ids = "all"
        args.mixed_precision = args.mixed_precision or "no"
        if args.dynamo_backend is None:
            args.dynamo_backend = "no"
    if args.num_machines is None:
        args.num_machines = 1
    for name in ("debug", "quiet", "module", "no_python"):  # Accelerate leaves these None until here
        if getattr(args, name, None) is None:
            setattr(args, name, False)
    if getattr(args, "use_cpu", None) is None:
        args.use_cpu = bool(args.cpu)
    return args, defaults, mp_from_config


def _refusals(args: argparse.Namespace, defaults: Any) -> None:
    """Stop on an option that cannot apply under accel, naming it and the reason."""
    given = _given(args)
    if getattr(args, "tpu", False) and "tpu" not in given:
        raise UsageError(f"distributed_type XLA (config file) cannot run here: {_TPU}")
    if getattr(args, "use_megatron_lm", False) and "use_megatron_lm" not in given:
        raise UsageError(f"distributed_type MEGATRON_LM (config file) cannot run here: {_MEGATRON}")
    for dest in sorted(given):
        if dest in REFUSED:
            flag = _REFUSED_FLAG.get(dest, "--" + dest)
            raise UsageError(f"{flag} cannot be used with accel launch: {REFUSED[dest]}")
