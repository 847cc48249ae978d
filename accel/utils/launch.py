"""What `accel launch` hands to the ranks: environment variables (and, for launchers other than torch
elastic, the command line), under Accelerate's names.

The variables are the contract between the launcher and the library (the DeepSpeed, FSDP, compile and
mixed-precision code reads them); :func:`launch_env` is where each is set. Names and
value spellings are exactly those of ``accelerate launch``, so a script or plugin that reads
Accelerate's variables behaves the same under either launcher.

:func:`launch_env` computes only the variables a launch sets (the changes); the Accelerate-named
functions (:func:`prepare_simple_launcher_cmd_env`, :func:`prepare_multi_gpu_env`,
:func:`prepare_deepspeed_cmd_env`, :func:`prepare_tpu`) keep Accelerate's signatures and return
values (the whole environment), for code and tests written against ``accelerate.utils.launch``.

Nothing here touches a device module: the visible-devices variable for ``--gpu_ids`` comes from the
active backend's ``visible_devices_env``.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import warnings
from shutil import which
from typing import Any

from ..facts.environment import TRUE_WORDS
from ..facts.network import DEFAULT_PORT, free_port as _free_port
from ..facts.precision import PRECISIONS
from ..launch.sagemaker_args import convert_nargs_to_dict as _convert_nargs_to_dict
from ..launch.sagemaker_args import prepare_sagemager_args_inputs, setup_fp8_env

__all__ = [
    "DEEPSPEED_MULTINODE_LAUNCHERS",
    "DYNAMO_BACKENDS",
    "PrepareForLaunch",
    "env_var_path_add",
    "launch_env",
    "prepare_deepspeed_cmd_env",
    "prepare_extend_env_parallelism_config",
    "prepare_multi_gpu_env",
    "prepare_sagemager_args_inputs",
    "prepare_simple_launcher_cmd_env",
    "prepare_tpu",
    "setup_fp8_env",
]

#: torch.compile backends Accelerate's ``--dynamo_backend`` knows (its DynamoBackend values)
DYNAMO_BACKENDS = (
    "NO", "EAGER", "AOT_EAGER", "INDUCTOR", "AOT_TS_NVFUSER", "NVPRIMS_NVFUSER", "CUDAGRAPHS", "OFI",
    "FX2TRT", "ONNXRT", "TENSORRT", "AOT_TORCHXLA_TRACE_ONCE", "TORHCHXLA_TRACE_ONCE", "IPEX", "TVM", "HPU_BACKEND",
)
#: DeepSpeed's multi-node launchers; "standard" means torch elastic on every node
DEEPSPEED_MULTINODE_LAUNCHERS = ("pdsh", "standard", "openmpi", "mvapich", "mpich", "nossh")
DEBUG_VARIABLES = ("ACCEL_DEBUG_MODE", "ACCELERATE_DEBUG_MODE")


# ---------------------------------------------------------------------------- small helpers
def _get(args: Any, name: str, default: Any = None) -> Any:
    return getattr(args, name, default)


def _lower(value: Any) -> str:
    return str(value).lower()


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in TRUE_WORDS
    return bool(value)


def _is_port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex((host, int(port))) == 0


def _visible_devices_variable() -> str:
    """The active backend's visible-devices variable (``CUDA_VISIBLE_DEVICES`` when it has none)."""
    try:
        from accel.backends import get_backend

        return get_backend().visible_devices_env or "CUDA_VISIBLE_DEVICES"
    except Exception:
        return "CUDA_VISIBLE_DEVICES"


def _precision(args: Any) -> str:
    value = str(_get(args, "mixed_precision") or "no").lower()
    if value not in PRECISIONS:
        raise ValueError(f"Unknown mixed_precision mode: {value}. Choose between {list(PRECISIONS)}.")
    if value == "fp8":
        # refused here, before any rank starts, in the words the library and `accel env` use
        from ..precision.fp8 import fp8_refusal

        environ = dict(os.environ)
        if _get(args, "fp8_backend"):
            environ["ACCELERATE_FP8_BACKEND"] = str(_get(args, "fp8_backend"))
        if _get(args, "use_deepspeed"):  # MS-AMP is judged with DeepSpeed in mind, as the ranks will see it
            environ["ACCELERATE_USE_DEEPSPEED"] = "true"
        refusal = fp8_refusal(environ=environ)
        if refusal is not None:
            raise ValueError(f"mixed_precision='fp8' is not supported ({refusal})")
    return value


