"""`accel estimate-memory MODEL`: how much memory a model needs to load (per dtype) and to train with Adam.

The model is built on the meta device (``init_empty_weights``), so nothing is allocated and nothing is
downloaded but a config. MODEL can be:

* a local folder holding a transformers ``config.json`` (no network needed);
* a timm architecture name (``resnet50``; with ``--library_name timm`` or when timm knows the name);
* a Python ``module:Class`` (or ``module:factory``) building an ``nn.Module`` without arguments;
* a Hugging Face Hub repository id (``org/name``), only when the Hub is reachable; offline, the command
  fails saying so and how to point it at a local model instead.

The table matches Accelerate's ``accelerate estimate-memory``: per dtype, the largest layer (the
biggest block that cannot be split, from the model's ``_no_split_modules``), the total size, and the
peak of a training step with Adam (4x the fp32 size in fp32, 2x in mixed precision; not estimated
for int8/int4).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from typing import Any, Optional

__all__ = [
    "add_arguments",
    "add_timm_hub_prefix",
    "create_ascii_table",
    "create_empty_model",
    "estimate_command",
    "estimate_command_parser",
    "estimate_training_usage",
    "gather_data",
    "run",
]

DTYPES = ["float32", "float16", "int8", "int4"]
_DIVISOR = {"float32": 1, "float16": 2, "int8": 4, "int4": 8}
_MODULE_CLASS = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
DESCRIPTION = "Model size estimator for fitting a model onto device (e.g. cuda, xpu) memory."


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the estimate-memory arguments (Accelerate's) to ``parser``."""
    parser.add_argument(
        "model_name",
        type=str,
        help="a Hub repository id, a local transformers config folder, a timm name, or module:Class",
    )
    parser.add_argument(
        "--library_name",
        type=str,
        choices=["timm", "transformers"],
        help="the library the model has an integration with (needed when the Hub does not say)",
    )
    parser.add_argument(
        "--dtypes",
        type=str,
        nargs="+",
        default=list(DTYPES),
        choices=DTYPES,
        help="dtypes to report, any of float32, float16, int8 and int4",
    )
    parser.add_argument(
        "--trust_remote_code",
        action="store_true",
        default=False,
        help="allow models defined by code in their Hub repository (read that code first)",
    )
    return parser


def estimate_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The ``estimate-memory`` parser: added to ``subparsers`` when given (with ``func`` set), else standalone."""
    if subparsers is not None:
        parser = subparsers.add_parser("estimate-memory", help=DESCRIPTION, description=DESCRIPTION)
    else:
        parser = argparse.ArgumentParser(prog="accel estimate-memory", description=DESCRIPTION)
    add_arguments(parser)
    if subparsers is not None:
        parser.set_defaults(func=estimate_command, accel_run=run)
    return parser


def add_timm_hub_prefix(model_name: str) -> str:
    """``org/name`` -> ``hf-hub:org/name`` (timm's source prefix); registry names and prefixed names unchanged."""
    if ":" in model_name or "/" not in model_name:
        return model_name
    return f"hf-hub:{model_name}"


def verify_on_hub(repo: str, token: Optional[str] = None) -> Any:
    """The Hub's model info for ``repo``, or "gated" / "repo" when it is gated / missing (Accelerate's contract)."""
    from huggingface_hub import model_info
    from huggingface_hub.utils import GatedRepoError, RepositoryNotFoundError

    try:
        return model_info(repo, token=token, timeout=10)
    except GatedRepoError:
        return "gated"
    except RepositoryNotFoundError:
        return "repo"


def _hub_info(repo: str, token: Optional[str]) -> Any:
    """The Hub's model info for ``repo``; a clear ``OSError`` when the Hub cannot be reached or lacks it."""
    try:
        import huggingface_hub  # noqa: F401
    except ImportError as exc:
        raise OSError(f"`{repo}` looks like a Hub repository, but huggingface_hub is not installed") from exc
    try:
        info = verify_on_hub(repo, token)
    except Exception as exc:  # offline mode, DNS, timeouts, proxies (the HTTP client's own error classes)
        raise OSError(
            f"Cannot reach the Hugging Face Hub to look up `{repo}` ({type(exc).__name__}: {exc}). "
            "Without network, pass a local folder with the model's config.json, a timm architecture name "
            "(--library_name timm), or a Python module:Class."
        ) from exc
    if info == "gated":
        raise OSError(
            f"Repo for model `{repo}` is gated. You must be authenticated to access it. Please run `hf auth login`."
        )
    if info == "repo":
        raise OSError(
            f"Repo for model `{repo}` does not exist on the Hub. If you are trying to access a private repo,"
            " make sure you are authenticated and have access."
        )
    return info


def _build_transformers(source: str, trust_remote_code: bool, token: Optional[str], auto_map: Any = None):
    try:
        import transformers
        from transformers import AutoConfig, AutoModel
    except ImportError as exc:
        raise ImportError(f"To check `{source}`, `transformers` must be installed (pip install transformers)") from exc
    import torch

    from accel.big_modeling import init_empty_weights

    config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code, token=token)
    if auto_map is None:
        auto_map = getattr(config, "auto_map", None)
    constructor = AutoModel
    if isinstance(auto_map, dict):
        for key in auto_map:
            if key.startswith("AutoModelFor"):
                constructor = getattr(transformers, key)
                break
    with init_empty_weights():
        try:
            return constructor.from_config(config, dtype=torch.float32, trust_remote_code=trust_remote_code)
        except TypeError:  # transformers releases that only know ``torch_dtype``
            return constructor.from_config(config, torch_dtype=torch.float32, trust_remote_code=trust_remote_code)


