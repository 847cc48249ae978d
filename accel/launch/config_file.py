"""accel's config file: where it lives, what it may contain, and how it is read and written.

One place, so `accel env`, `accel config` and `accel launch` agree. The keys are Accelerate's
(``num_processes``, ``mixed_precision``, ``use_cpu``, ...) plus accel's ``backend`` (the hardware
backend name), so a file written by ``accelerate config`` (any version) loads here. Accelerate's other
keys (``fsdp_config``, ``deepspeed_config``, ``tpu_*``, SageMaker's, ...) are checked by kind and kept in
``LaunchConfig.extra``; `accel launch` passes the sections on to the ranks and refuses what cannot run
here (TPU, SageMaker, Megatron-LM). Anything else is an error naming the file, the line and the key,
with a suggestion for a likely typo.

Every value check lives in :data:`FIELDS`, shared by the file loader, the ``accel config`` flags and
its interactive questions, so the three cannot disagree.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from accel.facts.environment import parse_bool
from accel.facts.precision import PRECISIONS
from accel.facts import yaml_safe
from accel.facts.yaml_safe import preview
from accel.io.files import atomic_write

__all__ = [
    "ACCELERATE_ONLY_KEYS",
    "SECTION_KEYS",
    "COMPUTE_ENVIRONMENTS",
    "CONFIG_ENV",
    "DISTRIBUTED_TYPES",
    "SAGEMAKER_DISTRIBUTED_TYPES",
    "FIELDS",
    "MIXED_PRECISIONS",
    "RDZV_BACKENDS",
    "ConfigError",
    "LaunchConfig",
    "config_file_in_use",
    "default_config_path",
    "load_config",
    "parse_value",
    "save_config",
]

#: environment variable naming the config file explicitly
CONFIG_ENV = "ACCEL_CONFIG_FILE"

#: the ``mixed_precision`` values (Accelerate's, from accel.facts.precision)
MIXED_PRECISIONS = PRECISIONS
RDZV_BACKENDS = ("static", "c10d", "etcd", "etcd-v2")
COMPUTE_ENVIRONMENTS = ("LOCAL_MACHINE", "AMAZON_SAGEMAKER")
#: Accelerate's DistributedType values (accel launch runs the process-group ones)
DISTRIBUTED_TYPES = (
    "NO",
    "MULTI_CPU",
    "MULTI_GPU",
    "MULTI_XPU",
    "MULTI_HPU",
    "MULTI_NPU",
    "MULTI_MLU",
    "MULTI_SDAA",
    "MULTI_MUSA",
    "MULTI_NEURON",
    "DEEPSPEED",
    "FSDP",
    "XLA",
    "MEGATRON_LM",
)
#: Accelerate's SageMakerDistributedType values: the ``distributed_type`` of an AMAZON_SAGEMAKER config
SAGEMAKER_DISTRIBUTED_TYPES = ("NO", "DATA_PARALLEL", "MODEL_PARALLEL")

#: keys of an Accelerate config file beyond accel's core ones, by kind: sections (mappings) that
#: `accel launch` turns into the ranks' environment (fsdp_config -> FSDP_*, ...), the TPU and
#: SageMaker settings (loaded, so old files load, but refused by `accel launch`) and lists.
SECTION_KEYS = (
    "fp8_config", "deepspeed_config", "fsdp_config", "parallelism_config", "megatron_lm_config",
    "mpirun_config", "ipex_config", "dynamo_config", "additional_args",
)
TEXT_KEYS = (
    "tpu_name", "tpu_zone", "command_file", "ec2_instance_type", "iam_role_name", "image_uri", "profile",
    "region", "base_job_name", "pytorch_version", "transformers_version", "py_version",
    "sagemaker_inputs_file", "sagemaker_metrics_file",
)
FLAG_KEYS = ("enable_cpu_affinity", "tpu_use_cluster", "tpu_use_sudo", "downcast_bf16")
LIST_KEYS = ("commands", "tpu_vm", "tpu_env")
#: keys older Accelerate versions wrote, read as the current ones: old key -> new key
LEGACY_KEYS = {"command": "commands", "fp16": "mixed_precision", "dynamo_backend": "dynamo_config"}
#: every Accelerate key accel keeps beside its core FIELDS (kept in ``LaunchConfig.extra``)
ACCELERATE_ONLY_KEYS = SECTION_KEYS + TEXT_KEYS + FLAG_KEYS + LIST_KEYS


def default_config_path() -> Path:
    """``$ACCEL_CONFIG_FILE`` if set, else ``${XDG_CACHE_HOME:-~/.cache}/accel/default_config.yaml``."""
    from accel.io.paths import cache_dir

    override = os.environ.get(CONFIG_ENV)
    if override:
        return Path(override).expanduser()
    return cache_dir() / "default_config.yaml"


def config_file_in_use() -> tuple[Path, bool]:
    """The config path accel would read and whether a file is there."""
    path = default_config_path()
    return path, path.is_file()


# ---------------------------------------------------------------------------- value checks
class FileValueError(ValueError):
    """A file (or a value meant for one) that cannot be used; the message says which file, line and key."""

    #: what the file is, in messages ("config file", "matrix file", ...)
    what = "file"

    def __init__(self, message: str, path: Path | str | None = None, line: int | None = None, key: str | None = None):
        self.path = None if path is None else Path(path)
        self.line = line
        self.key = key
        self.problem = message
        where = []
        if path is not None:
            where.append(f"{self.what} {path}")
        if line is not None:
            where.append(f"line {line}")
        prefix = ", ".join(where)
        text = f"{key}: {message}" if key else message
        super().__init__(f"{prefix}: {text}" if prefix else text)


class ConfigError(FileValueError):
    """A config file (or a value meant for one) that accel cannot use."""

    what = "config file"


def _suggest(word: str, options: Any) -> str:
    match = difflib.get_close_matches(str(word), [str(o) for o in options], n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _whole(minimum: int, maximum: int | None = None, unset: tuple[Any, ...] = ()) -> Callable[[Any], Any]:
    """A whole number in [minimum, maximum]; digit strings are accepted; values in ``unset`` mean None."""
    bound = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"

    def check(value: Any) -> int | None:
        if value is None or (value in unset and not isinstance(value, bool)):
            return None
        number = value
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            number = int(value.strip())
        if not _is_int(number) or number < minimum or (maximum is not None and number > maximum):
            raise ValueError(f"expected a whole number {bound}, got {preview(value)}")
        return number

    return check


def _flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise ValueError(f"expected true or false, got {preview(value)}")


def _choice(options: tuple[str, ...], upper: bool = False) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if isinstance(value, str):
            text = value.strip().upper() if upper else value.strip().lower()
            if text in options:
                return text
        raise ValueError(f"expected one of {', '.join(options)}, got {preview(value)}{_suggest(value, options)}")

    return check


def _mixed_precision(value: Any) -> str:
    if value is False:  # an unquoted `no` in YAML reads as false
        return "no"
    return _choice(MIXED_PRECISIONS)(value)


def _distributed_type(value: Any) -> str:
    """A local ``DistributedType`` or a SageMaker one (which of the two the compute environment allows is
    checked by ``LaunchConfig.validate``)."""
    if value is False:  # an unquoted `NO` in YAML reads as false
        return "NO"
    return _choice(DISTRIBUTED_TYPES + SAGEMAKER_DISTRIBUTED_TYPES[1:], upper=True)(value)


def _text(value: Any) -> str:
    if isinstance(value, str) and value.strip() and not any(c.isspace() for c in value.strip()):
        return value.strip()
    raise ValueError(f"expected a non-empty word without spaces, got {preview(value)}")


def _optional_text(value: Any) -> str | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return _text(value)


def _backend_name(value: Any) -> str | None:
    name = _optional_text(value)
    return None if name is None else name.lower()


def _gpu_ids(value: Any) -> str | None:
    """``all`` or a comma-separated list of device indices (``0,1``); a lone int is one index."""
    if value is None:
        return None
    if _is_int(value):
        value = str(value)
    if isinstance(value, (list, tuple)) and all(_is_int(v) for v in value):
        value = ",".join(str(v) for v in value)
    if isinstance(value, str):
        text = value.replace(" ", "")
        if text.lower() == "all" or not text:
            return "all" if text else None
        parts = text.split(",")
        if all(p.isdigit() for p in parts):
            if len(set(parts)) != len(parts):
                raise ValueError(f"lists a device twice: {preview(value)}")
            return ",".join(str(int(p)) for p in parts)
    raise ValueError(f"expected 'all' or comma-separated device indices such as 0,1, got {preview(value)}")


#: YAML key -> check that returns the normalised value or raises ValueError(reason)
FIELDS: dict[str, Callable[[Any], Any]] = {
    "compute_environment": _choice(COMPUTE_ENVIRONMENTS, upper=True),
    "distributed_type": _distributed_type,
    "num_processes": _whole(1, unset=(-1,)),  # Accelerate writes -1 for "pass --num_processes"
    "num_machines": _whole(1),
    "machine_rank": _whole(0),
    "main_process_ip": _optional_text,
    "main_process_port": _whole(0, 65535),
    "mixed_precision": _mixed_precision,
    "use_cpu": _flag,
    "gpu_ids": _gpu_ids,
    "rdzv_backend": _choice(RDZV_BACKENDS),
    "same_network": _flag,
    "main_training_function": _text,
    "debug": _flag,
    "backend": _backend_name,
}


def parse_value(key: str, value: Any) -> Any:
    """``value`` checked and normalised for ``key``; ValueError with the reason otherwise."""
    try:
        check = FIELDS[key]
    except KeyError:
        raise ValueError(f"unknown config key {key!r}{_suggest(key, FIELDS)}") from None
    return check(value)


# ---------------------------------------------------------------------------- the config
@dataclass
class LaunchConfig:
    """What a config file says about how to launch; ``None`` means "not set, use the default"."""

    compute_environment: str = "LOCAL_MACHINE"
    distributed_type: str = "NO"
    num_processes: int | None = None
    num_machines: int = 1
    machine_rank: int = 0
    main_process_ip: str | None = None
    main_process_port: int | None = None
    mixed_precision: str = "no"
    use_cpu: bool = False
    gpu_ids: str | None = None
    rdzv_backend: str = "static"
    same_network: bool = False
    main_training_function: str = "main"
    debug: bool = False
    #: accel's hardware backend name (cpu, cuda, xpu, mps, hpu or a plug-in); None: detect
    backend: str | None = None
    #: Accelerate's other keys found in the file (sections, TPU, SageMaker), checked by kind
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    #: where it was loaded from, and the line of each key there (for error messages)
    path: Path | None = field(default=None, compare=False, repr=False)
    lines: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

    @staticmethod
    def keys() -> tuple[str, ...]:
        return tuple(FIELDS)

    def to_dict(self) -> dict[str, Any]:
        """The YAML mapping: known keys in a fixed order (unset ones left out), then the extra ones."""
        data = {key: getattr(self, key) for key in FIELDS if getattr(self, key) is not None}
        data.update(self.extra)
        return data

    def line_of(self, key: str) -> int | None:
        return self.lines.get(key)

    def error(self, key: str, message: str) -> ConfigError:
        """A ConfigError about ``key``, pointing at the file and line when this config came from one."""
        return ConfigError(message, self.path, self.lines.get(key), key)

    def validate(self) -> "LaunchConfig":
        """Check every value and the rules between them; raise ConfigError naming the key."""
        for key in FIELDS:
            try:
                setattr(self, key, FIELDS[key](getattr(self, key)))
            except ValueError as exc:
                raise self.error(key, str(exc)) from None
        for key, value in list(self.extra.items()):
            try:
                self.extra[key] = _extra_value(key, value)
            except ValueError as exc:
                raise self.error(key, str(exc)) from None
        sagemaker = self.compute_environment == "AMAZON_SAGEMAKER"
        allowed = SAGEMAKER_DISTRIBUTED_TYPES if sagemaker else DISTRIBUTED_TYPES
        if self.distributed_type not in allowed:
            raise self.error("distributed_type", f"with compute_environment {self.compute_environment} expected one of "
                                                 f"{', '.join(allowed)}, got {self.distributed_type!r}")
        if self.machine_rank >= self.num_machines:
            raise self.error("machine_rank", f"must be below num_machines ({self.num_machines}), got {self.machine_rank}")
        if self.num_processes is not None and self.num_processes % self.num_machines:
            raise self.error(
                "num_processes",
                f"is the total over all machines and must be a multiple of num_machines ({self.num_machines}), got {self.num_processes}",
            )
        return self

    def replace(self, **changes: Any) -> "LaunchConfig":
        return dataclasses.replace(self, **changes)


def _extra_value(key: str, value: Any) -> Any:
    """``value`` checked for one of Accelerate's extra keys (by kind); ValueError with the reason."""
    if value is None:
        return None
    if key in SECTION_KEYS:
        if not isinstance(value, dict):
            raise ValueError(f"expected a mapping of settings, got {preview(value)}")
        return value
    if key in FLAG_KEYS:
        if isinstance(value, str):
            return parse_bool(value, "the value")  # Accelerate wrote downcast_bf16: 'no'
        return _flag(value)
    if key in LIST_KEYS:
        if isinstance(value, str):
            return [value]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
        raise ValueError(f"expected a list of strings, got {preview(value)}")
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    raise ValueError(f"expected text, got {preview(value)}")


