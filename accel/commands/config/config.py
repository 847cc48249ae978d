"""`accel config`: write the config file `accel launch` reads.

Three ways to make one, all writing atomically to ``--config_file`` or the default path
(``$ACCEL_CONFIG_FILE``, else ``~/.cache/accel/default_config.yaml``):

* ``accel config`` on a terminal asks a few questions, each with its default shown in brackets;
  a bad answer says why and asks again.
  Run again, it offers the file's current values as the defaults.
* ``accel config --num_processes 2 --mixed_precision bf16 ...`` changes only the values named, asking
  nothing (for scripts and CI): an existing file keeps every other value; without one, the default
  for this machine is the starting point. Without a terminal and without flags, the command stops
  with a message instead of waiting for answers that cannot come.
* ``accel config default`` writes the default for the detected backend: one process per device
  (one process on cpu), no mixed precision. It does not overwrite an existing file unless ``--force``.

``accel config show`` checks and prints the file in use; ``accel config update`` rewrites an old
(Accelerate or accel) file in today's format, keeping its values.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Callable

from accel.commands import UsageError
from accel.commands.config.config_utils import _ask, _choice, _convert_yes_no_to_bool
from accel.launch.config_file import (
    FIELDS,
    MIXED_PRECISIONS,
    RDZV_BACKENDS,
    ConfigError,
    LaunchConfig,
    default_config_path,
    load_config,
    save_config,
)
from accel.launch.machine_config import MachineConfigError, check_multiprocess, collective_backend, config_backend
from accel.launch.machine_config import default_config as machine_default_config
from accel.launch.machine_config import devices_per_machine, distributed_type_for
from accel.facts.network import DEFAULT_PORT

__all__ = ["add_arguments", "add_flag", "ask_questions", "default_config", "run"]

#: value flags shared by `accel config` and `accel config default`: flag -> (config key, help)
VALUE_FLAGS: dict[str, tuple[str, str]] = {
    "--num_processes": ("num_processes", "total number of processes over all machines"),
    "--num_machines": ("num_machines", "number of machines (nodes)"),
    "--machine_rank": ("machine_rank", "rank of this machine, from 0"),
    "--main_process_ip": ("main_process_ip", "IP address or host name of the machine of rank 0 (multi-node)"),
    "--main_process_port": ("main_process_port", "port on the machine of rank 0 (multi-node)"),
    "--mixed_precision": ("mixed_precision", f"one of {', '.join(MIXED_PRECISIONS)}"),
    "--backend": ("backend", "hardware backend name (cpu, cuda, xpu, mps, hpu or a plug-in); default: detected"),
    "--gpu_ids": ("gpu_ids", "devices to use: 'all' or indices such as 0,1 (sets the backend's visible-devices variable)"),
    "--rdzv_backend": ("rdzv_backend", f"torch elastic rendezvous backend: {', '.join(RDZV_BACKENDS)}"),
    "--main_training_function": ("main_training_function", "name of the script's main function (kept for Accelerate compatibility)"),
}
#: on/off flags: flag -> (config key, help)
SWITCHES: dict[str, tuple[str, str]] = {
    "--cpu": ("use_cpu", "train on the CPU even if a device backend is available"),
    "--same_network": ("same_network", "all machines are on one local network (static rendezvous on the main machine)"),
    "--debug": ("debug", "set ACCEL_DEBUG_MODE in the ranks and print torch elastic's full failure report"),
}


_METAVARS = {
    "mixed_precision": "{" + ",".join(MIXED_PRECISIONS) + "}",
    "rdzv_backend": "{" + ",".join(RDZV_BACKENDS) + "}",
    "num_processes": "N",
    "num_machines": "N",
    "machine_rank": "RANK",
    "main_process_ip": "HOST",
    "main_process_port": "PORT",
    "backend": "NAME",
    "gpu_ids": "IDS",
    "main_training_function": "NAME",
}


def _value_type(key: str) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return FIELDS[key](text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = key  # argparse names the type in its messages
    return convert


def add_flag(container: Any, flag: str, *aliases: str, **kwargs: Any) -> None:
    """Add ``--some_flag`` (shown in help) and its ``--some-flag`` spelling (hidden), like Accelerate."""
    container.add_argument(flag, *aliases, **kwargs)
    dashed = "--" + flag[2:].replace("_", "-")
    if dashed != flag:
        container.add_argument(dashed, **{**kwargs, "help": argparse.SUPPRESS})


def _add_config_flags(parser: argparse.ArgumentParser, suppress: bool) -> None:
    # in a sub-action every default is SUPPRESS, so it cannot overwrite what the parent parsed
    default: Any = argparse.SUPPRESS if suppress else None
    add_flag(
        parser, "--config_file", dest="config_file", metavar="PATH", default=default,
        help="file to write (default: $ACCEL_CONFIG_FILE, else ~/.cache/accel/default_config.yaml)",
    )
    group = parser.add_argument_group("values (given any, nothing is asked)")
    for flag, (key, text) in VALUE_FLAGS.items():
        add_flag(group, flag, dest=key, metavar=_METAVARS.get(key, key.upper()), type=_value_type(key), default=default, help=text)
    for flag, (key, text) in SWITCHES.items():
        add_flag(group, flag, dest=key, action="store_true", default=default, help=text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`accel config`'s options and its actions (default, show, update)."""
    _add_config_flags(parser, suppress=False)
    parser.add_argument("--force", action="store_true", default=None,
                        help="with `default`: overwrite an existing file (`accel config default --force`)")
    actions = parser.add_subparsers(dest="config_action", metavar="<action>", title="actions (default: ask questions)")
    default = actions.add_parser(
        "default", help="write the default for this machine (one process per device, one on cpu); --force overwrites",
        description="Write the default config for the detected backend, changed by any value flags.",
    )
    _add_config_flags(default, suppress=True)
    default.add_argument("--force", action="store_true", default=argparse.SUPPRESS, help="overwrite an existing file")
    show = actions.add_parser("show", help="check and print the config file in use", description="Check and print the config file in use.")
    add_flag(show, "--config_file", dest="config_file", metavar="PATH", default=argparse.SUPPRESS, help="file to show")
    from accel.commands.config.update import add_update_arguments

    update = actions.add_parser(
        "update", help="rewrite an existing config file in today's format, keeping its values",
        description="Load an existing config file (any Accelerate or accel version), upgrade old keys and write it back.",
    )
    add_update_arguments(update)
    sagemaker = actions.add_parser(
        "sagemaker", help="ask the questions for an Amazon SageMaker job and write its config",
        description="Ask for an Amazon SageMaker job's settings (AWS profile, region, IAM role, instance, ...) and write "
                    "a config with compute_environment AMAZON_SAGEMAKER, which `accel launch` runs as a SageMaker job.",
    )
    add_flag(sagemaker, "--config_file", dest="config_file", metavar="PATH", default=argparse.SUPPRESS, help="file to write")


