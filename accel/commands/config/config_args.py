"""Accelerate's config dataclasses (``BaseConfig``, ``ClusterConfig``, ``SageMakerConfig``) and
``load_config_from_file``, on top of accel's one config loader (:mod:`accel.launch.config_file`).

A file goes through accel's checks first (file, line and key in every error; unknown keys refused with
a did-you-mean; old Accelerate keys upgraded), then becomes the dataclass Accelerate's code expects:
``SageMakerConfig`` for ``compute_environment: AMAZON_SAGEMAKER``, else ``ClusterConfig``.
"""

from __future__ import annotations

import enum
import json
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Optional, Union

from accel.launch.config_file import CONFIG_ENV, ConfigError, LaunchConfig, default_config_path, load_config
from accel.utils.dataclasses import ComputeEnvironment, DistributedType
from accel.io.files import atomic_write

__all__ = [
    "BaseConfig",
    "ClusterConfig",
    "SageMakerConfig",
    "SageMakerDistributedType",
    "cluster_config_from",
    "default_config_file",
    "default_json_config_file",
    "default_yaml_config_file",
    "load_config_from_file",
]

#: where `accel config` writes and `accel launch` reads by default ($ACCEL_CONFIG_FILE wins)
default_yaml_config_file = str(default_config_path())
default_json_config_file = default_yaml_config_file
default_config_file = default_yaml_config_file


class SageMakerDistributedType(str, enum.Enum):
    """Accelerate's distributed types of a SageMaker job (accel loads them; it does not run SageMaker)."""

    NO = "NO"
    DATA_PARALLEL = "DATA_PARALLEL"
    MODEL_PARALLEL = "MODEL_PARALLEL"


def load_config_from_file(config_file: str | os.PathLike[str] | None) -> "BaseConfig":
    """The config in ``config_file`` (None: ``$ACCEL_CONFIG_FILE``, else the default file) as a
    ``ClusterConfig`` or ``SageMakerConfig``.

    FileNotFoundError names the missing path (also when ``$ACCEL_CONFIG_FILE`` names one); a file accel
    cannot use raises ``ConfigError`` (a ValueError) naming the file, the line and the key.
    """
    if config_file is None:
        config_file = default_config_path()
        if not Path(config_file).is_file() and os.environ.get(CONFIG_ENV):
            raise FileNotFoundError(f"{CONFIG_ENV} names a config file that does not exist: {config_file}")
    path = Path(config_file).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"The passed configuration file `{config_file}` does not exist: pass an existing file, or create the "
            "default one with `accel config` and leave --config_file out"
        )
    loaded = load_config(path)
    if loaded.compute_environment == "AMAZON_SAGEMAKER":
        return SageMakerConfig.from_launch_config(loaded)
    return cluster_config_from(loaded)


def cluster_config_from(config: LaunchConfig) -> "ClusterConfig":
    """A checked ``LaunchConfig`` as Accelerate's ``ClusterConfig``."""
    return ClusterConfig.from_launch_config(config)


def _plain(value: Any) -> Any:
    """Enums as their values, empty mappings as None (Accelerate leaves those out of the file)."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()} or None
    return value


@dataclass
class BaseConfig:
    """What every Accelerate config has: where it runs, how processes are organised, precision, cpu, debug."""

    compute_environment: ComputeEnvironment
    distributed_type: Union[DistributedType, SageMakerDistributedType]
    mixed_precision: str
    use_cpu: bool
    debug: bool

    def __post_init__(self) -> None:
        if isinstance(self.compute_environment, str):
            self.compute_environment = ComputeEnvironment(self.compute_environment)
        if isinstance(self.distributed_type, str) or self.distributed_type is False:
            kind = "NO" if self.distributed_type is False else self.distributed_type
            sagemaker = self.compute_environment == ComputeEnvironment.AMAZON_SAGEMAKER
            self.distributed_type = (SageMakerDistributedType if sagemaker else DistributedType)(kind)
        if getattr(self, "dynamo_config", None) is None:
            self.dynamo_config = {}

    def to_dict(self) -> dict[str, Any]:
        """The mapping written to the file: enums as values, unset (None) and empty sections left out."""
        data = {f.name: _plain(getattr(self, f.name)) for f in fields(self)}
        return {key: value for key, value in data.items() if value is not None}

    @classmethod
    def from_launch_config(cls, config: LaunchConfig) -> "BaseConfig":
        """Build from accel's checked config; keys this class does not have are an error naming them."""
        data = config.to_dict()
        data.setdefault("mixed_precision", "no")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known - {"backend"})
        if unknown:
            raise ConfigError(f"keys not valid for {cls.__name__}: {unknown}", config.path)
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def from_yaml_file(cls, yaml_file: str | None = None) -> "BaseConfig":
        """Load and check ``yaml_file`` (default: the default config file) as this class."""
        return cls.from_launch_config(load_config(yaml_file or default_yaml_config_file))

    from_json_file = from_yaml_file  # the loader reads JSON too (JSON is YAML)

    def to_yaml_file(self, yaml_file: str | os.PathLike[str]) -> None:
        """Write this config as YAML, atomically (a crash leaves the previous file intact)."""
        import yaml

        text = yaml.safe_dump(self.to_dict(), sort_keys=False)
        atomic_write(Path(yaml_file), lambda tmp: tmp.write_text(text, encoding="utf-8"), keep_mode=0o644)

    def to_json_file(self, json_file: str | os.PathLike[str]) -> None:
        """Write this config as JSON (sorted keys), atomically."""
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"
        atomic_write(Path(json_file), lambda tmp: tmp.write_text(text, encoding="utf-8"), keep_mode=0o644)


