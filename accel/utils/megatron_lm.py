"""Megatron-LM names with Accelerate's module path (``accelerate.utils.megatron_lm``).

The plugin (:class:`MegatronLMPlugin`) is a complete configuration object: it reads its
``ACCELERATE_MEGATRON_LM_*`` defaults from the environment and derives Megatron's argument
dictionary from a model's config, the optimizer and the scheduler, as Accelerate's does. Training
*through* Megatron-LM needs megatron-core and CUDA devices, and accel has no Megatron engine: the
train-step classes and the data-loader hooks that would drive Megatron say so when used.
"""

from __future__ import annotations

import functools
import os
import warnings
from abc import ABC
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from .environment import str_to_bool

__all__ = [
    "AbstractTrainStep", "BertTrainStep", "GPTTrainStep", "MODEL_CONFIGS_TO_MEGATRON_PARSERS", "MegatronLMDummyDataLoader",
    "MegatronLMDummyScheduler", "MegatronLMPlugin", "T5TrainStep", "add_model_config_to_megatron_parser",
    "avg_losses_across_data_parallel_group", "megatron_lm_missing", "megatron_lm_refusal", "parse_bert_config", "parse_glm4_moe_config", "parse_gpt2_config",
    "parse_llama_config", "parse_t5_config",
]

_ENV_PREFIX = "ACCELERATE_MEGATRON_LM_"