def run(args: argparse.Namespace) -> int:
    path = Path(args.config_file).expanduser() if getattr(args, "config_file", None) else default_config_path()
    action = getattr(args, "config_action", None)
    if action == "show":
        return _show(path)
    if action == "update":
        from accel.commands.config.update import run_update

        return run_update(path)
    if action == "sagemaker" or (action is None and not _given_values(args) and _stdin_is_tty() and _is_sagemaker_file(path)):
        return _run_sagemaker(path)
    values = _given_values(args)
    if action == "default":
        if path.exists() and not getattr(args, "force", False):
            raise UsageError(f"{path} already exists; pass --force to overwrite it, or run `accel config` to change it")
        config = default_config(**values)
    elif values:
        current = _current_config(path)
        config = default_config(**values) if current is None else changed_config(current, values)
    else:
        if not _stdin_is_tty():
            raise UsageError(
                "stdin is not a terminal, so the questions cannot be asked: run `accel config default`, "
                "or give the values as flags (e.g. `accel config --num_processes 2 --mixed_precision bf16`)"
            )
        config = ask_questions(_current_config(path))
    try:
        written = save_config(config, path)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc}") from None
    print(f"accel config saved at {written}")
    return 0


def _is_sagemaker_file(path: Path) -> bool:
    current = _current_config(path)
    return current is not None and str(current.compute_environment).upper().endswith("AMAZON_SAGEMAKER")


def _run_sagemaker(path: Path) -> int:
    """The SageMaker questions (the current SageMaker config's values offered), written to ``path``."""
    from accel.commands.config.config_args import SageMakerConfig
    from accel.commands.config.sagemaker import get_sagemaker_input

    if not _stdin_is_tty():
        raise UsageError("stdin is not a terminal, so the SageMaker questions cannot be asked")
    current = None
    if _is_sagemaker_file(path):
        try:
            current = SageMakerConfig.from_launch_config(_current_config(path))
        except ConfigError:
            current = None
    config = get_sagemaker_input(current)
    try:
        config.to_yaml_file(path)
    except (ConfigError, OSError) as exc:
        raise UsageError(f"cannot write {path}: {exc}") from None
    print(f"accel config saved at {path}")
    return 0