@dataclass
class ClusterConfig(BaseConfig):
    """A local (single or multi-machine) setup, with Accelerate's fields plus accel's ``backend``."""

    num_processes: int = -1  # -1: "pass --num_processes", as Accelerate writes for SLURM-style setups
    machine_rank: int = 0
    num_machines: int = 1
    gpu_ids: Optional[str] = None
    main_process_ip: Optional[str] = None
    main_process_port: Optional[int] = None
    rdzv_backend: Optional[str] = "static"
    same_network: Optional[bool] = False
    main_training_function: str = "main"
    enable_cpu_affinity: bool = False
    fp8_config: Optional[dict] = None
    deepspeed_config: Optional[dict] = None
    fsdp_config: Optional[dict] = None
    parallelism_config: Optional[dict] = None
    megatron_lm_config: Optional[dict] = None
    mpirun_config: Optional[dict] = None
    ipex_config: Optional[dict] = None
    downcast_bf16: bool = False
    tpu_name: Optional[str] = None
    tpu_zone: Optional[str] = None
    tpu_use_cluster: bool = False
    tpu_use_sudo: bool = False
    command_file: Optional[str] = None
    commands: Optional[list] = None
    tpu_vm: Optional[list] = None
    tpu_env: Optional[list] = None
    dynamo_config: Optional[dict] = None
    #: accel's hardware backend name (cpu, cuda, xpu, ...); None: detect
    backend: Optional[str] = None

    def __post_init__(self) -> None:
        for name in ("fp8_config", "deepspeed_config", "fsdp_config", "parallelism_config", "megatron_lm_config",
                     "mpirun_config", "ipex_config"):
            if getattr(self, name) is None:
                setattr(self, name, {})
        super().__post_init__()

    @classmethod
    def from_launch_config(cls, config: LaunchConfig) -> "ClusterConfig":
        data = config.to_dict()
        data.setdefault("mixed_precision", "no")
        if config.num_processes is None:  # as Accelerate: one process for NO, else "pass --num_processes"
            data["num_processes"] = 1 if config.distributed_type == "NO" else -1
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class SageMakerConfig(BaseConfig):
    """An Amazon SageMaker job's settings. accel loads these files (so old ones keep working) but
    `accel launch` refuses to run them: it starts local processes only."""

    ec2_instance_type: str
    iam_role_name: str
    image_uri: Optional[str] = None
    profile: Optional[str] = None
    region: str = "us-east-1"
    num_machines: int = 1
    gpu_ids: str = "all"
    base_job_name: str = "accelerate-sagemaker-1"
    pytorch_version: Optional[str] = None
    transformers_version: Optional[str] = None
    py_version: Optional[str] = None
    sagemaker_inputs_file: Optional[str] = None
    sagemaker_metrics_file: Optional[str] = None
    additional_args: Optional[dict] = None
    dynamo_config: Optional[dict] = None
    enable_cpu_affinity: bool = False

    @classmethod
    def from_launch_config(cls, config: LaunchConfig) -> "SageMakerConfig":
        data = config.to_dict()
        data.setdefault("mixed_precision", "no")
        for required in ("ec2_instance_type", "iam_role_name"):
            if not data.get(required):
                raise ConfigError(f"a SageMaker config needs {required}", config.path, key=required)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