def _dynamo_backend(args: Any) -> str:
    value = str(_get(args, "dynamo_backend") or "no").upper()
    if value not in DYNAMO_BACKENDS:
        raise ValueError(f"Unknown dynamo backend: {value}. Choose between {list(DYNAMO_BACKENDS)}.")
    return value


def env_var_path_add(env_var_name: str, path_to_add: str) -> str:
    """``$env_var_name`` (a ``:``-separated path list) with ``path_to_add`` appended; not set here."""
    parts = [p for p in os.environ.get(env_var_name, "").split(":") if p]
    return ":".join([*parts, str(path_to_add)])


# ---------------------------------------------------------------------------- the variables
def _debug_env(args: Any, env: dict[str, str], environ: dict[str, str]) -> None:
    """``--debug`` turns debug mode on, but a value the user put in the environment is kept as it is."""
    given = [name for name in DEBUG_VARIABLES if name in environ]
    if given:
        for name in DEBUG_VARIABLES:  # mirror the user's value under the other name, never overwrite it
            if name not in environ:
                env[name] = environ[given[0]]
        return
    if _truthy(_get(args, "debug")):
        for name in DEBUG_VARIABLES:
            env[name] = "true"


def _dynamo_env(args: Any, env: dict[str, str]) -> None:
    env["ACCELERATE_DYNAMO_BACKEND"] = _dynamo_backend(args)
    env["ACCELERATE_DYNAMO_MODE"] = str(_get(args, "dynamo_mode") or "default")
    env["ACCELERATE_DYNAMO_USE_FULLGRAPH"] = str(bool(_truthy(_get(args, "dynamo_use_fullgraph", False))))
    env["ACCELERATE_DYNAMO_USE_DYNAMIC"] = str(bool(_truthy(_get(args, "dynamo_use_dynamic", False))))
    env["ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"] = str(bool(_truthy(_get(args, "dynamo_use_regional_compilation", False))))


def _precision_env(args: Any, env: dict[str, str]) -> None:
    precision = _precision(args)
    env["ACCELERATE_MIXED_PRECISION"] = precision
    env["ACCEL_MIXED_PRECISION"] = precision
    if precision == "fp8":
        setup_fp8_env(args, env)


def _fsdp_env(args: Any, env: dict[str, str]) -> None:
    if _truthy(_get(args, "fsdp_cpu_ram_efficient_loading", False)) and not _truthy(_get(args, "fsdp_sync_module_states", False)):
        raise ValueError("When using `--fsdp_cpu_ram_efficient_loading` set `--fsdp_sync_module_states` to `True`")
    env["ACCELERATE_USE_FSDP"] = "true"
    env["FSDP_VERSION"] = str(_get(args, "fsdp_version") or "1")
    env["FSDP_SHARDING_STRATEGY"] = str(_get(args, "fsdp_sharding_strategy"))
    env["FSDP_RESHARD_AFTER_FORWARD"] = _lower(_get(args, "fsdp_reshard_after_forward"))
    env["FSDP_OFFLOAD_PARAMS"] = _lower(_get(args, "fsdp_offload_params"))
    env["FSDP_MIN_NUM_PARAMS"] = str(_get(args, "fsdp_min_num_params"))
    optional = {
        "fsdp_auto_wrap_policy": "FSDP_AUTO_WRAP_POLICY",
        "fsdp_transformer_layer_cls_to_wrap": "FSDP_TRANSFORMER_CLS_TO_WRAP",
        "fsdp_backward_prefetch": "FSDP_BACKWARD_PREFETCH",
        "fsdp_state_dict_type": "FSDP_STATE_DICT_TYPE",
        "fsdp_ignored_modules": "FSDP_IGNORED_MODULES",
    }
    for name, variable in optional.items():
        if _get(args, name) is not None:
            env[variable] = str(_get(args, name))
    for name in ("forward_prefetch", "use_orig_params", "cpu_ram_efficient_loading", "sync_module_states",
                 "activation_checkpointing", "activation_checkpointing_offload"):
        env[f"FSDP_{name.upper()}"] = _lower(_get(args, f"fsdp_{name}", False))