def _current_config(path: Path) -> LaunchConfig | None:
    """The config already at ``path`` (None when there is none); a broken one is a usage error."""
    if not path.is_file():
        return None
    try:
        return load_config(path)
    except ConfigError as exc:
        raise UsageError(f"{exc} (fix it, or start afresh with `accel config default --force`)") from None


#: distributed types that follow from the backend and the process count (the others are a choice)
_DERIVED_TYPES = {"NO", "MULTI_CPU", "MULTI_GPU", "MULTI_XPU", "MULTI_HPU", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA",
                  "MULTI_MUSA", "MULTI_NEURON"}


def changed_config(current: LaunchConfig, values: dict[str, Any]) -> LaunchConfig:
    """``current`` with only ``values`` changed; ``distributed_type`` follows a new process count or
    backend when it was one that follows from them (NO, MULTI_*), and a choice such as FSDP is kept."""
    config = current.replace(path=None, lines={}, extra=dict(current.extra))
    if values.get("use_cpu"):
        values = {**values, "backend": values.get("backend") or "cpu"}
    for key, value in values.items():
        setattr(config, key, value)
    if "backend" in values:
        backend = _resolve_backend(values["backend"], bool(values.get("use_cpu")))
        config.backend, config.use_cpu = backend.name, backend.is_host
    if config.distributed_type in _DERIVED_TYPES and ({"num_processes", "backend", "use_cpu"} & set(values)):
        backend = _resolve_backend(config.backend, config.use_cpu)
        _check_multiprocess(backend, config.num_processes)
        config.distributed_type = distributed_type_for(backend, config.num_processes or 1)
    if config.num_machines > 1 and not config.main_process_ip:
        raise UsageError(f"{config.num_machines} machines need --main_process_ip (the address of the machine of rank 0)")
    try:
        return config.validate()
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def _given_values(args: argparse.Namespace) -> dict[str, Any]:
    values = {key: getattr(args, key) for key, _ in VALUE_FLAGS.values() if getattr(args, key, None) is not None}
    values.update({key: True for key, _ in SWITCHES.values() if getattr(args, key, None) is True})
    return values


def _stdin_is_tty() -> bool:
    stdin = sys.stdin
    try:
        return stdin is not None and stdin.isatty()
    except (AttributeError, ValueError):  # replaced or closed stdin
        return False


def _show(path: Path) -> int:
    if not path.is_file():
        print(f"no config file at {path} (create one with `accel config` or `accel config default`)", file=sys.stderr)
        return 1
    try:
        load_config(path)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    print(f"# {path}")
    print(path.read_text(encoding="utf-8"), end="")
    return 0


# ---------------------------------------------------------------------------- defaults
def _resolve_backend(name: str | None, use_cpu: bool) -> Any:
    """The backend object for ``name`` (or the detected one); an unavailable one only warns, since a config
    may be written for another machine."""
    try:
        backend = config_backend(name, use_cpu)
    except MachineConfigError as exc:
        raise UsageError(str(exc)) from None
    if not backend.is_available():
        print(f"accel config: warning: backend {backend.name!r} is not available on this machine "
              f"({backend.availability.reason}); writing the config anyway", file=sys.stderr)
    return backend


def _check_multiprocess(backend: Any, num_processes: int | None) -> None:
    try:
        check_multiprocess(backend, num_processes)
    except MachineConfigError as exc:
        raise UsageError(str(exc)) from None


def default_config(**values: Any) -> LaunchConfig:
    """The default config for this machine's backend (or ``values['backend']``), with ``values`` applied
    (:func:`accel.launch.machine_config.default_config`); a problem is a one-line usage error."""
    _resolve_backend(values.get("backend"), bool(values.get("use_cpu")))  # warns about an unavailable backend
    try:
        return machine_default_config(**values)
    except MachineConfigError as exc:
        raise UsageError(str(exc)) from None


# ---------------------------------------------------------------------------- questions
_yes_no = _convert_yes_no_to_bool  # one parser of yes/no answers for every question


def _yes_no_text(value: bool) -> str:
    """A bool as the answer the questions offer as a default."""
    return "yes" if value else "no"


def _field(key: str) -> Callable[[str], Any]:
    return FIELDS[key]


#: the wizard's strategy answer -> the distributed_type it writes (ddp: the one the backend implies)
_STRATEGIES = {"ddp": None, "deepspeed": "DEEPSPEED", "fsdp": "FSDP"}


