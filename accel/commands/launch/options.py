"""`accel launch`'s options: Accelerate's table of flags with its defaults, the options refused here and why,
and the parser built from them (which also notes which options were given on the command line)."""

from __future__ import annotations

import argparse
import copy
from typing import Any

from accel.facts.environment import parse_bool
from accel.facts.precision import PRECISIONS
from accel.launch.plan import DEFAULT_HANG_TIMEOUT

HANG_TIMEOUT_ENV = "ACCEL_HANG_TIMEOUT"

MIXED_PRECISIONS = PRECISIONS
DYNAMO_CHOICES = ("no", "eager", "aot_eager", "inductor", "aot_ts_nvfuser", "nvprims_nvfuser", "cudagraphs", "ofi",
                  "fx2trt", "onnxrt", "tensorrt", "aot_torchxla_trace_once", "torhchxla_trace_once", "tvm")


def _bool_text(text: str) -> bool:
    """A yes/no option value (accel's one truth parser), as argparse wants its errors."""
    try:
        return parse_bool(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}") from None


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
_SAGEMAKER = "the AWS keys apply only to a SageMaker launch (a config file whose compute_environment is AMAZON_SAGEMAKER)"
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


def _given(args: argparse.Namespace) -> set[str]:
    """The options given on the command line (not left at their defaults)."""
    return set(getattr(args, "nondefault", None) or ())