def _build_timm(name: str):
    try:
        import timm
    except ImportError as exc:
        raise ImportError(f"To check `{name}`, `timm` must be installed (pip install timm)") from exc
    from accel.big_modeling import init_empty_weights

    with init_empty_weights():
        return timm.create_model(add_timm_hub_prefix(name), pretrained=False)


def _build_python(spec: str):
    from torch import nn

    from accel.big_modeling import init_empty_weights

    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"`{spec}`: cannot import module `{module_name}` ({exc})") from exc
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ValueError(f"`{spec}`: module `{module_name}` has no attribute `{attr}`")
        target = getattr(target, part)
    if isinstance(target, nn.Module):
        return target
    if not callable(target):
        raise ValueError(f"`{spec}` is neither an nn.Module class, a factory nor a module instance")
    with init_empty_weights():
        model = target()
    if not isinstance(model, nn.Module):
        raise ValueError(f"`{spec}()` returned {type(model).__name__}, not a torch.nn.Module")
    return model


def _timm_knows(name: str) -> bool:
    try:
        import timm

        return bool(timm.is_model(name.split(".")[0]))
    except Exception:
        return False


def create_empty_model(model_name: str, library_name: Optional[str] = None, trust_remote_code: bool = False, access_token: Optional[str] = None):
    """Build ``model_name`` on the meta device (see the module docstring for what it can be)."""
    if os.path.isdir(model_name):
        if library_name == "timm":
            raise ValueError(f"`{model_name}` is a local folder: only transformers config folders are supported locally")
        if not os.path.isfile(os.path.join(model_name, "config.json")):
            raise ValueError(f"local folder `{model_name}` has no config.json (a transformers model config is needed)")
        print(f"Loading config for `{model_name}` from the local folder with `transformers`...")
        return _build_transformers(model_name, trust_remote_code, access_token)
    if _MODULE_CLASS.match(model_name) and not model_name.startswith("hf-hub:"):
        print(f"Building `{model_name}` from Python...")
        return _build_python(model_name)
    if library_name == "timm" and "/" not in model_name or library_name is None and _timm_knows(model_name):
        if not _timm_knows(model_name):
            raise RuntimeError(f"Tried to load `{model_name}` with `timm` but timm does not know this architecture.")
        print(f"Building `{model_name}` from the `timm` registry...")
        return _build_timm(model_name)

    info = _hub_info(model_name, access_token)
    if library_name is None:
        library_name = getattr(info, "library_name", None)
        if not library_name:
            raise ValueError(
                f"Model `{model_name}` does not have any library metadata on the Hub, please manually pass in a "
                "`--library_name` to use (such as `transformers`)"
            )
    if library_name == "transformers":
        config = getattr(info, "config", None)
        if config is None:
            raise RuntimeError(f"Tried to load `{model_name}` with `transformers` but it does not have any metadata.")
        print(f"Loading pretrained config for `{model_name}` from `transformers`...")
        return _build_transformers(model_name, trust_remote_code, access_token, auto_map=config.get("auto_map"))
    if library_name == "timm":
        print(f"Loading pretrained config for `{model_name}` from `timm`...")
        try:
            return _build_timm(model_name)
        except (RuntimeError, KeyError, OSError) as exc:
            raise RuntimeError(
                f"Tried to load `{model_name}` with `timm` but a possible model to load was not found inside the repo. ({exc})"
            ) from exc
    raise ValueError(f"Library `{library_name}` is not supported yet (only transformers and timm are).")