def _count(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    def check(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"expected a whole number, got {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            raise ValueError(f"expected {minimum}..{maximum if maximum is not None else ''}, got {value}")
        return value
    return check


def _ask_strategy(config: LaunchConfig, old: LaunchConfig, has_current: bool) -> None:
    """DDP, DeepSpeed or FSDP, and the questions of the one chosen (Accelerate's config keys)."""
    current = {v: k for k, v in _STRATEGIES.items() if v}.get(old.distributed_type, "ddp") if has_current else "ddp"
    strategy = _ask("Which training strategy? (ddp, deepspeed, fsdp)", _choice(tuple(_STRATEGIES)), current)
    config.extra.pop("deepspeed_config", None)
    config.extra.pop("fsdp_config", None)
    if strategy == "ddp":
        if config.distributed_type in _STRATEGIES.values():
            config.distributed_type = distributed_type_for(_resolve_backend(config.backend, config.use_cpu), config.num_processes)
        return
    config.distributed_type = _STRATEGIES[strategy]
    was = dict(old.extra.get(f"{strategy}_config") or {}) if has_current and current == strategy else {}
    yes_no = _yes_no_text
    if strategy == "deepspeed":
        section: dict[str, Any] = {}
        path = _ask("A DeepSpeed config file (JSON) to use? (a path, or 'none' to answer the questions)",
                    str, was.get("deepspeed_config_file", "none"))
        if path.strip().lower() != "none":
            if not os.path.isfile(os.path.expanduser(path)):
                print(f"  note: {path} does not exist yet; accel launch will need it")
            section["deepspeed_config_file"] = path
        else:
            stage = _ask("ZeRO stage? (0, 1, 2, 3)", _count(0, 3), was.get("zero_stage", 2))
            section["zero_stage"] = stage
            section["offload_optimizer_device"] = _ask("Offload optimizer states to? (none, cpu, nvme)",
                                                       _choice(("none", "cpu", "nvme")), was.get("offload_optimizer_device", "none"))
            if stage == 3:
                section["offload_param_device"] = _ask("Offload parameters to? (none, cpu, nvme)", _choice(("none", "cpu", "nvme")),
                                                       was.get("offload_param_device", "none"))
                section["zero3_init_flag"] = _ask("Create the model already partitioned (zero3_init_flag)? (yes/no)", _yes_no,
                                                  yes_no(was.get("zero3_init_flag", False)))
                section["zero3_save_16bit_model"] = _ask("Gather a 16-bit model in save_model (zero3_save_16bit_model)? (yes/no)",
                                                         _yes_no, yes_no(was.get("zero3_save_16bit_model", True)))
            section["gradient_accumulation_steps"] = _ask("Gradient accumulation steps?", _count(1),
                                                          was.get("gradient_accumulation_steps", 1))
        config.extra["deepspeed_config"] = section
        return
    version = _ask("FSDP version? (1, 2)", _count(1, 2), was.get("fsdp_version", 2))
    policy = _ask("Auto-wrap policy? (TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP, NO_WRAP)",
                  _choice(("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")), was.get("fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP"))
    section = {"fsdp_version": version, "fsdp_auto_wrap_policy": policy}
    if policy == "TRANSFORMER_BASED_WRAP":
        names = _ask("Layer classes to wrap (comma-separated; 'auto' for the model's _no_split_modules)", str,
                     was.get("fsdp_transformer_layer_cls_to_wrap", "auto"))
        if names.strip().lower() != "auto":
            section["fsdp_transformer_layer_cls_to_wrap"] = names
    elif policy == "SIZE_BASED_WRAP":
        section["fsdp_min_num_params"] = _ask("Minimum parameters per wrapped unit?", _count(1), was.get("fsdp_min_num_params", 100_000_000))
    section["fsdp_reshard_after_forward"] = _ask("Reshard parameters after forward (FULL_SHARD; no = SHARD_GRAD_OP)? (yes/no)",
                                                 _yes_no, yes_no(was.get("fsdp_reshard_after_forward", True)))
    section["fsdp_state_dict_type"] = _ask("Checkpoint state dict? (SHARDED_STATE_DICT, FULL_STATE_DICT)",
                                           _choice(("SHARDED_STATE_DICT", "FULL_STATE_DICT")), was.get("fsdp_state_dict_type", "SHARDED_STATE_DICT"))
    section["fsdp_offload_params"] = _ask("Offload parameters to the CPU? (yes/no)", _yes_no, yes_no(was.get("fsdp_offload_params", False)))
    section["fsdp_activation_checkpointing"] = _ask("Activation checkpointing? (yes/no)", _yes_no,
                                                    yes_no(was.get("fsdp_activation_checkpointing", False)))
    section["fsdp_cpu_ram_efficient_loading"] = _ask("Load weights on rank 0 only and broadcast (cpu_ram_efficient_loading)? (yes/no)",
                                                     _yes_no, yes_no(was.get("fsdp_cpu_ram_efficient_loading", True)))
    config.extra["fsdp_config"] = section


def ask_questions(current: LaunchConfig | None = None) -> LaunchConfig:
    """Ask for each value with ``input()``, showing defaults and re-asking on a bad answer.

    With ``current`` (the existing file), its values are the defaults offered, and the keys the
    questions do not cover (FSDP/DeepSpeed sections, ...) are kept.
    """
    from accel.backends import get_registry

    registry = get_registry()
    old = current or LaunchConfig()

    def was(key: str, fallback: Any) -> Any:
        value = getattr(old, key) if current is not None else None
        return fallback if value is None else value

    yes_no = _yes_no_text

    detected_name = was("backend", None) or ("cpu" if old.use_cpu else None) or _resolve_backend(None, False).name
    detected = registry.get(detected_name) if detected_name in registry.names() else _resolve_backend(None, False)
    names = registry.names()

    def backend_answer(text: str) -> Any:
        name = text.strip().lower()
        if name not in names:
            raise ValueError(f"unknown backend {text!r}; known backends: {', '.join(names)}")
        backend = registry.get(name)
        if not backend.is_available():
            print(f"  note: {name} is not available on this machine ({backend.availability.reason})")
        return backend

    available = ", ".join(b.name for b in registry.available())
    backend = _ask(f"Which hardware backend should the processes use? (available here: {available})", backend_answer, detected.name)
    config = LaunchConfig(backend=backend.name, use_cpu=backend.is_host, extra=dict(old.extra))
    config.main_training_function = old.main_training_function

    config.num_machines = _ask("How many machines (nodes) will run the training?", _field("num_machines"), was("num_machines", 1))
    if config.num_machines > 1:
        def rank_answer(text: str) -> int:
            rank = _field("machine_rank")(text)
            if rank >= config.num_machines:
                raise ValueError(f"the rank must be below {config.num_machines}")
            return rank

        config.machine_rank = _ask(f"What is the rank of this machine (0 to {config.num_machines - 1})?", rank_answer,
                                     min(was("machine_rank", 0), config.num_machines - 1))
        config.main_process_ip = _ask("What is the IP address of the machine of rank 0?", _field("main_process_ip"), was("main_process_ip", None))
        config.main_process_port = _ask("Which port on the machine of rank 0 should the ranks meet on?", _field("main_process_port"),
                                        was("main_process_port", DEFAULT_PORT))
        config.rdzv_backend = _ask(f"Which rendezvous backend? ({', '.join(RDZV_BACKENDS)})", _field("rdzv_backend"), was("rdzv_backend", "static"))
        config.same_network = _ask("Are all the machines on the same local network? (yes/no)", _yes_no, yes_no(was("same_network", False)))

    multiprocess = collective_backend(backend) is not None

    def processes_answer(text: str) -> int:
        count = _field("num_processes")(text)
        if count is None:
            raise ValueError("give a number of processes")
        if count % config.num_machines:
            raise ValueError(f"the total must be a multiple of the number of machines ({config.num_machines})")
        if count > 1 and not multiprocess:
            raise ValueError(f"backend {backend.name!r} runs one process only: {backend.comm_backend_reason()}")
        return count

    default_count = (devices_per_machine(backend) if multiprocess else 1) * config.num_machines
    if current is not None and current.num_processes and current.num_processes % config.num_machines == 0 and (
            multiprocess or current.num_processes == 1):
        default_count = current.num_processes
    config.num_processes = _ask("How many processes in total (over all machines)?", processes_answer, default_count)

    if backend.visible_devices_env:
        config.gpu_ids = _ask(
            f"Which devices should be used? ('all' or indices such as 0,1; sets {backend.visible_devices_env})",
            _field("gpu_ids"), was("gpu_ids", "all"),
        )
    config.mixed_precision = _ask(f"Mixed precision? ({', '.join(MIXED_PRECISIONS)})", _field("mixed_precision"), was("mixed_precision", "no"))
    config.debug = _ask("Enable debug mode (ACCEL_DEBUG_MODE, full failure reports)? (yes/no)", _yes_no, yes_no(was("debug", False)))
    config.distributed_type = distributed_type_for(backend, config.num_processes)
    if current is not None and current.distributed_type not in _DERIVED_TYPES:
        config.distributed_type = current.distributed_type  # e.g. FSDP or DEEPSPEED chosen earlier: kept
    if multiprocess:
        _ask_strategy(config, old, current is not None)
    try:
        return config.validate()
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