def megatron_lm_missing() -> list[str]:
    """What training through Megatron-LM needs and this environment lacks, each with its reason (empty: nothing).

    Accelerate's Megatron-LM integration imports ``megatron.core`` (the ``megatron-core`` package) and
    also ``megatron.training`` and ``megatron.legacy``, which only the Megatron-LM repository has (the
    PyPI wheel ships ``megatron.core`` alone); Megatron-LM's initialisation and fused kernels need CUDA
    devices; and accel has no Megatron engine (its prepare/step/checkpoint path).
    """
    import importlib.util

    missing = []

    def found(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            return False

    if not found("megatron.core"):
        missing.append("megatron.core: pip install megatron-core")
    if not found("megatron.training") or not found("megatron.legacy"):
        missing.append("megatron.training and megatron.legacy: only in the Megatron-LM repository (the megatron-core "
                       "wheel has megatron.core alone); install Megatron-LM from its source")
    from ..backends import get_registry

    registry = get_registry()
    if "cuda" not in registry.names() or not registry.get("cuda").is_available():
        missing.append("a CUDA device: Megatron-LM's initialisation and fused kernels (apex, Transformer Engine) run on CUDA")
    missing.append("an engine in accel that drives Megatron-LM's model, optimizer and schedules (use DeepSpeed or FSDP "
                   "with ParallelismConfig for model parallelism)")
    return missing


def megatron_lm_refusal(what: str = "MegatronLMPlugin") -> NotImplementedError:
    """The error for using Megatron-LM here, naming everything that is missing (for ``AcceleratorState``)."""
    return NotImplementedError(f"{what} drives Megatron-LM training, which cannot run here; missing: "
                               + "; ".join(megatron_lm_missing()))


def _no_megatron(what: str) -> RuntimeError:
    return RuntimeError(str(megatron_lm_refusal(what)))


# ------------------------------------------------------------------------------------ environment defaults
# field -> (environment suffix, parser, default); the plugin reads each unset field from the environment
def _flag(value: str) -> bool:
    return str_to_bool(value) == 1


_ENV_DEFAULTS: dict[str, tuple[str, Callable[[str], Any], str]] = {
    "tp_degree": ("TP_DEGREE", int, "1"),
    "pp_degree": ("PP_DEGREE", int, "1"),
    "use_custom_fsdp": ("USE_CUSTOM_FSDP", _flag, "False"),
    "no_load_optim": ("NO_LOAD_OPTIM", _flag, "False"),
    "eod_mask_loss": ("EOD_MASK_LOSS", _flag, "False"),
    "no_save_optim": ("NO_SAVE_OPTIM", _flag, "False"),
    "optimizer_cpu_offload": ("OPTIMIZER_CPU_OFFLOAD", _flag, "False"),
    "overlap_cpu_optimizer_d2h_h2d": ("OVERLAP_CPU_OPTIMIZER_D2H_H2D", _flag, "False"),
    "use_precision_aware_optimizer": ("USE_PRECISION_AWARE_OPTIMIZER", _flag, "False"),
    "num_micro_batches": ("NUM_MICRO_BATCHES", int, "1"),
    "gradient_clipping": ("GRADIENT_CLIPPING", float, "1.0"),
    "recompute_activations": ("RECOMPUTE_ACTIVATIONS", _flag, "False"),
    "use_distributed_optimizer": ("USE_DISTRIBUTED_OPTIMIZER", _flag, "False"),
    "sequence_parallelism": ("SEQUENCE_PARALLELISM", _flag, "False"),
    "recompute_granularity": ("RECOMPUTE_GRANULARITY", str, "full"),
    "recompute_method": ("RECOMPUTE_METHOD", str, "uniform"),
    "recompute_num_layers": ("RECOMPUTE_NUM_LAYERS", int, "1"),
    "attention_backend": ("ATTENTION_BACKEND", _flag, "True"),
    "expert_model_parallel_size": ("EXPERT_MODEL_PARALLEL_SIZE", int, "1"),
    "context_parallel_size": ("CONTEXT_PARALLEL_SIZE", int, "2"),
    "attention_dropout": ("ATTENTION_DROPOUT", float, "0.0"),
    "hidden_dropout": ("HIDDEN_DROPOUT", float, "0.0"),
    "attention_softmax_in_fp32": ("ATTENTION_SOFTMAX_IN_FP32", _flag, "True"),
    "expert_tensor_parallel_size": ("EXPERT_TENSOR_PARALLEL_SIZE", int, "1"),
    "calculate_per_token_loss": ("CALCULATE_PER_TOKEN_LOSS", _flag, "True"),
    "use_rotary_position_embeddings": ("USE_ROTARY_POSITION_EMBEDDINGS", _flag, "True"),
}

# plugin field -> Megatron argument name, for the arguments copied verbatim into megatron_lm_default_args
_MEGATRON_ARGS = {
    "tp_degree": "tensor_model_parallel_size", "pp_degree": "pipeline_model_parallel_size",
    "pipeline_model_parallel_split_rank": "pipeline_model_parallel_split_rank",
    "num_layers_per_virtual_pipeline_stage": "num_layers_per_virtual_pipeline_stage",
    "use_distributed_optimizer": "use_distributed_optimizer", "sequence_parallelism": "sequence_parallel",
    "gradient_clipping": "clip_grad", "num_micro_batches": "num_micro_batches", "consumed_samples": "consumed_samples",
    "no_wd_decay_cond": "no_wd_decay_cond", "scale_lr_cond": "scale_lr_cond", "lr_mult": "lr_mult",
    "megatron_dataset_flag": "megatron_dataset_flag", "eval_iters": "eval_iters", "eval_interval": "eval_interval",
    **{name: name for name in (
        "use_custom_fsdp", "no_load_optim", "eod_mask_loss", "no_save_optim", "optimizer_cpu_offload",
        "overlap_cpu_optimizer_d2h_h2d", "use_precision_aware_optimizer", "decoder_last_pipeline_num_layers",
        "recompute_granularity", "recompute_method", "recompute_num_layers", "attention_backend",
        "expert_model_parallel_size", "context_parallel_size", "attention_dropout", "hidden_dropout",
        "attention_softmax_in_fp32", "expert_tensor_parallel_size", "calculate_per_token_loss",
        "use_rotary_position_embeddings")},
}

#: model type (a substring of ``model.config.model_type``) -> parser filling the network-size arguments
MODEL_CONFIGS_TO_MEGATRON_PARSERS: dict[str, Callable[..., None]] = {}


@dataclass
class MegatronLMPlugin:
    """Megatron-LM settings (parallel degrees, recomputation, schedules) with Accelerate's fields.

    Unset fields come from ``ACCELERATE_MEGATRON_LM_*``; ``megatron_lm_default_args`` is the argument
    dictionary Megatron would be initialised with, completed by the ``set_*`` methods.
    """

    tp_degree: int = None
    pp_degree: int = None
    use_custom_fsdp: bool = None
    overlap_cpu_optimizer_d2h_h2d: bool = None
    no_load_optim: bool = None
    eod_mask_loss: bool = None
    no_save_optim: bool = None
    optimizer_cpu_offload: bool = None
    use_precision_aware_optimizer: bool = None
    decoder_last_pipeline_num_layers: int = None
    recompute_granularity: str = None
    recompute_method: str = None
    recompute_num_layers: int = None
    attention_backend: bool = None
    expert_model_parallel_size: int = None
    context_parallel_size: int = None
    attention_dropout: float = None
    hidden_dropout: float = None
    attention_softmax_in_fp32: bool = None
    expert_tensor_parallel_size: int = None
    calculate_per_token_loss: bool = None
    use_rotary_position_embeddings: bool = None
    num_micro_batches: int = None
    gradient_clipping: float = None
    sequence_parallelism: bool = None
    recompute_activations: bool = None
    use_distributed_optimizer: bool = None
    pipeline_model_parallel_split_rank: int = None
    num_layers_per_virtual_pipeline_stage: int = None
    is_train_batch_min: str = True
    train_iters: int = None
    train_samples: int = None
    weight_decay_incr_style: str = "constant"
    start_weight_decay: float = None
    end_weight_decay: float = None
    lr_decay_style: str = "linear"
    lr_decay_iters: int = None
    lr_decay_samples: int = None
    lr_warmup_iters: int = None
    lr_warmup_samples: int = None
    lr_warmup_fraction: float = None
    min_lr: float = 0
    consumed_samples: list[int] = None
    no_wd_decay_cond: Optional[Callable] = None
    scale_lr_cond: Optional[Callable] = None
    lr_mult: float = 1.0
    megatron_dataset_flag: bool = False
    seq_length: int = None
    encoder_seq_length: int = None
    decoder_seq_length: int = None
    tensorboard_dir: str = None
    set_all_logging_options: bool = False
    eval_iters: int = 100
    eval_interval: int = 1000
    return_logits: bool = False
    custom_train_step_class: Optional[Any] = None
    custom_train_step_kwargs: Optional[dict[str, Any]] = None
    custom_model_provider_function: Optional[Callable] = None
    custom_prepare_model_function: Optional[Callable] = None
    custom_megatron_datasets_provider_function: Optional[Callable] = None
    custom_get_batch_function: Optional[Callable] = None
    custom_loss_function: Optional[Callable] = None
    other_megatron_args: Optional[dict[str, Any]] = field(default=None)

    def __post_init__(self) -> None:
        for name, (suffix, parse, default) in _ENV_DEFAULTS.items():
            if getattr(self, name) is None:
                raw = os.environ.get(_ENV_PREFIX + suffix, default)
                try:
                    setattr(self, name, parse(raw))
                except ValueError as exc:
                    raise ValueError(f"{_ENV_PREFIX}{suffix}={raw!r} is not a valid value for {name}: {exc}") from None
        raw = os.environ.get(_ENV_PREFIX + "DECODER_LAST_PIPELINE_NUM_LAYERS")
        if self.decoder_last_pipeline_num_layers is None and raw is not None:
            self.decoder_last_pipeline_num_layers = int(raw)
        for name in ("tp_degree", "pp_degree", "num_micro_batches"):
            if getattr(self, name) < 1:
                raise ValueError(f"MegatronLMPlugin.{name} must be >= 1, got {getattr(self, name)}")
        self.DDP_impl = "local" if self.pp_degree > 1 or self.use_distributed_optimizer else "torch"
        if self.consumed_samples is not None:
            self.consumed_samples = list(self.consumed_samples) + [0] * (3 - len(self.consumed_samples))
        args = {megatron: getattr(self, name) for name, megatron in _MEGATRON_ARGS.items()}
        args["DDP_impl"] = self.DDP_impl
        if self.recompute_activations:
            args["recompute_granularity"] = "selective"
        if self.tensorboard_dir is not None:
            args["tensorboard_dir"] = self.tensorboard_dir
            if self.set_all_logging_options:
                self.set_tensorboard_logging_options()
        if self.other_megatron_args is not None:
            args.update(self.other_megatron_args)
        self.megatron_lm_default_args = args

    def set_network_size_args(self, model: torch.nn.Module, batch_data: Any = None) -> None:
        """Fill layer count, sizes and sequence length from ``model.config`` with the parser for its type."""
        model_type = str(model.config.model_type).lower()
        for key, parser in MODEL_CONFIGS_TO_MEGATRON_PARSERS.items():
            if key in model_type:
                parser(self, model, batch_data)
                return
        raise ValueError(f"no Megatron-LM config parser for model type {model_type!r} (known: "
                         f"{sorted(MODEL_CONFIGS_TO_MEGATRON_PARSERS)}); register one with add_model_config_to_megatron_parser")

    def set_mixed_precision(self, mixed_precision: str) -> None:
        """Record fp16/bf16 in Megatron's arguments (bf16 needs Megatron's local DDP)."""
        if mixed_precision == "fp16":
            self.megatron_lm_default_args["fp16"] = True
        elif mixed_precision == "bf16":
            self.megatron_lm_default_args["bf16"] = True
            self.DDP_impl = self.megatron_lm_default_args["DDP_impl"] = "local"

    def set_training_args(self, micro_batch_size: int, dp_degree: int) -> None:
        """Record the data-parallel degree and the micro/global batch sizes."""
        self.data_parallel_size = dp_degree
        self.micro_batch_size = micro_batch_size
        self.global_batch_size = dp_degree * micro_batch_size * self.num_micro_batches
        self.megatron_lm_default_args.update(data_parallel_size=dp_degree, micro_batch_size=micro_batch_size,
                                             global_batch_size=self.global_batch_size)

    def set_optimizer_type(self, optimizer: torch.optim.Optimizer) -> None:
        """Translate an Adam-family or SGD optimizer's defaults into Megatron's optimizer arguments."""
        name = type(optimizer).__name__.lower()
        defaults = optimizer.defaults
        args = self.megatron_lm_default_args
        if "adam" in name:
            args.update(optimizer="adam", adam_beta1=defaults["betas"][0], adam_beta2=defaults["betas"][1],
                        adam_eps=defaults["eps"])
        elif "sgd" in name:
            args.update(optimizer="sgd", sgd_momentum=defaults["momentum"])
        else:
            raise ValueError(f"Megatron-LM supports Adam-family and SGD optimizers, not {type(optimizer).__name__}")
        args.update(lr=defaults["lr"], weight_decay=defaults["weight_decay"])

    def set_scheduler_args(self, scheduler: Any) -> None:
        """Take the iteration counts from a :class:`MegatronLMDummyScheduler` (per data-parallel rank)."""
        dp = self.megatron_lm_default_args["data_parallel_size"]
        if self.train_iters is None:
            self.train_iters = scheduler.total_num_steps // dp
            if self.train_samples is not None:
                warnings.warn("train_samples is ignored: train_iters comes from the scheduler")
                self.train_samples = None
        if self.lr_warmup_iters is None:
            self.lr_warmup_iters = scheduler.warmup_num_steps // dp
            if self.lr_warmup_samples is not None:
                warnings.warn("lr_warmup_samples is ignored: lr_warmup_iters comes from the scheduler")
            self.lr_warmup_samples = 0
        for name in ("train_iters", "lr_warmup_iters", "train_samples", "lr_warmup_samples", "lr_decay_iters",
                     "lr_decay_samples", "lr_warmup_fraction", "lr_decay_style", "weight_decay_incr_style",
                     "start_weight_decay", "end_weight_decay", "min_lr"):
            self.megatron_lm_default_args[name] = getattr(self, name)

    def set_tensorboard_logging_options(self) -> None:
        """Switch on every ``log_*`` option of Megatron's logging arguments (needs megatron-core)."""
        try:
            from megatron.training.arguments import _add_logging_args
        except ImportError:
            raise _no_megatron("MegatronLMPlugin.set_tensorboard_logging_options") from None
        import argparse

        options = vars(_add_logging_args(argparse.ArgumentParser()).parse_known_args([])[0])
        for key in options:
            if key.startswith("log_"):
                self.megatron_lm_default_args[key] = True
            elif key.startswith("no_log_"):
                self.megatron_lm_default_args[key[len("no_"):]] = True


def add_model_config_to_megatron_parser(model_type: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Decorator registering a network-size parser for models whose ``config.model_type`` contains ``model_type``."""

    def register(parser: Callable[..., None]) -> Callable[..., None]:
        MODEL_CONFIGS_TO_MEGATRON_PARSERS[model_type] = parser
        return functools.wraps(parser)(lambda *args, **kwargs: parser(*args, **kwargs))

    return register


def _sequence_length(plugin: MegatronLMPlugin, preferred: str, batch_data: Any, fallback: int, key: str = "input_ids") -> int:
    """``plugin.<preferred>`` if set, else the batch's sequence length, else ``fallback``."""
    if getattr(plugin, preferred) is not None:
        return getattr(plugin, preferred)
    if batch_data is not None:
        return batch_data[key].shape[1]
    return fallback


def _network(plugin: MegatronLMPlugin, model: torch.nn.Module, type_name: str, names: tuple[str, str, str],
             max_positions: int, pretraining: bool, **extra: Any) -> None:
    layers, hidden, heads = (getattr(model.config, n) for n in names)
    plugin.megatron_lm_default_args.update(
        model_type_name=type_name, num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
        max_position_embeddings=max_positions, pretraining_flag=pretraining, orig_vocab_size=model.config.vocab_size,
        model_return_dict=getattr(model.config, "return_dict", True), **extra)


@add_model_config_to_megatron_parser("megatron-bert")
def parse_bert_config(megatron_lm_plugin: MegatronLMPlugin, model: torch.nn.Module, batch_data: Any) -> None:
    """Megatron arguments of a (Megatron-)BERT model; ``encoder_seq_length`` sets the sequence length."""
    positions = model.config.max_position_embeddings
    if megatron_lm_plugin.seq_length is not None and megatron_lm_plugin.encoder_seq_length is not None:
        warnings.warn("both seq_length and encoder_seq_length are set; encoder_seq_length is used")
    seq = (megatron_lm_plugin.encoder_seq_length if megatron_lm_plugin.encoder_seq_length is not None
           else _sequence_length(megatron_lm_plugin, "seq_length", batch_data, positions))
    megatron_lm_plugin.seq_length = seq
    _network(megatron_lm_plugin, model, "bert", ("num_hidden_layers", "hidden_size", "num_attention_heads"), positions,
             "maskedlm" in type(model).__name__.lower(), seq_length=seq, num_labels=model.config.num_labels)


@add_model_config_to_megatron_parser("gpt2")
def parse_gpt2_config(megatron_lm_plugin: MegatronLMPlugin, model: torch.nn.Module, batch_data: Any) -> None:
    """Megatron arguments of a GPT-2 model; ``decoder_seq_length`` sets the sequence length."""
    positions = model.config.n_positions
    if megatron_lm_plugin.seq_length is not None and megatron_lm_plugin.decoder_seq_length is not None:
        warnings.warn("both seq_length and decoder_seq_length are set; decoder_seq_length is used")
    seq = (megatron_lm_plugin.decoder_seq_length if megatron_lm_plugin.decoder_seq_length is not None
           else _sequence_length(megatron_lm_plugin, "seq_length", batch_data, positions))
    megatron_lm_plugin.seq_length = seq
    _network(megatron_lm_plugin, model, "gpt", ("n_layer", "n_embd", "n_head"), positions, True, seq_length=seq,
             return_logits=megatron_lm_plugin.return_logits, tokenizer_type="GPT2BPETokenizer")


@add_model_config_to_megatron_parser("t5")
def parse_t5_config(megatron_lm_plugin: MegatronLMPlugin, model: torch.nn.Module, batch_data: Any) -> None:
    """Megatron arguments of a T5 model (encoder and decoder lengths from the batch when not set)."""
    positions = getattr(model.config, "n_positions", 1024)
    plugin = megatron_lm_plugin
    plugin.encoder_seq_length = _sequence_length(plugin, "encoder_seq_length", batch_data, positions)
    plugin.decoder_seq_length = _sequence_length(plugin, "decoder_seq_length", batch_data, positions, key="labels")
    _network(plugin, model, "t5", ("num_layers", "d_model", "num_heads"), positions, True,
             encoder_seq_length=plugin.encoder_seq_length, decoder_seq_length=plugin.decoder_seq_length)


def _decoder_only_seq(plugin: MegatronLMPlugin, model: torch.nn.Module, batch_data: Any) -> int:
    if plugin.seq_length is None:
        from_config = getattr(model.config, "max_sequence_length", None)
        plugin.seq_length = from_config if from_config is not None else _sequence_length(
            plugin, "decoder_seq_length", batch_data, model.config.max_position_embeddings)
    return plugin.seq_length


@add_model_config_to_megatron_parser("llama")
def parse_llama_config(megatron_lm_plugin: MegatronLMPlugin, model: torch.nn.Module, batch_data: Any) -> None:
    """Megatron arguments of a Llama model (run as Megatron's GPT with the Llama-2 tokenizer)."""
    seq = _decoder_only_seq(megatron_lm_plugin, model, batch_data)
    _network(megatron_lm_plugin, model, "gpt", ("num_hidden_layers", "hidden_size", "num_attention_heads"),
             model.config.max_position_embeddings, True, seq_length=seq,
             return_logits=megatron_lm_plugin.return_logits, tokenizer_type="Llama2Tokenizer")


@add_model_config_to_megatron_parser("glm4_moe")
def parse_glm4_moe_config(megatron_lm_plugin: MegatronLMPlugin, model: torch.nn.Module, batch_data: Any) -> None:
    """Megatron arguments of a GLM-4 MoE model: the GPT layout plus its rope, attention and expert settings."""
    config = model.config
    seq = _decoder_only_seq(megatron_lm_plugin, model, batch_data)
    dense = config.first_k_dense_replace
    _network(
        megatron_lm_plugin, model, "gpt", ("num_hidden_layers", "hidden_size", "num_attention_heads"),
        config.max_position_embeddings, False, seq_length=seq, return_logits=megatron_lm_plugin.return_logits,
        tokenizer_type="HuggingFaceTokenizer", kv_channels=config.head_dim, position_embedding_type="rope",
        original_model_type=config.model_type, qk_layernorm=config.use_qk_norm, add_bias_linear=False,
        group_query_attention=True, num_query_groups=config.num_key_value_heads, ffn_hidden_size=config.intermediate_size,
        add_qkv_bias=True, normalization="RMSNorm", swiglu=True, moe_ffn_hidden_size=config.moe_intermediate_size,
        moe_shared_expert_intermediate_size=config.moe_intermediate_size, moe_router_pre_softmax=True,
        moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True, moe_router_bias_update_rate=0,
        moe_router_load_balancing_type="seq_aux_loss", moe_token_dispatcher_type="alltoall",
        moe_router_topk=config.num_experts_per_tok, moe_router_topk_scaling_factor=config.routed_scaling_factor,
        moe_layer_freq=[0] * dense + [1] * (config.num_hidden_layers - dense), num_experts=config.n_routed_experts,
        moe_grouped_gemm=True, moe_router_dtype="fp32", moe_permute_fusion=True, moe_aux_loss_coeff=0,
        rotary_base=config.rope_theta, rope_type="rope", rotary_percent=config.partial_rotary_factor, norm_epsilon=1e-3,
        use_flash_attn=True, eos_token_id=config.eos_token_id, bf16=getattr(config, "bf16", False),
        untie_embeddings_and_output_weights=not config.tie_word_embeddings,
    )
    if getattr(config, "fp8_param", False):
        megatron_lm_plugin.megatron_lm_default_args.update(
            fp8=config.fp8, fp8_param=config.fp8_param, fp8_param_gather=config.fp8_param_gather, fp8_recipe=config.fp8_recipe)


# ------------------------------------------------------------------------------------ training-loop stand-ins
class MegatronLMDummyDataLoader:
    """Stands for a Megatron dataset in ``prepare()``: holds the data arguments Megatron builds its loaders from."""

    def __init__(self, **dataset_kwargs: Any):
        self.dataset_args = dict(dataset_kwargs)
        self.dataset_args["megatron_dataset_flag"] = True

    def set_megatron_data_args(self) -> None:
        """Copy the data arguments into Megatron's global arguments (needs Megatron-LM)."""
        raise _no_megatron("MegatronLMDummyDataLoader.set_megatron_data_args")

    def get_train_valid_test_datasets_provider(self, accelerator: Any) -> Callable[..., Any]:
        """Megatron's dataset provider (needs Megatron-LM)."""
        raise _no_megatron("MegatronLMDummyDataLoader.get_train_valid_test_datasets_provider")

    def build_pretraining_data_loader(self, dataset: Any, consumed_samples: int) -> Any:
        """Megatron's pre-training loader (needs Megatron-LM)."""
        raise _no_megatron("MegatronLMDummyDataLoader.build_pretraining_data_loader")

    def build_train_valid_test_data_iterators(self, accelerator: Any) -> Any:
        """Megatron's train/valid/test iterators (needs Megatron-LM)."""
        raise _no_megatron("MegatronLMDummyDataLoader.build_train_valid_test_data_iterators")


class MegatronLMDummyScheduler:
    """Stands for Megatron's scheduler in ``prepare()``: carries the step counts the plugin reads."""

    def __init__(self, optimizer: Any, total_num_steps: int | None = None, warmup_num_steps: int = 0, **kwargs: Any):
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.kwargs = kwargs


class AbstractTrainStep(ABC):
    """Batching, forward step and loss of one Megatron model family; subclasses fill the three hooks."""

    def __init__(self, name: str):
        super().__init__()
        self.name = name

    def get_batch_func(self, accelerator: Any, megatron_dataset_flag: bool) -> Any:
        """The function turning a data iterator into one batch (None here)."""

    def get_forward_step_func(self) -> Any:
        """The function running one forward step (None here)."""

    def get_loss_func(self, accelerator: Any) -> Any:
        """The loss function (None here)."""


class _MegatronTrainStep(AbstractTrainStep):
    def __init__(self, accelerator: Any, args: Any, **kwargs: Any):
        raise _no_megatron(type(self).__name__)


class BertTrainStep(_MegatronTrainStep):
    """Megatron's BERT train step (masked-LM or classification); needs Megatron-LM."""


class GPTTrainStep(_MegatronTrainStep):
    """Megatron's GPT train step (causal LM); needs Megatron-LM."""


class T5TrainStep(_MegatronTrainStep):
    """Megatron's T5 train step (encoder-decoder); needs Megatron-LM."""


def avg_losses_across_data_parallel_group(losses: list[torch.Tensor]) -> torch.Tensor:
    """The mean of each loss over the data-parallel processes (every process of the default group).

    One tensor with one entry per loss; in a single process the losses themselves.
    """
    import torch.distributed as dist

    averaged = torch.cat([loss.clone().detach().view(1) for loss in losses])
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(averaged)
        averaged = averaged / dist.get_world_size()
    return averaged
