"""`accel launch`: start a script in N processes through torch elastic (the launcher behind torchrun).

``accel launch [options] script.py [script args]`` takes every option of ``accelerate launch`` with the
same meaning (spelled ``--num_processes`` or ``--num-processes``). Settings resolve as Accelerate's do:
a flag, else the config file (``--config_file``, else ``$ACCEL_CONFIG_FILE``, else the default file),
else a default. Everything is checked before anything starts (a mistake is one line and exit status
2); then torchrun's argument list is built and ``torch.distributed.run`` runs in this process, so the
elastic agent's failure report reaches us as a ``ChildFailedError`` rather than a bare exit status 1.
It starts exactly the processes asked for: ``--cpu --num_processes 2`` is two ranks.

What each option does, by family:

* hardware, processes, machines, rendezvous (``--cpu``, ``--multi_gpu``, ``--num_processes``,
  ``--gpu_ids``, ``--main_process_port``, ``--rdzv_*``, ``--max_restarts``, ``--tee``, ``--log_dir``,
  ``--role``, ...): shape the launch itself;
* training features (``--mixed_precision``, ``--dynamo_*``, ``--use_deepspeed`` and the DeepSpeed
  options, ``--use_fsdp``/``--fsdp_*``, ``--fp8_*``, ``--gradient_*``, ``--use_parallelism_config``,
  ``--enable_cpu_affinity``): reach the ranks as the environment variables Accelerate's launcher sets
  (:func:`accel.utils.launch.launch_env`), read by the library;
* ``--mpirun_hostfile`` launches through mpirun; a multi-node DeepSpeed launch with a launcher other
  than ``standard`` runs DeepSpeed's own runner, as Accelerate does;
* options that cannot apply here are refused with the option and the reason: TPU (``--tpu``,
  ``--tpu_cluster``, ``--vm``, ``--downcast_bf16``, ...), SageMaker (``--aws_*`` and SageMaker
  configs) and Megatron-LM (``--use_megatron_lm``, ``--megatron_lm_*``).

This module reads the arguments and makes the plan; the rest is split by job:
:mod:`~accel.commands.launch_run` runs the plan (torch elastic's agent in this process),
:mod:`~accel.commands.launch_bootstrap` is what every rank runs (``python -u -m
accel.commands.launch_bootstrap [--module] TARGET ARGS``: the script as ``__main__``, its failure
recorded), :mod:`~accel.commands.launch_watchdog` ends a hung job, :mod:`~accel.commands.launch_report`
reports failed ranks, and :mod:`~accel.commands.launch_diagnosis` holds the evidence and the rules
that decide whom to blame (docs/launch.md tells the whole story). In short:

* **the rank to blame is named by evidence**: the first to fail, by the time it recorded its failure
  or, for a rank killed by a signal (which records nothing), the last moment the launcher saw it
  running; the launch exits with that rank's exit code (128 + N for signal N);
* **a hang ends the job**: when no rank has passed a progress point (steps, ``backward``, accel's
  collectives) for ``--hang_timeout`` seconds (default 600, ``$ACCEL_HANG_TIMEOUT``, 0 never), every
  rank's Python stack and OS state are collected; a live rank that does not answer (stopped, stuck in
  the kernel) is the hung one, else the rank that is behind; every rank is killed, exit status 124;
* **several nodes agree**: the launchers swap their evidence through the rendezvous store and print
  the same verdict (each wait bounded);
* **no leftovers**: ranks die with the launcher (Linux ``PR_SET_PDEATHSIG``), and the private folder
  of a launcher that was killed is removed by the next launch.

Besides the variables above, every rank gets ``ACCEL_DEVICE`` (when the backend was chosen by flag or
config), ``OMP_NUM_THREADS`` (unless set: usable cores divided by local processes), the backend's
visible-devices variable for ``--gpu_ids`` and, for single-node CPU runs, ``GLOO_SOCKET_IFNAME`` bound
to the loopback interface. ``ACCEL_DEBUG_MODE``/``ACCELERATE_DEBUG_MODE`` already in the environment
are passed on unchanged. Single-node runs meet on 127.0.0.1 at a free port unless
``--main_process_ip/--main_process_port`` say otherwise.
"""

from __future__ import annotations

import argparse
import copy
import os
import shutil
import socket
import sys
from dataclasses import dataclass, field
from typing import Any

from accel.commands import UsageError
from accel.commands.launch_bootstrap import LAUNCHER_PID_ENV, worker_main
from accel.commands.launch_diagnosis import waiting_in_collective
from accel.commands.launch_report import TRACEBACK_LINES, clean_traceback, failure_report
from accel.commands.launch_run import execute, patched_environ
from accel.commands.launch_watchdog import HANG_EXIT_CODE, HangWatchdog, hang_report

__all__ = [
    "HANG_EXIT_CODE",
    "LAUNCHER_PID_ENV",
    "LAUNCH_OPTIONS",
    "REFUSED",
    "TRACEBACK_LINES",
    "HangWatchdog",
    "LaunchPlan",
    "add_arguments",
    "add_launch_options",
    "build_plan",
    "clean_traceback",
    "execute",
    "failure_report",
    "hang_report",
    "launch_command",
    "launch_command_parser",
    "loopback_interface",
    "patched_environ",
    "run",
    "waiting_in_collective",
    "worker_main",
]

DEFAULT_PORT = 29500
#: seconds without progress on any rank before `accel launch` ends the job as hung: NCCL's own collective
#: timeout, which training users already live with; a step, an accel collective or a checkpoint file resets it
DEFAULT_HANG_TIMEOUT = 600.0
HANG_TIMEOUT_ENV = "ACCEL_HANG_TIMEOUT"
#: the module every rank runs (it runs the script and records its failures)
BOOTSTRAP_MODULE = "accel.commands.launch_bootstrap"