def _deepspeed_env(args: Any, env: dict[str, str]) -> None:
    env["ACCELERATE_USE_DEEPSPEED"] = "true"
    fields = _get(args, "deepspeed_fields_from_accelerate_config", "")
    if isinstance(fields, (list, tuple)):
        fields = ",".join(fields)
    env["ACCELERATE_CONFIG_DS_FIELDS"] = _lower(fields or "")
    plain = {
        "zero_stage": "ACCELERATE_DEEPSPEED_ZERO_STAGE",
        "deepspeed_config_file": "ACCELERATE_DEEPSPEED_CONFIG_FILE",
        "deepspeed_moe_layer_cls_names": "ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES",
        "offload_optimizer_nvme_path": "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH",
        "offload_param_nvme_path": "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_NVME_PATH",
    }
    lowered = {
        "offload_optimizer_device": "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE",
        "offload_param_device": "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE",
        "zero3_init_flag": "ACCELERATE_DEEPSPEED_ZERO3_INIT",
        "zero3_save_16bit_model": "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL",
    }
    for name, variable in plain.items():
        if _get(args, name) is not None:
            env[variable] = str(_get(args, name))
    for name, variable in lowered.items():
        if _get(args, name) is not None:
            env[variable] = _lower(_get(args, name))


def _training_env(args: Any, env: dict[str, str]) -> None:
    """Gradient accumulation and clipping: Accelerate passes them on its DeepSpeed path only; accel
    passes them whenever they are given, so the Accelerator honours them on every path."""
    if _get(args, "gradient_accumulation_steps") is not None:
        env["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"] = str(_get(args, "gradient_accumulation_steps"))
    if _get(args, "gradient_clipping") is not None:
        env["ACCELERATE_GRADIENT_CLIPPING"] = _lower(_get(args, "gradient_clipping"))


def prepare_extend_env_parallelism_config(args: argparse.Namespace, current_env: dict[str, str]) -> dict[str, str]:
    """Add the ``PARALLELISM_CONFIG_*`` variables (``--use_parallelism_config``); returns ``current_env``."""
    prefix = "PARALLELISM_CONFIG_"
    current_env["ACCELERATE_USE_PARALLELISM_CONFIG"] = "true"
    for name in ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "cp_backend", "sp_size", "sp_backend"):
        current_env[prefix + name.upper()] = str(_get(args, f"parallelism_config_{name}"))
    if int(_get(args, "parallelism_config_cp_size", 1) or 1) > 1:
        current_env[prefix + "CP_COMM_STRATEGY"] = str(_get(args, "parallelism_config_cp_comm_strategy"))
    if int(_get(args, "parallelism_config_sp_size", 1) or 1) > 1:
        for name in ("sp_seq_length", "sp_seq_length_is_variable", "sp_attn_implementation"):
            current_env[prefix + name.upper()] = str(_get(args, f"parallelism_config_{name}"))
    return current_env