def _upgrade_legacy_keys(data: dict[str, Any], lines: dict[str, int]) -> dict[str, Any]:
    """Keys older Accelerate versions wrote, turned into today's (``fp16: true`` -> ``mixed_precision: fp16``,
    top-level ``dynamo_backend`` -> ``dynamo_config``, ``command`` -> ``commands``)."""
    if "fp16" in data:
        fp16 = data.pop("fp16")
        if "mixed_precision" not in data:
            data["mixed_precision"] = "fp16" if fp16 else "no"
            lines.setdefault("mixed_precision", lines.get("fp16", 0))
    if "dynamo_backend" in data:
        backend = data.pop("dynamo_backend")
        if "dynamo_config" not in data:
            data["dynamo_config"] = {} if str(backend).upper() == "NO" else {"dynamo_backend": backend}
    if "command" in data:
        command = data.pop("command")
        if data.get("commands") is None and command is not None:
            data["commands"] = command
        data.setdefault("commands", None)
    return data


def load_config(path: str | os.PathLike[str]) -> LaunchConfig:
    """Read and check a config file (YAML, or the JSON Accelerate sometimes writes).

    Raises ConfigError naming the file, the line and the key for a syntax error, an unknown key
    (with a did-you-mean), a duplicated key, a value of the wrong type or range, or a file that
    :mod:`accel.facts.yaml_safe` refuses (too large, aliases that expand too far).
    """
    import yaml

    path = Path(path)
    try:
        yaml_safe.check_size(path)
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("no such file", path) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot be read: {exc}", path) from None
    except yaml_safe.YamlError as exc:
        raise ConfigError(exc.problem, path) from None
    try:
        root = yaml_safe.compose(text, path)
        pairs = list(root.value) if isinstance(root, yaml.MappingNode) else []  # construct rewrites merge keys
        data = yaml_safe.construct(root, path)
    except yaml_safe.YamlError as exc:
        raise ConfigError(exc.problem if exc.refused else f"YAML syntax error: {exc.problem}", path, exc.line) from None
    if root is None:
        raise ConfigError("the file is empty (expected keys such as `num_processes: 2`)", path)
    if not isinstance(root, yaml.MappingNode) or not isinstance(data, dict):
        raise ConfigError(f"expected a mapping of keys to values, got a {type(data).__name__}", path, root.start_mark.line + 1)

    lines: dict[str, int] = {}
    first: dict[str, Any] = {}  # key -> the node of its first value
    for key_node, value_node in pairs:
        key, line = key_node.value, key_node.start_mark.line + 1
        if not isinstance(key_node, yaml.ScalarNode):
            raise ConfigError("keys must be plain words", path, line)
        # a repeated key with the same value is harmless; values are built only for repeated keys
        if key in first and yaml_safe.construct(first[key], path) != yaml_safe.construct(value_node, path):
            raise ConfigError(f"appears twice with different values (lines {lines[key]} and {line})", path, line, key)
        first.setdefault(key, value_node)
        lines[key] = line

    config = LaunchConfig(path=path, lines=lines)
    data = _upgrade_legacy_keys({str(k): v for k, v in data.items()}, lines)
    for key, value in data.items():
        if key in FIELDS:
            setattr(config, key, value)
        elif key in ACCELERATE_ONLY_KEYS:
            config.extra[key] = value
        else:
            raise ConfigError(f"unknown key {preview(key)}{_suggest(key, list(FIELDS) + list(ACCELERATE_ONLY_KEYS))}", path, lines.get(key))
    return config.validate()


def save_config(config: LaunchConfig, path: str | os.PathLike[str]) -> Path:
    """Check ``config`` and write it to ``path`` atomically (a temp file beside it, then os.replace).

    A crash mid-write leaves the previous file intact. Returns the path written.
    """
    import yaml

    config = dataclasses.replace(config, path=None, lines={}).validate()
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(config.to_dict(), sort_keys=False, default_flow_style=False)
    # keep the mode of the file being replaced; a new one is readable by all, like yaml configs
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"), keep_mode=0o644)
    return path