MIXED_PRECISIONS = ("no", "fp16", "bf16", "fp8")
DYNAMO_CHOICES = ("no", "eager", "aot_eager", "inductor", "aot_ts_nvfuser", "nvprims_nvfuser", "cudagraphs", "ofi",
                  "fx2trt", "onnxrt", "tensorrt", "aot_torchxla_trace_once", "torhchxla_trace_once", "tvm")


def _bool_text(text: str) -> bool:
    word = str(text).strip().lower()
    if word in ("1", "true", "yes", "y", "on"):
        return True
    if word in ("0", "false", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _triple(text: str) -> tuple[bool, ...]:
    """``false,false,true`` (Accelerate's spelling) or ``(false, false, true)`` as a tuple of three bools."""
    words = [w.strip() for w in str(text).strip().strip("()").split(",") if w.strip()]
    try:
        value = tuple(_bool_text(w) for w in words)
    except argparse.ArgumentTypeError:
        value = ()
    if len(value) != 3:
        raise argparse.ArgumentTypeError(f"expected three booleans such as false,false,true, got {text!r}")
    return value


#: Why each refused option cannot apply under accel; the family name is used in the message.
_TPU = "TPU launches need torch_xla and Google Cloud TPU VMs; accel launches through torch elastic on this machine (see `accel tpu-config` for pod set-up)"
_SAGEMAKER = "Amazon SageMaker jobs are started by `accelerate launch` with a SageMaker config; accel starts local processes only"
_MEGATRON = "Megatron-LM training is not implemented by accel (no Megatron-LM plugin); use `accelerate launch`"
REFUSED: dict[str, str] = {}

# (group title, [(flags, dest, kwargs)]): Accelerate 1.x's options with its defaults, so code that builds
# the parser and reads the namespace (as Accelerate's tests do) sees the same values.
LAUNCH_OPTIONS: list[tuple[str | None, list[tuple[tuple[str, ...], dict[str, Any]]]]] = [
    (None, [
        (("--config_file",), dict(default=None, metavar="PATH",
                                  help="config file to read (default: $ACCEL_CONFIG_FILE, else ~/.cache/accel/default_config.yaml, if it exists)")),
        (("--quiet", "-q"), dict(action="store_true", default=None, help="on failure, print only the failing rank and its exit code (no traceback)")),
        (("-m", "--module"), dict(action="store_true", default=None, help="run TRAINING_SCRIPT as a module, like `python -m`")),
        (("--no_python",), dict(action="store_true", default=None, help="run TRAINING_SCRIPT as an executable, without `python` in front")),
        (("--debug",), dict(action="store_true", default=None,
                            help="set ACCELERATE_DEBUG_MODE/ACCEL_DEBUG_MODE in the ranks (kept as is when already set) and print the full failure report")),
        (("--backend",), dict(default=None, metavar="NAME",
                              help="accel: hardware backend for the ranks (cpu, cuda, xpu, mps, hpu or a plug-in); sets ACCEL_DEVICE")),
    ]),
    ("Hardware Selection Arguments", [
        (("--cpu",), dict(action="store_true", default=False, help="run on the CPU even if a device backend is available")),
        (("--multi_gpu",), dict(action="store_true", default=False, help="one process per device of the detected device backend (needs 2 or more)")),
        (("--tpu",), dict(action="store_true", default=False, help="refused: " + _TPU)),
    ]),
    ("Resource Selection Arguments", [
        (("--mixed_precision",), dict(type=str, choices=MIXED_PRECISIONS, default=None, help="sets ACCELERATE_MIXED_PRECISION (no, fp16, bf16, fp8)")),
        (("--num_processes",), dict(type=int, default=None, metavar="N", help="total number of processes over all machines (default: one per device; 1 on cpu)")),
        (("--num_machines",), dict(type=int, default=None, metavar="N", help="number of machines (nodes)")),
        (("--num_cpu_threads_per_process",), dict(type=int, default=None, metavar="N",
                                                  help="OMP_NUM_THREADS for each rank (default: $OMP_NUM_THREADS, else usable cores / local processes)")),
        (("--enable_cpu_affinity",), dict(action="store_true", default=False, help="pin each rank to its NUMA-local cores (ACCELERATE_CPU_AFFINITY=1)")),
        (("--dynamo_backend",), dict(type=str, choices=DYNAMO_CHOICES, default=None,
                                     help="torch.compile backend (ACCELERATE_DYNAMO_BACKEND); no: do not compile")),
        (("--dynamo_mode",), dict(type=str, default="default", choices=("default", "reduce-overhead", "max-autotune"), help="torch.compile mode")),
        (("--dynamo_use_fullgraph",), dict(action="store_true", default=False, help="torch.compile with fullgraph=True")),
        (("--dynamo_use_dynamic",), dict(action="store_true", default=False, help="torch.compile with dynamic shapes")),
        (("--dynamo_use_regional_compilation",), dict(action="store_true", default=False, help="compile repeated blocks once (regional compilation)")),
    ]),
    ("Training Paradigm Arguments", [
        (("--use_deepspeed",), dict(action="store_true", default=False, help="train with DeepSpeed (ACCELERATE_USE_DEEPSPEED and the options below)")),
        (("--use_fsdp",), dict(action="store_true", default=False, help="train with FSDP (ACCELERATE_USE_FSDP and the FSDP options below)")),
        (("--use_parallelism_config",), dict(action="store_true", default=False, help="pass the ParallelismConfig options (needs --use_fsdp --fsdp_version 2)")),
        (("--use_megatron_lm",), dict(action="store_true", default=False, help="refused: " + _MEGATRON)),
    ]),
    ("Distributed GPUs", [
        (("--gpu_ids",), dict(default=None, metavar="IDS", help="devices to use, e.g. 0,1 (sets the backend's visible-devices variable)")),
        (("--same_network",), dict(action="store_true", default=False, help="multi-node: all machines share a network (static rendezvous at the main process)")),
        (("--machine_rank",), dict(type=int, default=None, metavar="RANK", help="rank of this machine, from 0")),
        (("--main_process_ip",), dict(type=str, default=None, metavar="HOST", help="address of the machine of rank 0")),
        (("--main_process_port",), dict(type=int, default=None, metavar="PORT",
                                        help="port on the machine of rank 0 (single node default: a free port; 0: pick a free one)")),
        (("-t", "--tee"), dict(default="0", type=str, help="torch elastic: tee the ranks' stdout/stderr into the log files (0 none, 1 stdout, 2 stderr, 3 both)")),
        (("--log_dir",), dict(type=str, default=None, metavar="DIR", help="torch elastic: keep the ranks' logs and error files in DIR")),
        (("--role",), dict(type=str, default="default", help="torch elastic: user-defined role of the workers")),
        (("--rdzv_backend",), dict(type=str, default="static", help="torch elastic rendezvous backend: static, c10d, etcd, etcd-v2")),
        (("--rdzv_conf",), dict(type=str, default="", metavar="K=V,...", help="extra rendezvous settings, passed to torch elastic")),
        (("--max_restarts",), dict(type=int, default=0, metavar="N", help="restarts of the whole group before failing")),
        (("--monitor_interval",), dict(type=float, default=0.1, metavar="SECONDS", help="how often the agent checks the ranks")),
        (("--hang_timeout",), dict(type=float, default=None, metavar="SECONDS",
                                   help=f"accel: end the job, with every rank's Python stack, when no rank has made progress (an "
                                        f"optimizer step, an accel collective, a checkpoint file) for SECONDS (default: "
                                        f"${HANG_TIMEOUT_ENV}, else {DEFAULT_HANG_TIMEOUT:g}; 0: never)")),
    ]),
    ("TPU", [
        (("--tpu_cluster",), dict(action="store_true", dest="tpu_use_cluster", default=False, help="refused: " + _TPU)),
        (("--no_tpu_cluster",), dict(action="store_false", dest="tpu_use_cluster", help="refused: " + _TPU)),
        (("--tpu_use_sudo",), dict(action="store_true", default=False, help="refused: " + _TPU)),
        (("--vm",), dict(type=str, action="append", help="refused: " + _TPU)),
        (("--env",), dict(type=str, action="append", metavar="NAME=VALUE",
                          help="set NAME=VALUE in every rank's environment (Accelerate: on TPU pod VMs)")),
        (("--main_training_function",), dict(type=str, default=None, metavar="NAME",
                                             help="TPU launches only (the function XLA spawns); here the script runs as __main__ (a warning says so)")),
        (("--downcast_bf16",), dict(action="store_true", default=False, help="refused: XLA-only bf16 downcast; " + _TPU)),
    ]),
    ("DeepSpeed Arguments", [
        (("--deepspeed_config_file",), dict(default=None, type=str, help="DeepSpeed json config (ACCELERATE_DEEPSPEED_CONFIG_FILE)")),
        (("--zero_stage",), dict(default=None, type=int, help="ZeRO stage 0-3 (ACCELERATE_DEEPSPEED_ZERO_STAGE)")),
        (("--offload_optimizer_device",), dict(default=None, type=str, help="none, cpu or nvme")),
        (("--offload_param_device",), dict(default=None, type=str, help="none, cpu or nvme")),
        (("--offload_optimizer_nvme_path",), dict(default=None, type=str, help="NVMe path for the offloaded optimizer")),
        (("--offload_param_nvme_path",), dict(default=None, type=str, help="NVMe path for the offloaded parameters")),
        (("--gradient_accumulation_steps",), dict(default=None, type=int, help="gradient accumulation steps (ACCELERATE_GRADIENT_ACCUMULATION_STEPS)")),
        (("--gradient_clipping",), dict(default=None, type=float, help="gradient clipping value (ACCELERATE_GRADIENT_CLIPPING)")),
        (("--zero3_init_flag",), dict(default=None, type=str, help="ZeRO-3: build large models sharded (true/false)")),
        (("--zero3_save_16bit_model",), dict(default=None, type=str, help="ZeRO-3: save 16-bit model weights (true/false)")),
        (("--deepspeed_hostfile",), dict(default=None, type=str, help="DeepSpeed hostfile for multi-node runs")),
        (("--deepspeed_exclusion_filter",), dict(default=None, type=str, help="DeepSpeed exclusion filter (multi-node)")),
        (("--deepspeed_inclusion_filter",), dict(default=None, type=str, help="DeepSpeed inclusion filter (multi-node)")),
        (("--deepspeed_multinode_launcher",), dict(default=None, type=str,
                                                   help="pdsh, standard (torch elastic), openmpi, mvapich, mpich or nossh")),
        (("--deepspeed_moe_layer_cls_names",), dict(default=None, type=str, help="comma list of MoE layer classes (ZeRO-3 leaf modules)")),
    ]),
    ("FSDP Arguments", [
        (("--fsdp_version",), dict(type=str, default="1", choices=("1", "2"), help="FSDP version (FSDP_VERSION)")),
        (("--fsdp_offload_params",), dict(default="false", type=str, help="offload parameters to the CPU (true/false)")),
        (("--fsdp_min_num_params",), dict(type=int, default=int(1e8), help="minimum parameters per wrapped module (SIZE_BASED_WRAP)")),
        (("--fsdp_sharding_strategy",), dict(type=str, default="FULL_SHARD", help="FSDP1 sharding strategy (FULL_SHARD, SHARD_GRAD_OP, ...)")),
        (("--fsdp_reshard_after_forward",), dict(type=str, default="true", help="reshard after forward (FSDP2: true/false; FSDP1: a strategy)")),
        (("--fsdp_auto_wrap_policy",), dict(type=str, default=None, help="TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP or NO_WRAP")),
        (("--fsdp_transformer_layer_cls_to_wrap",), dict(default=None, type=str, help="comma list of layer classes to wrap")),
        (("--fsdp_backward_prefetch",), dict(default=None, type=str, help="BACKWARD_PRE, BACKWARD_POST or NO_PREFETCH")),
        (("--fsdp_state_dict_type",), dict(default=None, type=str, help="FULL_STATE_DICT, SHARDED_STATE_DICT or LOCAL_STATE_DICT")),
        (("--fsdp_forward_prefetch",), dict(default="false", type=str, help="prefetch the next all-gather in forward (true/false)")),
        (("--fsdp_use_orig_params",), dict(default="true", type=str, help="FSDP1 use_orig_params (true/false)")),
        (("--fsdp_cpu_ram_efficient_loading",), dict(default="true", type=str, help="load weights on rank 0 only (needs sync_module_states)")),
        (("--fsdp_sync_module_states",), dict(default="true", type=str, help="broadcast rank 0's weights at wrap time (true/false)")),
        (("--fsdp_activation_checkpointing",), dict(default="false", type=str, help="activation checkpointing of wrapped layers (true/false)")),
        (("--fsdp_activation_checkpointing_offload",), dict(default="false", type=str, help="offload checkpointed activations to the CPU (true/false)")),
    ]),
    ("Megatron-LM Arguments", [
        ((f"--megatron_lm_{name}",), dict(default=default, type=kind, help="refused: " + _MEGATRON))
        for name, default, kind in (
            ("tp_degree", 1, int), ("use_custom_fsdp", False, bool), ("no_load_optim", False, bool),
            ("eod_mask_loss", False, bool), ("overlap_cpu_optimizer_d2h_h2d", False, bool), ("no_save_optim", False, bool),
            ("optimizer_cpu_offload", False, bool), ("use_precision_aware_optimizer", False, bool),
            ("decoder_last_pipeline_num_layers", None, int), ("pp_degree", 1, int), ("num_micro_batches", None, int),
            ("sequence_parallelism", None, str), ("recompute_activations", None, str), ("use_distributed_optimizer", None, str),
            ("gradient_clipping", 1.0, float), ("recompute_granularity", None, str), ("recompute_method", None, str),
            ("recompute_num_layers", None, int), ("attention_backend", None, str), ("expert_model_parallel_size", None, int),
            ("context_parallel_size", None, int), ("attention_dropout", None, float), ("hidden_dropout", None, float),
            ("attention_softmax_in_fp32", None, str), ("expert_tensor_parallel_size", None, int),
            ("calculate_per_token_loss", None, str), ("use_rotary_position_embeddings", None, str),
        )
    ]),
    ("FP8 Arguments", [
        (("--fp8_backend",), dict(type=str, default=None, choices=("ao", "te", "msamp"), help="FP8 backend (with --mixed_precision fp8)")),
        (("--fp8_use_autocast_during_eval",), dict(action="store_true", default=False, help="keep FP8 autocast during evaluation")),
        (("--fp8_margin",), dict(type=int, default=0, help="TE: scaling-factor margin")),
        (("--fp8_interval",), dict(type=int, default=1, help="TE: scaling-factor update interval")),
        (("--fp8_format",), dict(type=str, default="HYBRID", choices=("HYBRID", "E4M3", "E5M2"), help="FP8 format")),
        (("--fp8_amax_history_len",), dict(type=int, default=1024, help="TE: amax history length")),
        (("--fp8_amax_compute_algo",), dict(type=str, default="most_recent", choices=("max", "most_recent"), help="TE: amax algorithm")),
        (("--fp8_override_linear_precision",), dict(type=_triple, default=(False, False, False),
                                                    help="TE: higher precision for fprop, dgrad, wgrad, e.g. (false, false, true)")),
        (("--fp8_opt_level",), dict(type=str, default="O2", choices=("O1", "O2"), help="MS-AMP optimisation level")),
        (("--fp8_enable_fsdp_float8_all_gather",), dict(type=_bool_text, default=True, help="torchao: FP8 all-gather under FSDP2")),
        (("--fp8_pad_inner_dim",), dict(type=_bool_text, default=True, help="torchao: pad the inner dimension for FP8 GEMMs")),
    ]),
    ("AWS Arguments", [
        (("--aws_access_key_id",), dict(type=str, default=None, help="refused: " + _SAGEMAKER)),
        (("--aws_secret_access_key",), dict(type=str, default=None, help="refused: " + _SAGEMAKER)),
    ]),
    ("MPI Arguments", [
        (("--mpirun_hostfile",), dict(type=str, default=None, help="launch through mpirun with this hostfile (Intel MPI, Open MPI or MVAPICH)")),
    ]),
    ("ParallelismConfig Arguments", [
        (("--parallelism_config_dp_replicate_size",), dict(type=int, default=1, help="data-parallel replicate size")),
        (("--parallelism_config_dp_shard_size",), dict(type=int, default=1, help="data-parallel shard size")),
        (("--parallelism_config_tp_size",), dict(type=int, default=1, help="tensor-parallel size")),
        (("--parallelism_config_cp_size",), dict(type=int, default=1, help="context-parallel size")),
        (("--parallelism_config_cp_backend",), dict(type=str, default="torch", choices=("torch",), help="context-parallel backend")),
        (("--parallelism_config_cp_comm_strategy",), dict(type=str, default="allgather", help="context-parallel communication: allgather or alltoall")),
        (("--parallelism_config_sp_size",), dict(type=int, default=1, help="sequence-parallel size")),
        (("--parallelism_config_sp_backend",), dict(type=str, default="deepspeed", choices=("deepspeed",), help="sequence-parallel backend")),
        (("--parallelism_config_sp_seq_length",), dict(type=str, default=None, help="sequence length when every batch has the same one")),
        (("--parallelism_config_sp_seq_length_is_variable",), dict(type=bool, default=True, help="sequence length changes between batches")),
        (("--parallelism_config_sp_attn_implementation",), dict(type=str, default="sdpa", help="attention implementation (sdpa, flash_attention_2, ...)")),
    ]),
]

#: options refused when given (by flag or config): dest -> (flag, reason)
for _title, _options in LAUNCH_OPTIONS:
    for _flags, _kw in _options:
        if str(_kw.get("help", "")).startswith("refused: "):
            _dest = _kw.get("dest") or [f for f in _flags if f.startswith("--")][0].lstrip("-")
            REFUSED.setdefault(_dest, _kw["help"][len("refused: "):])
REFUSED.update({"tpu_use_cluster": _TPU, "aws_access_key_id": _SAGEMAKER, "aws_secret_access_key": _SAGEMAKER})
_REFUSED_FLAG = {"tpu_use_cluster": "--tpu_cluster"}


# ---------------------------------------------------------------------------- the parser
def _note_given(namespace: argparse.Namespace, dest: str) -> None:
    given = getattr(namespace, "nondefault", None)
    if given is None:
        given = set()
        namespace.nondefault = given
    given.add(dest)


class _Store(argparse._StoreAction):
    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        super().__call__(parser, namespace, values, option_string)
        _note_given(namespace, self.dest)


class _StoreTrue(argparse._StoreTrueAction):
    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        super().__call__(parser, namespace, values, option_string)
        _note_given(namespace, self.dest)


class _StoreFalse(argparse._StoreFalseAction):
    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        super().__call__(parser, namespace, values, option_string)
        _note_given(namespace, self.dest)


class _Append(argparse._AppendAction):
    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        super().__call__(parser, namespace, values, option_string)
        _note_given(namespace, self.dest)


_ACTIONS = {"store_true": _StoreTrue, "store_false": _StoreFalse, "append": _Append, None: _Store}


class HideDashedAliasesFormatter(argparse.HelpFormatter):
    """Help that lists ``--num_processes`` but not its ``--num-processes`` alias (both are accepted)."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if action.option_strings:
            shown = [s for s in action.option_strings if not (s.startswith("--") and "-" in s[2:])]
            if shown and len(shown) != len(action.option_strings):
                action = copy.copy(action)
                action.option_strings = shown
        return super()._format_action_invocation(action)


def option_dest(flags: tuple[str, ...], kwargs: dict[str, Any]) -> str:
    """The namespace attribute an option of :data:`LAUNCH_OPTIONS` sets (argparse's rule: the first long flag)."""
    if kwargs.get("dest"):
        return str(kwargs["dest"])
    long = [f for f in flags if f.startswith("--")]
    return (long[0] if long else flags[0]).lstrip("-").replace("-", "_")


def _with_aliases(flags: tuple[str, ...]) -> list[str]:
    out: list[str] = []
    for flag in flags:
        out.append(flag)
        if flag.startswith("--") and "_" in flag[2:]:
            out.append("--" + flag[2:].replace("_", "-"))
    return out


def add_launch_options(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """Every option of `accelerate launch` (no script), grouped as Accelerate groups them; shared with
    `accel test`, which launches its own script (``skip`` leaves out options it does not take)."""
    parser.formatter_class = HideDashedAliasesFormatter
    for title, options in LAUNCH_OPTIONS:
        container: Any = parser if title is None else parser.add_argument_group(title)
        for flags, kwargs in options:
            kwargs = dict(kwargs)
            if option_dest(flags, kwargs) in skip:
                continue
            kwargs["action"] = _ACTIONS[kwargs.get("action")]
            container.add_argument(*_with_aliases(flags), **kwargs)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`accel launch`'s options, the script and the script's own arguments."""
    parser.description = (
        "Start a script in several processes (torch elastic underneath), taking every `accelerate launch` option. "
        "Flags override the config file, which overrides the defaults. Options may be spelled --num_processes or "
        "--num-processes."
    )
    add_launch_options(parser)
    parser.add_argument("training_script", metavar="TRAINING_SCRIPT",
                        help="the script (or module with -m) to run, followed by its own arguments")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER, metavar="...",
                        help="arguments for the script, passed through unchanged")


def launch_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Accelerate's entry point: the `launch` parser (added to ``subparsers`` when given); the parsed
    namespace's ``func`` is :func:`launch_command`."""
    if subparsers is not None:
        parser = subparsers.add_parser("launch", help="run a script in several processes", allow_abbrev=False)
    else:
        parser = argparse.ArgumentParser("accel launch", allow_abbrev=False, formatter_class=HideDashedAliasesFormatter)
    add_arguments(parser)
    parser.set_defaults(func=launch_command)
    return parser


def launch_command(args: argparse.Namespace) -> None:
    """Accelerate's entry point: validate ``args`` and run the launch; raises on a usage mistake
    (UsageError, a ValueError) and exits with the failing rank's exit code when a rank fails."""
    code = run(args)
    if code:
        raise SystemExit(code)


# ---------------------------------------------------------------------------- config file + flags
def _given(args: argparse.Namespace) -> set[str]:
    return set(getattr(args, "nondefault", None) or ())


def _load_defaults(args: argparse.Namespace) -> Any:
    """The config file as Accelerate's dataclass (None when there is none); errors name the file."""
    from accel.commands.config.config_args import load_config_from_file
    from accel.commands.config_file import CONFIG_ENV, ConfigError, default_config_path

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
    if defaults is not None and str(getattr(defaults.compute_environment, "value", defaults.compute_environment)) == "AMAZON_SAGEMAKER":
        raise UsageError(f"compute_environment AMAZON_SAGEMAKER (config file {args.config_file or 'default'}) cannot run here: {_SAGEMAKER}")
    if getattr(args, "tpu", False) and "tpu" not in given:
        raise UsageError(f"distributed_type XLA (config file) cannot run here: {_TPU}")
    if getattr(args, "use_megatron_lm", False) and "use_megatron_lm" not in given:
        raise UsageError(f"distributed_type MEGATRON_LM (config file) cannot run here: {_MEGATRON}")
    for dest in sorted(given):
        if dest in REFUSED:
            flag = _REFUSED_FLAG.get(dest, "--" + dest)
            raise UsageError(f"{flag} cannot be used with accel launch: {REFUSED[dest]}")


# ---------------------------------------------------------------------------- the plan
@dataclass
class LaunchPlan:
    """Everything decided before starting: torchrun's arguments and the environment for the ranks
    (or, for mpirun and DeepSpeed's multi-node runner, the command to run instead)."""

    backend: str
    comm_backend: str | None
    num_machines: int
    machine_rank: int
    nproc_per_node: int
    mixed_precision: str
    debug: bool
    endpoint: str
    torchrun_args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    #: a command run instead of torch elastic (mpirun, DeepSpeed's multi-node runner)
    command: list[str] | None = None
    log_dir: str | None = None
    quiet: bool = False
    #: seconds without progress before the job is ended as hung (0: never)
    hang_timeout: float = DEFAULT_HANG_TIMEOUT
    #: torch elastic's rendezvous backend (the nodes swap failure evidence through the static one's store)
    rdzv_backend: str = "static"

    @property
    def num_processes(self) -> int:
        return self.nproc_per_node * self.num_machines


def run(args: argparse.Namespace) -> int:
    """`accel launch`: build the plan (all checks) and run it; the exit code."""
    plan = build_plan(args)
    if not plan.quiet:
        for warning in plan.warnings:
            print(f"accel launch: warning: {warning}", file=sys.stderr)
    return execute(plan)


def build_plan(args: argparse.Namespace) -> LaunchPlan:
    """Resolve flags > config file > defaults and check everything; UsageError on any mistake."""
    from accel.utils.launch import launch_env

    target, no_python, module = _check_target(args)  # first: the cheapest check and the commonest slip
    args, defaults, mp_from_config = _validate_launch_command(args)
    _refusals(args, defaults)
    warnings: list[str] = []
    where = f" (config file {args.config_file or _config_path_text()})" if defaults is not None else ""

    backend = _resolve_backend(args, where, warnings)
    comm = _comm_backend(backend)

    num_machines, machine_rank = args.num_machines, args.machine_rank or 0
    if num_machines < 1:
        raise UsageError(f"--num_machines must be at least 1, got {num_machines}")
    if not 0 <= machine_rank < num_machines:
        raise UsageError(f"--machine_rank must be from 0 to num_machines - 1 ({num_machines - 1}), got {machine_rank}")
    args.machine_rank = machine_rank

    gpu_ids = _gpu_ids(args.gpu_ids) if args.gpu_ids is not None else None
    specific_ids = gpu_ids.split(",") if gpu_ids not in (None, "all") else None
    args.gpu_ids = gpu_ids
    if args.multi_gpu and specific_ids and len(specific_ids) < 2 and num_machines <= 1:
        raise UsageError("--multi_gpu with fewer than two --gpu_ids: list at least two devices, or use --gpu_ids all")

    num_processes = args.num_processes
    if num_processes is None:
        if specific_ids:
            per_machine = len(specific_ids)
        elif comm is not None and backend.device_type != "cpu":
            per_machine = max(backend.device_count(), 1)
        else:
            per_machine = 1
        num_processes = per_machine * num_machines
    if num_processes < 1:
        raise UsageError(f"--num_processes must be at least 1, got {num_processes}")
    if num_processes % num_machines:
        raise UsageError(f"--num_processes ({num_processes}) is the total over all machines and must be a multiple of --num_machines ({num_machines})")
    args.num_processes = num_processes
    nproc_per_node = num_processes // num_machines
    if num_processes > 1 and comm is None:
        reason = backend.comm_backend_reason() or "it has no collective backend"
        raise UsageError(f"backend {backend.name!r} cannot run {num_processes} processes: {reason}")

    main_ip, port = args.main_process_ip, args.main_process_port
    if port is not None and not 0 <= port <= 65535:
        raise UsageError(f"--main_process_port must be from 0 to 65535, got {port}")
    if num_machines > 1 and not main_ip:
        raise UsageError(f"--num_machines {num_machines} needs --main_process_ip (the address of the machine of rank 0)")

    from accel.commands.config_file import RDZV_BACKENDS

    if args.rdzv_backend not in RDZV_BACKENDS:
        raise UsageError(f"--rdzv_backend must be one of {', '.join(RDZV_BACKENDS)}, got {args.rdzv_backend!r}")
    if args.max_restarts < 0:
        raise UsageError(f"--max_restarts must be 0 or more, got {args.max_restarts}")
    if not args.monitor_interval > 0:
        raise UsageError(f"--monitor_interval must be above 0 seconds, got {args.monitor_interval}")
    hang_timeout = _hang_timeout(getattr(args, "hang_timeout", None))
    threads = args.num_cpu_threads_per_process
    if threads is not None and threads < 1:
        raise UsageError(f"--num_cpu_threads_per_process must be at least 1, got {threads}")
    if args.use_deepspeed:
        import importlib.util

        if importlib.util.find_spec("deepspeed") is None:
            raise UsageError("--use_deepspeed needs DeepSpeed: pip install deepspeed")
        args.deepspeed_fields_from_accelerate_config = ",".join(
            [*(getattr(defaults, "deepspeed_config", None) or {}), *(["mixed_precision"] if mp_from_config else [])])
    if args.mixed_precision == "fp8" and args.use_deepspeed is False and args.fp8_backend is None:
        warnings.append("mixed precision fp8 without --fp8_backend: the library picks one that is installed")
    if "main_training_function" in _given(args):
        warnings.append("--main_training_function applies to TPU launches only; the script runs as __main__")
    warnings += _precision_warnings(backend, args.mixed_precision)

    # ---- environment of the ranks: Accelerate's variables, then accel's own
    try:
        env = launch_env(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    env["ACCEL_USE_CPU"] = "true" if backend.name == "cpu" else "false"
    env["ACCELERATE_USE_CPU"] = str(backend.name == "cpu")
    if _backend_was_chosen(args):
        env["ACCEL_DEVICE"] = backend.name
    if threads is None:
        env.pop("OMP_NUM_THREADS", None)
        if not os.environ.get("OMP_NUM_THREADS"):
            env["OMP_NUM_THREADS"] = str(max(_usable_cores() // nproc_per_node, 1))
    visible_vars = _visible_devices_variables()
    for name in [n for n in env if n.endswith("_VISIBLE_DEVICES") or n in visible_vars]:
        del env[name]  # set below from the chosen backend, not the detected one
    if specific_ids:
        if backend.visible_devices_env:
            env[backend.visible_devices_env] = ",".join(specific_ids)
            if len(specific_ids) < nproc_per_node:
                warnings.append(f"--gpu_ids {gpu_ids} lists {len(specific_ids)} device(s) for {nproc_per_node} processes per machine: ranks will share devices")
        else:
            warnings.append(f"--gpu_ids {gpu_ids} is ignored: backend {backend.name!r} has no visible-devices variable")
    if backend.name == "cpu":  # Intel OpenMP pinning, as Accelerate's CPU launch sets it; a user's own setting wins
        for name, value in (("KMP_AFFINITY", "granularity=fine,compact,1,0"), ("KMP_BLOCKTIME", "1")):
            if name not in os.environ:
                env[name] = value
    for item in args.env or []:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--env expects NAME=VALUE, got {item!r}")
        env[name] = value

    # ---- rendezvous
    if num_machines == 1:
        host = main_ip or "127.0.0.1"
        if not port:
            port = _free_port(host)
        elif _port_in_use(host, port):
            raise UsageError(f"port {port} on {host} is in use; choose another --main_process_port, or leave it out to get a free one")
        if comm == "gloo" and "GLOO_SOCKET_IFNAME" not in os.environ and _is_loopback(host):
            iface = loopback_interface()
            if iface:
                env["GLOO_SOCKET_IFNAME"] = iface
    else:
        host = main_ip
        port = port or DEFAULT_PORT

    targs = [
        "--nnodes", str(num_machines),
        "--nproc-per-node", str(nproc_per_node),
        "--node-rank", str(machine_rank),
        "--rdzv-backend", args.rdzv_backend,
        "--max-restarts", str(args.max_restarts),
        "--monitor-interval", str(args.monitor_interval),
        "--role", str(args.role),
    ]
    if str(args.tee) not in ("0", ""):
        targs += ["--tee", str(args.tee)]
    if args.rdzv_backend == "static" and (num_machines == 1 or args.same_network):
        targs += ["--master-addr", host, "--master-port", str(port)]
    else:
        targs += ["--rdzv-endpoint", f"{host}:{port}"]
        if num_machines == 1:
            import uuid

            targs += ["--rdzv-id", uuid.uuid4().hex]
    if args.rdzv_conf:
        targs += ["--rdzv-conf", args.rdzv_conf]
    if no_python:
        targs += ["--no-python", target]
    else:
        # every rank runs this module's bootstrap, which runs the target and records its errors
        targs += ["--module", BOOTSTRAP_MODULE] + (["--module"] if module else []) + [target]
    targs += list(args.training_script_args)

    command = _other_launcher(args, env, host, port)
    return LaunchPlan(
        backend=backend.name,
        comm_backend=comm,
        num_machines=num_machines,
        machine_rank=machine_rank,
        nproc_per_node=nproc_per_node,
        mixed_precision=args.mixed_precision,
        debug=bool(args.debug) or _env_debug(),
        endpoint=f"{host}:{port}",
        torchrun_args=targs,
        env=env,
        warnings=warnings,
        command=command,
        log_dir=args.log_dir,
        quiet=bool(args.quiet),
        hang_timeout=hang_timeout,
        rdzv_backend=args.rdzv_backend,
    )


def _hang_timeout(value: Any) -> float:
    """--hang_timeout, else $ACCEL_HANG_TIMEOUT, else the default; a negative or unreadable value is a usage error."""
    where = "--hang_timeout"
    if value is None:
        text = os.environ.get(HANG_TIMEOUT_ENV, "").strip()
        if not text:
            return DEFAULT_HANG_TIMEOUT
        where = HANG_TIMEOUT_ENV
        try:
            value = float(text)
        except ValueError:
            raise UsageError(f"{HANG_TIMEOUT_ENV} must be a number of seconds, got {text!r}") from None
    if not value >= 0:
        raise UsageError(f"{where} must be 0 (never) or more seconds, got {value}")
    return float(value)


def _other_launcher(args: argparse.Namespace, env: dict[str, str], host: str, port: int) -> list[str] | None:
    """mpirun (``--mpirun_hostfile``) or DeepSpeed's multi-node runner, as Accelerate picks them; else None."""
    from accel.utils import launch as launch_utils

    if args.mpirun_hostfile is not None:
        probe = copy.copy(args)
        try:
            cmd, _ = launch_utils.prepare_simple_launcher_cmd_env(probe)
        except OSError as exc:
            raise UsageError(f"--mpirun_hostfile: {exc}") from None
        env.setdefault("MASTER_ADDR", host)
        env.setdefault("MASTER_PORT", str(port))
        return cmd
    if args.use_deepspeed and args.num_machines > 1 and (args.deepspeed_multinode_launcher or "pdsh") != "standard":
        if args.deepspeed_multinode_launcher not in (None, *launch_utils.DEEPSPEED_MULTINODE_LAUNCHERS):
            raise UsageError(f"--deepspeed_multinode_launcher must be one of {', '.join(launch_utils.DEEPSPEED_MULTINODE_LAUNCHERS)}, "
                             f"got {args.deepspeed_multinode_launcher!r}")
        probe = copy.copy(args)
        probe.main_process_port = port
        cmd, ds_env = launch_utils.prepare_deepspeed_cmd_env(probe)
        env["PYTHONPATH"] = ds_env["PYTHONPATH"]
        return cmd
    return None


def _env_debug() -> bool:
    return any(os.environ.get(n, "").strip().lower() in ("1", "true", "yes", "on") for n in ("ACCEL_DEBUG_MODE", "ACCELERATE_DEBUG_MODE"))


def _config_path_text() -> str:
    from accel.commands.config_file import default_config_path

    return str(default_config_path())


def _backend_was_chosen(args: argparse.Namespace) -> bool:
    return getattr(args, "backend_source", "detection") != "detection" or bool(
        args.cpu or args.backend or getattr(args, "use_cpu", False) or args.distributed_type_from_config == "MULTI_CPU")


def _resolve_backend(args: argparse.Namespace, where: str, notes: list[str] | None = None) -> Any:
    """The hardware backend by the one precedence rule (:mod:`accel.utils.precedence`): --cpu/--backend,
    else ``ACCEL_DEVICE``, else the config's use_cpu/backend, else detection. When the environment and
    the config file disagree, ``notes`` gets a line saying which was used and why."""
    from accel.backends import OVERRIDE_ENV, BackendUnavailableError, UnknownBackendError, get_backend
    from accel.utils.precedence import choose

    given = _given(args)
    cli_name = args.backend.strip().lower() if args.backend and "backend" in given else None
    config_name = args.backend.strip().lower() if args.backend and "backend" not in given else None
    if args.cpu and cli_name not in (None, "cpu"):
        raise UsageError(f"--cpu contradicts --backend {args.backend}")
    use_cpu = bool(getattr(args, "use_cpu", False))
    if use_cpu and config_name not in (None, "cpu"):
        raise UsageError(f"use_cpu: true contradicts backend: {config_name}{where}")
    if use_cpu or args.distributed_type_from_config == "MULTI_CPU":
        config_name = config_name or "cpu"
    env_name = (os.environ.get(OVERRIDE_ENV) or "").strip().lower() or None
    choice = choose("backend", flag="cpu" if args.cpu else cli_name, environment=(OVERRIDE_ENV, env_name),
                    config=(where.strip(" ()").removeprefix("config file ") or "in use", config_name))
    if choice.note and notes is not None:
        notes.append(choice.describe("backend"))
    args.backend_source = choice.source
    try:
        backend = get_backend(choice.value)
    except (UnknownBackendError, BackendUnavailableError) as exc:
        raise UsageError(f"{exc} (the backend came from {choice.origin})" if choice.source != "detection" else str(exc)) from None
    if args.multi_gpu and backend.device_type == "cpu" and "multi_gpu" in given:
        raise UsageError("--multi_gpu asks for a device backend, but the selected backend is cpu (see `accel env`)")
    return backend


def _visible_devices_variables() -> set[str]:
    """Every registered backend's visible-devices variable (one table: the backends themselves)."""
    from accel.backends import get_registry

    return {b.visible_devices_env for b in get_registry().probe_order() if getattr(b, "visible_devices_env", None)}


def _comm_backend(backend: Any) -> str | None:
    try:
        return backend.comm_backend
    except Exception as exc:  # e.g. ACCEL_CPU_COMM_BACKEND names a backend that is not installed
        raise UsageError(f"backend {backend.name!r}: {exc}") from None


def _gpu_ids(text: Any) -> str | None:
    from accel.commands.config_file import FIELDS

    try:
        return FIELDS["gpu_ids"](text)
    except ValueError as exc:
        raise UsageError(f"--gpu_ids: {exc}") from None


def _check_target(args: argparse.Namespace) -> tuple[str, bool, bool]:
    target: str = args.training_script
    module, no_python = bool(args.module), bool(args.no_python)
    if module and no_python:
        raise UsageError("--module and --no_python cannot be used together")
    if module:
        if not target or target.startswith("-"):
            raise UsageError(f"--module needs a module name, got {target!r}")
        return target, False, True
    if no_python:
        if not (os.path.isfile(target) or shutil.which(target)):
            raise UsageError(f"executable not found: {target}")
        return target, True, False
    if os.path.isdir(target):
        raise UsageError(f"training script is a directory, not a file: {target} (use -m to run a package)")
    if not os.path.isfile(target):
        raise UsageError(f"training script not found: {target}")
    return target, False, False


def _precision_warnings(backend: Any, mixed_precision: str) -> list[str]:
    """Warn (not fail) when the backend says it cannot run ``mixed_precision``.

    Only host (cpu) backends are asked here: a device backend's probe runs a kernel on device 0,
    which would leave a device context (memory, and a runtime that cannot fork) in this launcher
    for the whole run; the ranks check on their own devices.
    """
    if mixed_precision == "no" or backend.device_type != "cpu":
        return []
    try:
        capability = {
            "fp16": lambda: backend.supports_fp16_amp,
            "bf16": lambda: backend.supports_bf16_amp,
            "fp8": lambda: backend.supports_fp8,
        }[mixed_precision]()
    except Exception as exc:
        return [f"could not check {mixed_precision} support on backend {backend.name!r}: {type(exc).__name__}: {exc}"]
    if capability:
        return []
    return [f"mixed precision {mixed_precision} may not work on backend {backend.name!r}: {capability.reason}"]


def _usable_cores() -> int:
    affinity = getattr(os, "sched_getaffinity", None)
    try:
        return len(affinity(0)) if affinity else (os.cpu_count() or 1)
    except OSError:
        return os.cpu_count() or 1


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, 0))
        except OSError:
            sock.bind(("", 0))
        return int(sock.getsockname()[1])


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def _is_loopback(host: str) -> bool:
    try:
        return socket.gethostbyname(host).startswith("127.")
    except OSError:
        return False


def loopback_interface() -> str | None:
    """Name of the network interface that carries 127.0.0.1 (``lo`` on Linux, ``lo0`` on macOS)."""
    try:
        import psutil

        for name, addresses in psutil.net_if_addrs().items():
            if any(a.family == socket.AF_INET and str(a.address).startswith("127.") for a in addresses):
                return name
    except Exception:
        return None
    return None