def estimate_training_usage(bytes: int, mixed_precision: str, msamp_config: Optional[str] = None) -> dict[str, int]:
    """Bytes for model, gradients, Adam states and the step peak when training in ``mixed_precision``.

    ``bytes`` is the fp32 size; -1 marks what is not estimated (int8/int4 training, fp8 with MS-AMP).
    """
    sizes = {"model": -1, "optimizer": -1, "gradients": -1, "step": -1}
    fp32, fp16 = bytes, bytes // 2
    if mixed_precision == "float32":
        sizes.update(model=fp32, gradients=fp32, optimizer=2 * fp32, step=4 * fp32)
    elif mixed_precision in ("float16", "bfloat16") or (mixed_precision == "fp8" and msamp_config is None):
        # master weights in fp32; gradients in fp32 plus an fp16 copy for the GEMMs; two Adam states
        sizes.update(model=fp32, gradients=fp32 + fp16, optimizer=2 * fp32, step=2 * fp32)
    return sizes


def gather_data(args: argparse.Namespace) -> list[list[Any]]:
    """Rows ``[dtype, largest layer bytes, total bytes, training usage dict]`` for ``args.dtypes``."""
    from accel.utils.modeling import calculate_maximum_sizes

    model = create_empty_model(
        args.model_name, library_name=args.library_name, trust_remote_code=args.trust_remote_code
    )
    total, (largest, _) = calculate_maximum_sizes(model)
    rows = []
    for dtype in args.dtypes:
        divisor = _DIVISOR[dtype]
        rows.append([dtype, largest / divisor if divisor > 1 else largest, total / divisor if divisor > 1 else total,
                     estimate_training_usage(total, dtype)])
    return rows


def convert_bytes(size: float) -> str:
    """``1536`` -> ``'1.5 KB'`` (powers of 1024, Accelerate's labels)."""
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if size < 1024.0:
            return f"{round(size, 2)} {unit}"
        size /= 1024.0
    return f"{round(size, 2)} PB"


def create_ascii_table(headers: list[str], rows: list[list[str]], title: str) -> str:
    """A box-drawn table with a centred title row."""
    widths = [max(len(str(r[i])) for r in [headers] + rows) for i in range(len(headers))]
    inner = sum(widths) + len(widths) - 1
    if len(title) > inner:
        widths[-1] += len(title) - inner
        inner = len(title)

    def line(left: str, mid: str, right: str) -> str:
        return left + mid.join("─" * w for w in widths) + right

    def cells(values: list[str]) -> str:
        return "│" + "│".join(str(v).center(w) for v, w in zip(values, widths)) + "│"

    out = ["┌" + "─" * inner + "┐", "│" + title.center(inner) + "│", line("├", "┬", "┤"), cells(headers), line("├", "┼", "┤")]
    out += [cells(r) for r in rows]
    out.append(line("└", "┴", "┘"))
    return "\n".join(out)


def estimate_command(args: argparse.Namespace) -> None:
    """Print the memory table for ``args.model_name``."""
    table_rows = []
    for dtype, largest, total, training in gather_data(args):
        peak = max(training.values())
        table_rows.append([dtype, convert_bytes(largest), convert_bytes(total), convert_bytes(peak) if peak != -1 else "N/A"])
    headers = ["dtype", "Largest Layer", "Total Size", "Training using Adam"]
    print(create_ascii_table(headers, table_rows, f"Memory Usage for loading `{args.model_name}`"))


def run(args: argparse.Namespace) -> int:
    """CLI entry (``accel estimate-memory``): the table, or one clear error line and exit code 1."""
    try:
        estimate_command(args)
    except (OSError, ValueError, RuntimeError, ImportError) as exc:
        print(f"accel estimate-memory: error: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    """Standalone entry point."""
    return run(estimate_command_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
