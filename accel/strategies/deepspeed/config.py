"""DeepSpeed configuration at Accelerate's API: the plugin and its config (no runtime wrappers).

``DeepSpeedPlugin`` turns its fields, Accelerate's ``ACCELERATE_DEEPSPEED_*`` environment (what
``accel launch --use_deepspeed`` sets) and an optional DeepSpeed config (file, dict or base64) into
one DeepSpeed config dict. Values written ``"auto"`` are filled at ``prepare`` time from what the
Accelerator knows (batch size, accumulation, clipping, precision, optimizer and scheduler); a value
the config fixes that contradicts the Accelerator is an error naming both values.

Nothing here imports deepspeed at module level: the plugin is plain configuration, and the
engine is built by :mod:`.strategy`. The state reads this module; the runtime
wrappers (which subclass the prepared optimizer and scheduler) live in :mod:`accel.utils.deepspeed`,
so the state never imports the optimizer through DeepSpeed.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from accel.facts.environment import FALSE_WORDS, TRUE_WORDS, env_flag, env_text, parse_bool

__all__ = [
    "DeepSpeedPlugin",
    "DummyOptim",
    "DummyScheduler",
    "HfDeepSpeedConfig",
    "get_active_deepspeed_plugin",
]

_AUTO = "auto"

#: plugin field -> dotted key of the DeepSpeed config it sets (one table, used both ways)
PLUGIN_CONFIG_KEYS = {
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "gradient_clipping": "gradient_clipping",
    "zero_stage": "zero_optimization.stage",
    "offload_optimizer_device": "zero_optimization.offload_optimizer.device",
    "offload_param_device": "zero_optimization.offload_param.device",
    "offload_optimizer_nvme_path": "zero_optimization.offload_optimizer.nvme_path",
    "offload_param_nvme_path": "zero_optimization.offload_param.nvme_path",
    "zero3_save_16bit_model": "zero_optimization.stage3_gather_16bit_weights_on_model_save",
}

#: plugin field -> Accelerate's environment variable (set by ``accel launch`` / ``accelerate launch``)
PLUGIN_ENV = {
    "gradient_accumulation_steps": "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
    "gradient_clipping": "ACCELERATE_GRADIENT_CLIPPING",
    "zero_stage": "ACCELERATE_DEEPSPEED_ZERO_STAGE",
    "offload_optimizer_device": "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE",
    "offload_param_device": "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE",
    "offload_optimizer_nvme_path": "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH",
    "offload_param_nvme_path": "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_NVME_PATH",
    "zero3_save_16bit_model": "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL",
    "zero3_init_flag": "ACCELERATE_DEEPSPEED_ZERO3_INIT",
    "hf_ds_config": "ACCELERATE_DEEPSPEED_CONFIG_FILE",
    "transformer_moe_cls_names": "ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES",
}

_OFFLOAD_DEVICES = ("none", "cpu", "nvme")


def _env(name: str) -> str | None:
    """The variable ``name``, None when unset or empty."""
    return env_text(name)


def _config_says(value: Any, yes: bool) -> bool:
    """Whether a config value says yes (``yes=True``) or no (``yes=False``): text by its yes/no word (other text
    says neither, e.g. "auto"), anything else by its truth."""
    if isinstance(value, str):
        return value.strip().lower() in (TRUE_WORDS if yes else FALSE_WORDS)
    return bool(value) is yes


class HfDeepSpeedConfig:
    """A DeepSpeed config dict with dotted-key lookups (``zero_optimization.stage``).

    Accepts a dict, a path to a JSON file, or the file's contents as base64 (how launchers pass it).
    """

    def __init__(self, config_file_or_dict: dict | str | os.PathLike):
        if isinstance(config_file_or_dict, dict):
            config = copy.deepcopy(config_file_or_dict)
        else:
            config = self._read(config_file_or_dict)
        if not isinstance(config, dict):
            raise ValueError(f"a DeepSpeed config must be a JSON object, got {type(config).__name__}")
        self.config = config
        self.set_stage_and_offload()

    @staticmethod
    def _read(source: str | os.PathLike) -> Any:
        path = Path(os.fspath(source)).expanduser()
        if path.is_file():
            try:
                return json.loads(path.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise ValueError(f"DeepSpeed config file {path} is not valid JSON: {exc}") from None
        try:
            return json.loads(base64.urlsafe_b64decode(os.fspath(source)).decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            raise ValueError(
                f"DeepSpeed config {os.fspath(source)!r} is neither an existing JSON file nor base64-encoded JSON"
            ) from None

    def set_stage_and_offload(self) -> None:
        """Cache the ZeRO stage and whether anything is offloaded (asked often)."""
        self._stage = self.get_value("zero_optimization.stage", -1)
        self._offload = any(
            self.get_value(f"zero_optimization.{what}.device") in ("cpu", "nvme")
            for what in ("offload_optimizer", "offload_param")
        )

    def find_config_node(self, ds_key_long: str) -> tuple[dict | None, str]:
        """The dict holding the last part of ``ds_key_long``, and that part (None when a parent is missing)."""
        node: Any = self.config
        *parents, key = ds_key_long.split(".")
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
            if node is None:
                return None, key
        return (node if isinstance(node, dict) else None), key

    def get_value(self, ds_key_long: str, default: Any = None) -> Any:
        node, key = self.find_config_node(ds_key_long)
        return default if node is None else node.get(key, default)

    def set_value(self, ds_key_long: str, value: Any) -> None:
        """Set a dotted key, creating the parent dicts."""
        node = self.config
        *parents, key = ds_key_long.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[key] = value

    def del_config_sub_tree(self, ds_key_long: str, must_exist: bool = False) -> None:
        node, key = self.find_config_node(ds_key_long)
        if node is None or key not in node:
            if must_exist:
                raise ValueError(f"DeepSpeed config has no {ds_key_long!r}")
            return
        del node[key]

    def is_true(self, ds_key_long: str) -> bool:
        value = self.get_value(ds_key_long)
        return value is not None and _config_says(value, yes=True)

    def is_false(self, ds_key_long: str) -> bool:
        value = self.get_value(ds_key_long)
        return value is not None and _config_says(value, yes=False)

    def is_zero2(self) -> bool:
        return self._stage == 2

    def is_zero3(self) -> bool:
        return self._stage == 3

    def is_offload(self) -> bool:
        return self._offload


@dataclass
class DeepSpeedPlugin:
    """Train through DeepSpeed (ZeRO stages 0-3, CPU/NVMe offload), with Accelerate's fields.

    Unset fields come from Accelerate's ``ACCELERATE_*`` environment (``accel launch --use_deepspeed``
    sets them), then defaults (ZeRO-2, nothing offloaded). With ``hf_ds_config`` (a DeepSpeed config
    path, dict or base64) the config wins and the fields are read back from it.
    """

    hf_ds_config: Any = None
    gradient_accumulation_steps: int | str | None = None
    gradient_clipping: float | str | None = None
    zero_stage: int | None = None
    is_train_batch_min: bool = True
    offload_optimizer_device: str | None = None
    offload_param_device: str | None = None
    offload_optimizer_nvme_path: str | None = None
    offload_param_nvme_path: str | None = None
    zero3_init_flag: bool | None = None
    zero3_save_16bit_model: bool | None = None
    transformer_moe_cls_names: str | None = None
    enable_msamp: bool | None = None
    msamp_opt_level: str | None = None
    deepspeed_config: dict = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        self._from_environment()
        if self._has_config_file():
            self._adopt_config()
        else:
            self._build_config()
        self.deepspeed_config = self.hf_ds_config.config
        if self.enable_msamp and "msamp" not in self.deepspeed_config:
            self._add_msamp_section()
        self.deepspeed_config["steps_per_print"] = float("inf")  # DeepSpeed's own step log stays quiet
        if self.zero3_init_flag is None:
            self.zero3_init_flag = env_flag(PLUGIN_ENV["zero3_init_flag"], default=self.hf_ds_config.is_zero3())
        if self.zero3_init_flag and not self.hf_ds_config.is_zero3():
            warnings.warn("DeepSpeedPlugin: zero3_init_flag only applies to ZeRO stage 3; it is turned off", stacklevel=3)
            self.zero3_init_flag = False
        self._set_selected(False)

    def _add_msamp_section(self) -> None:
        """MS-AMP fp8 (``enable_msamp``): the config's ``msamp`` section, with Accelerate's checks. The msamp
        package itself is needed once the Accelerator is built (``accel.strategies.deepspeed``), as its DeepSpeed
        engine builds the model."""
        stage = self.hf_ds_config.get_value("zero_optimization.stage", self.zero_stage)
        if str(stage) == "3":
            raise NotImplementedError("MS-AMP is not supported for ZeRO Stage 3. Please use ZeRO Stage 0, 1, or 2 instead.")
        if self.msamp_opt_level not in ("O1", "O2"):
            raise ValueError("Invalid optimization level for MS-AMP. Please use one of ['O1' or'O2'].")
        self.deepspeed_config["msamp"] = {"enabled": True, "opt_level": self.msamp_opt_level}

    # ------------------------------------------------------------------ building the config
    def _from_environment(self) -> None:
        if self.gradient_accumulation_steps is None:
            value = _env(PLUGIN_ENV["gradient_accumulation_steps"]) or _AUTO
            self.gradient_accumulation_steps = int(value) if value.isdigit() else value
        if self.gradient_clipping is None:
            value = _env(PLUGIN_ENV["gradient_clipping"]) or _AUTO
            self.gradient_clipping = value if value in (_AUTO, "none") else float(value)
            if self.gradient_clipping == "none":
                self.gradient_clipping = _AUTO
        if self.zero_stage is None:
            self.zero_stage = int(_env(PLUGIN_ENV["zero_stage"]) or 2)
        for name in ("offload_optimizer_device", "offload_param_device", "offload_optimizer_nvme_path", "offload_param_nvme_path"):
            if getattr(self, name) is None:
                setattr(self, name, _env(PLUGIN_ENV[name]) or "none")
        if self.zero3_save_16bit_model is None:
            self.zero3_save_16bit_model = env_flag(PLUGIN_ENV["zero3_save_16bit_model"])
        if self.hf_ds_config is None:
            self.hf_ds_config = _env(PLUGIN_ENV["hf_ds_config"]) or "none"
        if self.enable_msamp is None:
            self.enable_msamp = _env("ACCELERATE_FP8_BACKEND") == "MSAMP"
        if self.msamp_opt_level is None:
            self.msamp_opt_level = _env("ACCELERATE_FP8_OPT_LEVEL") or "O1"
        if not isinstance(self.zero_stage, int) or not 0 <= self.zero_stage <= 3:
            raise ValueError(f"DeepSpeedPlugin: zero_stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")
        for name in ("offload_optimizer_device", "offload_param_device"):
            if getattr(self, name) not in _OFFLOAD_DEVICES:
                raise ValueError(f"DeepSpeedPlugin: {name} must be one of {_OFFLOAD_DEVICES}, got {getattr(self, name)!r}")

    def _has_config_file(self) -> bool:
        config = self.hf_ds_config
        return isinstance(config, (dict, HfDeepSpeedConfig)) or (isinstance(config, (str, os.PathLike)) and os.fspath(config) != "none")

    def _adopt_config(self) -> None:
        if not isinstance(self.hf_ds_config, HfDeepSpeedConfig):
            self.hf_ds_config = HfDeepSpeedConfig(self.hf_ds_config)
        config = self.hf_ds_config
        config.config.setdefault("gradient_accumulation_steps", 1)
        if "zero_optimization" not in config.config:
            raise ValueError("the DeepSpeed config has no 'zero_optimization' section; add it with at least a 'stage'")
        self._check_no_ignored_launch_fields()
        # "auto" entries of the file take the plugin's values; fixed entries of the file win
        for name, key in PLUGIN_CONFIG_KEYS.items():
            value = getattr(self, name)
            if value is not None and config.get_value(key) == _AUTO:
                config.set_value(key, value)
        config.set_stage_and_offload()
        for name, key in PLUGIN_CONFIG_KEYS.items():
            value = config.get_value(key)
            if value is not None and value != _AUTO:
                setattr(self, name, value)

    @staticmethod
    def _check_no_ignored_launch_fields() -> None:
        """A config file together with launch flags the file overrides is a contradiction: say which."""
        ignored = {"gradient_accumulation_steps", "gradient_clipping", "zero_stage", "offload_optimizer_device",
                   "offload_param_device", "offload_param_nvme_path", "offload_optimizer_nvme_path",
                   "zero3_save_16bit_model", "mixed_precision"}
        given = [f for f in (_env("ACCELERATE_CONFIG_DS_FIELDS") or "").split(",") if f]
        clash = sorted(ignored.intersection(given))
        if clash:
            raise ValueError(
                f"with a deepspeed_config_file, these accel config fields are ignored: {', '.join(clash)}; "
                "set them in the DeepSpeed config file instead and remove them from the accel config"
            )

    def _build_config(self) -> None:
        zero: dict[str, Any] = {
            "stage": self.zero_stage,
            "offload_optimizer": {"device": self.offload_optimizer_device},
            "offload_param": {"device": self.offload_param_device},
            "stage3_gather_16bit_weights_on_model_save": self.zero3_save_16bit_model,
        }
        if self.offload_optimizer_device == "nvme":
            zero["offload_optimizer"]["nvme_path"] = self.offload_optimizer_nvme_path
        if self.offload_param_device == "nvme":
            zero["offload_param"]["nvme_path"] = self.offload_param_nvme_path
        config: dict[str, Any] = {
            "train_batch_size": _AUTO,
            "train_micro_batch_size_per_gpu": _AUTO,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "zero_optimization": zero,
        }
        if self.gradient_clipping not in (None, _AUTO):
            config["gradient_clipping"] = self.gradient_clipping
        self.hf_ds_config = HfDeepSpeedConfig(config)

    # ------------------------------------------------------------------ Accelerate's config API
    def get_value(self, ds_key_long: str, default: Any = None) -> Any:
        """A value of the DeepSpeed config by dotted key."""
        return self.hf_ds_config.get_value(ds_key_long, default)

    def is_auto(self, ds_key_long: str) -> bool:
        """Whether the config leaves this key to be filled at ``prepare`` (``"auto"``)."""
        return self.hf_ds_config.get_value(ds_key_long) == _AUTO

    def fill_match(self, ds_key_long: str, mismatches: list[str] | None = None, must_match: bool = True, **kwargs: Any) -> None:
        """Fill ``ds_key_long`` from ``kwargs`` where it is "auto"; else record a mismatch with kwargs."""
        node, key = self.hf_ds_config.find_config_node(ds_key_long)
        if node is None:
            return
        current = node.get(key)
        if current == _AUTO:
            if ds_key_long not in kwargs:
                raise ValueError(
                    f"DeepSpeed config value {ds_key_long!r} is 'auto' and accel cannot fill it here; "
                    "write a number in the config"
                )
            node[key] = kwargs[ds_key_long]
            return
        if must_match and mismatches is not None and current is not None and ds_key_long in kwargs and current != kwargs[ds_key_long]:
            mismatches.append(f"- ds {ds_key_long}={current} vs arg {ds_key_long}={kwargs[ds_key_long]}")

    def deepspeed_config_process(self, prefix: str = "", mismatches: list[str] | None = None, config: dict | None = None,
                                 must_match: bool = True, **kwargs: Any) -> None:
        """Fill every "auto" the config holds from ``kwargs``; with ``must_match``, fixed values must agree."""
        top = mismatches is None
        mismatches = [] if mismatches is None else mismatches
        config = self.deepspeed_config if config is None else config
        for key, value in list(config.items()):
            if isinstance(value, dict):
                self.deepspeed_config_process(prefix + key + ".", mismatches, value, must_match, **kwargs)
            else:
                self.fill_match(prefix + key, mismatches, must_match=must_match, **kwargs)
        if top and mismatches:
            raise ValueError(
                "these DeepSpeed config values contradict the Accelerator's:\n" + "\n".join(mismatches)
                + "\nset them to 'auto' in the DeepSpeed config, or change the Accelerator's arguments"
            )

    def set_mixed_precision(self, mixed_precision: str) -> None:
        """Write the Accelerator's precision into the config; a config enabling the other half dtype is an error.

        fp8 runs DeepSpeed in bf16 (the fp8 layers cast to fp8 inside their matmuls), as Accelerate does, and with
        ``enable_msamp`` adds the ``msamp`` section.
        """
        config = self.deepspeed_config
        wanted = {"fp16": mixed_precision == "fp16", "bf16": mixed_precision in ("bf16", "fp8")}
        if mixed_precision == "fp8" and self.enable_msamp and "msamp" not in config:
            self._add_msamp_section()
        for dtype, enabled in wanted.items():
            section = config.get(dtype)
            if isinstance(section, dict) and section.get("enabled") not in (None, _AUTO):
                configured = parse_bool(section["enabled"], f"the DeepSpeed config's {dtype}.enabled")
                if configured != enabled and (enabled or mixed_precision != "no"):
                    raise ValueError(
                        f"mixed precision contradiction: the Accelerator has mixed_precision={mixed_precision!r} but the "
                        f"DeepSpeed config has {dtype}.enabled={section['enabled']!r}"
                    )
            if not isinstance(section, dict):
                config[dtype] = {"enabled": enabled}
            elif section.get("enabled") in (None, _AUTO):
                section["enabled"] = enabled

    def config_precision(self) -> str | None:
        """The precision the config itself enables ("fp16"/"bf16"), None when it enables neither."""
        for dtype in ("bf16", "fp16"):
            section = self.deepspeed_config.get(dtype)
            enabled = section.get("enabled") if isinstance(section, dict) else None
            if enabled not in (None, _AUTO) and parse_bool(enabled, f"the DeepSpeed config's {dtype}.enabled"):
                return dtype
        return None

    def is_zero3_init_enabled(self) -> bool:
        return bool(self.zero3_init_flag)

    @contextlib.contextmanager
    def zero3_init_context_manager(self, enable: bool = False) -> Iterator[None]:
        """Temporarily turn ZeRO-3 init (parameters created already partitioned) on or off."""
        previous = self.zero3_init_flag
        self.zero3_init_flag = enable
        try:
            yield
        finally:
            self.zero3_init_flag = previous

    def zero3_init_context(self) -> contextlib.AbstractContextManager:
        """``deepspeed.zero.Init`` for building a model already partitioned (ZeRO-3 with zero3_init_flag)."""
        if not (self.zero3_init_flag and self.hf_ds_config.is_zero3()):
            return contextlib.nullcontext()
        import deepspeed

        return deepspeed.zero.Init(config_dict_or_path=self.deepspeed_config)

    def set_deepspeed_weakref(self) -> None:
        """Tell transformers about the active config (its ZeRO-3 init reads it), when transformers is there."""
        try:
            from transformers.integrations import HfDeepSpeedConfig as TransformersDeepSpeedConfig
            from transformers.integrations import unset_hf_deepspeed_config
        except ImportError:
            return
        config = copy.deepcopy(self.deepspeed_config)
        for key in ("gradient_accumulation_steps", "train_micro_batch_size_per_gpu"):
            if config.get(key, _AUTO) == _AUTO:
                config[key] = 1
        if config.get("train_batch_size") == _AUTO:
            del config["train_batch_size"]
        unset_hf_deepspeed_config()
        self.dschf = TransformersDeepSpeedConfig(config)  # transformers keeps a weak reference: hold it

    def set_moe_leaf_modules(self, model: torch.nn.Module) -> None:
        """Mark MoE layer classes as ZeRO-3 leaf modules (``transformer_moe_cls_names``)."""
        names = self.transformer_moe_cls_names or _env(PLUGIN_ENV["transformer_moe_cls_names"])
        if not names:
            return
        from deepspeed.utils import set_z3_leaf_modules

        wanted = [n.strip() for n in names.split(",") if n.strip()]
        classes = {type(m).__name__: type(m) for m in model.modules()}
        missing = [n for n in wanted if n not in classes]
        if missing:
            raise ValueError(f"transformer_moe_cls_names: no module class {', '.join(missing)} in the model")
        set_z3_leaf_modules(model, [classes[n] for n in wanted])

    # ------------------------------------------------------------------ selection (several plugins)
    def select(self, _from_accelerator_state: bool = False) -> None:
        """Make this plugin the active one (transformers' ZeRO-3 init then reads its config).

        As in Accelerate, only ``AcceleratorState.select_deepspeed_plugin`` may call it (which also unselects the
        others); a direct call is a ValueError.
        """
        if not _from_accelerator_state:
            raise ValueError(
                "a DeepSpeedPlugin is activated through Accelerator.state.select_deepspeed_plugin(name), not directly"
            )
        self.set_deepspeed_weakref()
        self._set_selected(True)

    def _unselect(self) -> None:
        self._set_selected(False)

    def _set_selected(self, value: bool) -> None:
        self._selected = bool(value)

    @property
    def selected(self) -> bool:
        """Whether this plugin is the active one."""
        return self._selected

    @selected.setter
    def selected(self, value: bool) -> None:
        # Accelerate's setter raises NotImplementedError too: selection changes the active config, so it goes
        # through the state, which unselects the other plugins
        raise NotImplementedError("a DeepSpeedPlugin is selected through Accelerator.state.select_deepspeed_plugin(name)")


def get_active_deepspeed_plugin(state: Any) -> DeepSpeedPlugin:
    """The selected plugin of ``state`` (an AcceleratorState); an error when DeepSpeed is not in use."""
    plugins = getattr(state, "deepspeed_plugins", None)
    if not plugins:
        raise ValueError("DeepSpeed is not in use: no DeepSpeedPlugin was given to the Accelerator")
    for plugin in plugins.values():
        if plugin.selected:
            return plugin
    return next(iter(plugins.values()))


class DummyOptim:
    """Stands for the optimizer the DeepSpeed config defines; ``prepare`` returns DeepSpeed's."""

    def __init__(self, params: Any, lr: float = 0.001, weight_decay: float = 0, **kwargs: Any):
        self.params = params
        self.lr = lr
        self.weight_decay = weight_decay
        self.kwargs = kwargs


class DummyScheduler:
    """Stands for the scheduler the DeepSpeed config defines (or ``lr_scheduler_callable``)."""

    def __init__(self, optimizer: Any, total_num_steps: int | None = None, warmup_num_steps: int = 0,
                 lr_scheduler_callable: Callable[..., Any] | None = None, **kwargs: Any):
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.lr_scheduler_callable = lr_scheduler_callable
        self.kwargs = kwargs