def launch_env(args: Any, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The variables a launch with ``args`` sets for its ranks (only the changes, not the whole environment).

    ``args`` is a namespace from ``accel launch``'s parser after the config file was merged in (or any
    object with the same attribute names; missing ones count as not given). ``environ`` is the
    launcher's environment (default ``os.environ``): a debug-mode variable already there is kept.
    Raises ValueError for an unknown precision or dynamo backend, or inconsistent FSDP flags.
    """
    environ = dict(os.environ if environ is None else environ)
    env: dict[str, str] = {}
    cpu = bool(_get(args, "cpu", False) or _get(args, "use_cpu", False))
    env["ACCELERATE_USE_CPU"] = str(cpu)
    env["ACCEL_USE_CPU"] = "true" if cpu else "false"
    _debug_env(args, env, environ)
    _precision_env(args, env)
    _dynamo_env(args, env)
    _training_env(args, env)
    if _get(args, "use_fsdp", False):
        _fsdp_env(args, env)
    if _get(args, "use_deepspeed", False):
        _deepspeed_env(args, env)
    if _get(args, "use_parallelism_config", False):
        prepare_extend_env_parallelism_config(args, env)
    if _get(args, "enable_cpu_affinity", False):
        env["ACCELERATE_CPU_AFFINITY"] = "1"
    threads = _get(args, "num_cpu_threads_per_process")
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    gpu_ids = _get(args, "gpu_ids")
    if gpu_ids not in (None, "all"):
        env[_visible_devices_variable()] = str(gpu_ids)
    return env


# ---------------------------------------------------------------------------- Accelerate's functions
def _filter_args(args: argparse.Namespace, parser: argparse.ArgumentParser, default_args: list[str] | None = None) -> argparse.Namespace:
    """The namespace ``parser`` (e.g. torchrun's) would give, with every value ``args`` also has taken from ``args``."""
    filtered, _ = parser.parse_known_args(list(default_args or []))
    for key, value in vars(args).items():
        if hasattr(filtered, key):
            setattr(filtered, key, value)
    return filtered


def _get_mpirun_args() -> tuple[str, str, str, str, str]:
    """(program, hostfile flag, process-count flag, per-node flag, bind flag) of the installed MPI."""
    found = [name for name in ("mpirun", "mpiexec") if which(name)]
    if not found:
        raise OSError("mpirun or mpiexec were not found. Ensure that Intel MPI, Open MPI, or MVAPICH are installed.")
    program = found[0]
    version = subprocess.check_output([program, "--version"])
    if b"Open MPI" in version:
        return program, "--hostfile", "-n", "--npernode", "--bind-to"
    return program, "-f", "-n", "-ppn", ""  # Intel MPI and MVAPICH spell them alike


def _check_module_flags(args: Any) -> None:
    if _get(args, "module") and _get(args, "no_python"):
        raise ValueError("--module and --no_python cannot be used together")


def prepare_simple_launcher_cmd_env(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """Accelerate's one-process (or mpirun) launch: the command to run and the full environment for it."""
    _check_module_flags(args)
    cmd: list[str] = []
    num_processes = _get(args, "num_processes")
    num_machines = _get(args, "num_machines") or 1
    hostfile = _get(args, "mpirun_hostfile")
    if hostfile is not None:
        program, hostfile_flag, count_flag, per_node_flag, bind_flag = _get_mpirun_args()
        per_node = str(num_processes // num_machines) if num_processes and num_machines else "1"
        cmd += [program, hostfile_flag, hostfile, per_node_flag, per_node]
        if num_processes:
            cmd += [count_flag, str(num_processes)]
        if bind_flag:
            cmd += [bind_flag, getattr(args, "bind-to", "socket")]
    if not _get(args, "no_python"):
        cmd.append(sys.executable)
        if _get(args, "module"):
            cmd.append("-m")
    cmd.append(args.training_script)
    cmd.extend(args.training_script_args)

    env = dict(os.environ)
    env.update(launch_env(args, os.environ))
    if num_machines > 1:
        if _get(args, "main_process_ip") is None:
            raise ValueError("When using multiple machines, you need to specify the main process IP.")
        if _get(args, "main_process_port") is None:
            raise ValueError("When using multiple machines, you need to specify the main process port.")
    if (num_processes is not None and num_processes > 1) or num_machines > 1:
        env["MASTER_ADDR"] = _get(args, "main_process_ip") or "127.0.0.1"
        env["MASTER_PORT"] = str(_get(args, "main_process_port") or DEFAULT_PORT)
    if _get(args, "cpu", False) or _get(args, "use_cpu", False):
        env["KMP_AFFINITY"] = "granularity=fine,compact,1,0"
        env["KMP_BLOCKTIME"] = "1"
    return cmd, env


def _torchrun_fields(args: Any) -> None:
    """Set the torchrun fields (nproc_per_node, nnodes, master/rdzv address) on ``args``, as Accelerate does."""
    if _get(args, "main_process_port") == 0:
        args.main_process_port = _free_port()
    elif _get(args, "main_process_port") is None:
        args.main_process_port = DEFAULT_PORT
    num_processes, num_machines = args.num_processes, args.num_machines
    ip, port = _get(args, "main_process_ip"), args.main_process_port
    if num_machines > 1:
        args.nproc_per_node = str(num_processes // num_machines)
        args.nnodes = str(num_machines)
        args.node_rank = int(args.machine_rank)
        if _get(args, "same_network", False):
            args.master_addr, args.master_port = str(ip), str(port)
        else:
            args.rdzv_endpoint = f"{ip}:{port}"
    else:
        args.nproc_per_node = str(num_processes)
        args.master_port = str(port)
    if (num_machines <= 1 or int(_get(args, "machine_rank", 0) or 0) == 0) and _is_port_in_use(port):
        if num_machines <= 1:
            args.standalone = True
            warnings.warn(
                f"Port `{port}` is already in use; launching standalone on a free port instead. Pass "
                "--main_process_port <port> (or 0 for a free one) to choose.",
                stacklevel=3,
            )
        else:
            raise ConnectionError(
                f"Tried to launch distributed communication on port `{port}`, but another process is using it. "
                "Pass another --main_process_port (0 picks a free one on a single node)."
            )
    _check_module_flags(args)


def prepare_multi_gpu_env(args: argparse.Namespace) -> dict[str, str]:
    """Accelerate's torch-elastic launch: sets torchrun's fields on ``args``; returns the full environment."""
    _torchrun_fields(args)
    env = dict(os.environ)
    env.update(launch_env(args, os.environ))
    return env


def prepare_deepspeed_cmd_env(args: argparse.Namespace) -> tuple[list[str] | None, dict[str, str]]:
    """Accelerate's DeepSpeed launch: the ``deepspeed`` runner command for a multi-node launch that does
    not use the ``standard`` launcher (else None, and torchrun's fields are set on ``args``), and the
    full environment with the ``ACCELERATE_DEEPSPEED_*`` variables."""
    if _get(args, "deepspeed_multinode_launcher") is None:
        args.deepspeed_multinode_launcher = DEEPSPEED_MULTINODE_LAUNCHERS[0]
    cmd: list[str] | None = None
    if args.num_machines > 1 and args.deepspeed_multinode_launcher != "standard":
        if _get(args, "main_process_port") in (None, 0):
            args.main_process_port = DEFAULT_PORT if args.main_process_port is None else _free_port()
        cmd = ["deepspeed", "--hostfile", str(_get(args, "deepspeed_hostfile"))]
        if args.deepspeed_multinode_launcher == "nossh":
            cmd += ["--node_rank", str(args.machine_rank), "--no_ssh"]
        else:
            cmd += ["--no_local_rank", "--launcher", str(args.deepspeed_multinode_launcher)]
        if _get(args, "deepspeed_exclusion_filter") is not None:
            cmd += ["--exclude", str(args.deepspeed_exclusion_filter)]
        elif _get(args, "deepspeed_inclusion_filter") is not None:
            cmd += ["--include", str(args.deepspeed_inclusion_filter)]
        else:
            cmd += ["--num_gpus", str(args.num_processes // args.num_machines)]
        if _get(args, "main_process_ip"):
            cmd += ["--master_addr", str(args.main_process_ip)]
        cmd += ["--master_port", str(args.main_process_port)]
        _check_module_flags(args)
        if _get(args, "module"):
            cmd.append("--module")
        elif _get(args, "no_python"):
            cmd.append("--no_python")
        cmd += [args.training_script, *args.training_script_args]
    else:
        _torchrun_fields(args)
    args.use_deepspeed = True
    env = dict(os.environ)
    env.update(launch_env(args, os.environ))
    env["PYTHONPATH"] = env_var_path_add("PYTHONPATH", os.path.abspath("."))
    return cmd, env


def prepare_tpu(args: argparse.Namespace, current_env: dict[str, str], pod: bool = False) -> tuple[argparse.Namespace, dict[str, str]]:
    """Accelerate's XLA settings: bf16 flags for torch_xla (only where torch_xla is installed), debug mode,
    and for a pod the ``vm``/``tpu`` fields. accel launch itself refuses TPU runs (no XLA backend)."""
    import importlib.util

    if _get(args, "mixed_precision") == "bf16" and importlib.util.find_spec("torch_xla") is not None:
        current_env["XLA_DOWNCAST_BF16" if _get(args, "downcast_bf16") else "XLA_USE_BF16"] = "1"
    if _get(args, "debug"):
        current_env["ACCELERATE_DEBUG_MODE"] = "true"
    if pod:
        args.vm = _get(args, "tpu_vm")
        args.tpu = _get(args, "tpu_name")
    return args, current_env


class PrepareForLaunch:
    """A function wrapped to run as one of several processes (``index`` is the local rank), as in Accelerate.

    Sets ``LOCAL_RANK``/``RANK`` from ``NPROC``/``NODE_RANK`` for multi-process types and
    ``FORK_LAUNCHED=1``, then calls ``launcher(*args)``. With ``debug``, the process group is formed on a
    file store named by ``ACCELERATE_DEBUG_RDV_FILE`` (as ``debug_launcher`` does).
    """

    def __init__(self, launcher: Any, distributed_type: Any = "NO", debug: bool = False):
        from accel.utils.dataclasses import DistributedType

        self.launcher = launcher
        self.distributed_type = DistributedType(distributed_type)
        self.debug = debug

    def __call__(self, index: int, *args: Any) -> None:
        from accel.utils.dataclasses import DistributedType

        if self.debug:
            import torch.distributed as dist

            world_size = int(os.environ["WORLD_SIZE"])
            store = dist.FileStore(os.environ["ACCELERATE_DEBUG_RDV_FILE"], world_size)
            dist.init_process_group("gloo", rank=index, store=store, world_size=world_size)
        elif self.distributed_type not in (DistributedType.NO, DistributedType.DEEPSPEED, DistributedType.FSDP,
                                           DistributedType.XLA, DistributedType.MEGATRON_LM):
            os.environ["LOCAL_RANK"] = str(index)
            nproc = int(os.environ.get("NPROC", 1))
            os.environ["RANK"] = str(nproc * int(os.environ.get("NODE_RANK", 0)) + index)
        os.environ["FORK_LAUNCHED"] = "1"
        self.launcher(*args)
