"""SageMaker's side of a launch (the ``HuggingFace`` estimator's arguments, as Accelerate maps them) and the
fp8 variables that a local launch and a SageMaker job both carry; re-exported by :mod:`accel.utils.launch`."""

from __future__ import annotations

import argparse
import os
from ast import literal_eval
from typing import Any


def setup_fp8_env(args: argparse.Namespace, current_env: dict[str, str]) -> dict[str, str]:
    """Add ``ACCELERATE_FP8_*`` for every ``fp8_*`` argument that has a value; returns ``current_env``."""
    for name, value in sorted(vars(args).items()):
        if not name.startswith("fp8_") or value is None:
            continue
        if name == "fp8_override_linear_precision":
            fprop, dgrad, wgrad = value
            current_env["ACCELERATE_FP8_OVERRIDE_FPROP"] = str(fprop)
            current_env["ACCELERATE_FP8_OVERRIDE_DGRAD"] = str(dgrad)
            current_env["ACCELERATE_FP8_OVERRIDE_WGRAD"] = str(wgrad)
        else:
            current_env[f"ACCELERATE_{name.upper()}"] = str(value)
    return current_env


def convert_nargs_to_dict(nargs: list[str]) -> dict[str, Any]:
    """``--name value`` pairs as a dict with numbers and True/False converted (SageMaker hyperparameters).
    A flag without a value is an error, since SageMaker passes every hyperparameter as ``--name value``."""
    def infer(text: str) -> Any:
        try:
            number = float(text)
        except ValueError:
            return text
        return int(number) if number.is_integer() else number

    result: dict[str, Any] = {}
    i = 0
    while i < len(nargs):
        word = nargs[i]
        if not word.startswith("-"):
            i += 1
            continue
        if i + 1 >= len(nargs) or nargs[i + 1].startswith("-"):
            raise ValueError("SageMaker doesn’t support argparse actions for `store_true` or `store_false`. Please define explicit types")
        value = nargs[i + 1]
        result[word.lstrip("-").replace("-", "_")] = literal_eval(value) if value in ("True", "False") else infer(value)
        i += 2
    return result


def read_tsv_pairs(path: str, what: str) -> list[tuple[str, str]]:
    """Rows of a two-column tab-separated file after its header line (Accelerate's inputs/metrics files)."""
    rows = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle):
            if number == 0 or not line.strip():
                continue
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 2:
                raise ValueError(f"{what} file {path!r}, line {number + 1}: expected two tab-separated columns, got {line!r}")
            rows.append((parts[0], parts[1].strip()))
    return rows


def merge_missing(extra: dict, base: dict) -> dict:
    """``base`` with ``extra`` merged in recursively (``base`` wins where both set a key)."""
    merged = dict(extra)
    for key, value in base.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_missing(merged[key], value)
        else:
            merged[key] = value
    return merged


def prepare_sagemager_args_inputs(sagemaker_config: Any, args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    """The keyword arguments of SageMaker's ``HuggingFace`` estimator and the ``fit`` inputs, as Accelerate maps them.

    Sets ``AWS_DEFAULT_REGION`` and the credentials (``AWS_PROFILE`` from the config's profile, else
    ``--aws_access_key_id``/``--aws_secret_access_key``; neither is an ``OSError``). The script must be
    a ``.py`` file; its arguments become hyperparameters (``--name value`` pairs). The job's
    environment carries the precision and dynamo settings (``ACCELERATE_*``) and the SageMaker
    distribution type; ``DATA_PARALLEL`` enables SageMaker's data parallelism. The config's inputs and
    metrics files (tab-separated, with a header) become the ``fit`` inputs and the metric
    definitions; its ``additional_args`` are merged under the mapped arguments.
    """
    from ..utils.dataclasses import DynamoBackend, PrecisionType, SageMakerDistributedType

    print("Configuring Amazon SageMaker environment")
    os.environ["AWS_DEFAULT_REGION"] = sagemaker_config.region
    profile = getattr(sagemaker_config, "profile", None)
    key_id, secret = getattr(args, "aws_access_key_id", None), getattr(args, "aws_secret_access_key", None)
    if profile is not None:
        os.environ["AWS_PROFILE"] = profile
    elif key_id is not None and secret is not None:
        os.environ["AWS_ACCESS_KEY_ID"] = key_id
        os.environ["AWS_SECRET_ACCESS_KEY"] = secret
    else:
        raise OSError("You need to provide an aws_access_key_id and aws_secret_access_key when not using aws_profile")

    script = getattr(args, "training_script", None)
    if not script:
        raise ValueError("a SageMaker launch needs a training script (a .py file)")
    source_dir = os.path.dirname(script) or "."
    entry_point = os.path.basename(script)
    if not entry_point.endswith(".py"):
        raise ValueError(f'Your training script should be a python script and not "{entry_point}"')
    print("Converting Arguments to Hyperparameters")
    hyperparameters = convert_nargs_to_dict(list(getattr(args, "training_script_args", []) or []))

    precision_text = str(getattr(args, "mixed_precision", "no") or "no").lower()
    try:
        precision = PrecisionType(precision_text)
    except ValueError:
        raise ValueError(f"Unknown mixed_precision mode: {precision_text}. Choose between {[p.value for p in PrecisionType]}.") from None
    dynamo_text = str(getattr(args, "dynamo_backend", "no") or "no").upper()
    try:
        dynamo = DynamoBackend(dynamo_text)
    except ValueError:
        raise ValueError(f"Unknown dynamo backend: {dynamo_text}. Choose between {[d.value for d in DynamoBackend]}.") from None
    distributed = SageMakerDistributedType(str(getattr(sagemaker_config, "distributed_type", "NO")).split(".")[-1])
    environment = {
        "ACCELERATE_USE_SAGEMAKER": "true",
        "ACCELERATE_MIXED_PRECISION": precision.value,
        "ACCELERATE_DYNAMO_BACKEND": dynamo.value,
        "ACCELERATE_DYNAMO_MODE": str(getattr(args, "dynamo_mode", "default")),
        "ACCELERATE_DYNAMO_USE_FULLGRAPH": str(bool(getattr(args, "dynamo_use_fullgraph", False))),
        "ACCELERATE_DYNAMO_USE_DYNAMIC": str(bool(getattr(args, "dynamo_use_dynamic", False))),
        "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": str(bool(getattr(args, "dynamo_use_regional_compilation", False))),
        "ACCELERATE_SAGEMAKER_DISTRIBUTED_TYPE": distributed.value,
    }
    if precision.value == "fp8":
        environment = setup_fp8_env(args, environment)
    distribution = {"smdistributed": {"dataparallel": {"enabled": True}}} if distributed.value == "DATA_PARALLEL" else None

    inputs = None
    if getattr(sagemaker_config, "sagemaker_inputs_file", None) is not None:
        print(f"Loading SageMaker Inputs from {sagemaker_config.sagemaker_inputs_file} file")
        inputs = dict(read_tsv_pairs(sagemaker_config.sagemaker_inputs_file, "SageMaker inputs"))
        print(f"Loaded SageMaker Inputs: {inputs}")
    metrics = None
    if getattr(sagemaker_config, "sagemaker_metrics_file", None) is not None:
        print(f"Loading SageMaker Metrics from {sagemaker_config.sagemaker_metrics_file} file")
        metrics = [{"Name": name, "Regex": regex}
                   for name, regex in read_tsv_pairs(sagemaker_config.sagemaker_metrics_file, "SageMaker metrics")]
        print(f"Loaded SageMaker Metrics: {metrics}")

    print("Creating Estimator")
    estimator_args = {
        "image_uri": sagemaker_config.image_uri,
        "entry_point": entry_point,
        "source_dir": source_dir,
        "role": sagemaker_config.iam_role_name,
        "transformers_version": sagemaker_config.transformers_version,
        "pytorch_version": sagemaker_config.pytorch_version,
        "py_version": sagemaker_config.py_version,
        "base_job_name": sagemaker_config.base_job_name,
        "instance_count": sagemaker_config.num_machines,
        "instance_type": sagemaker_config.ec2_instance_type,
        "debugger_hook_config": False,
        "distribution": distribution,
        "hyperparameters": hyperparameters,
        "environment": environment,
        "metric_definitions": metrics,
    }
    if getattr(sagemaker_config, "additional_args", None):
        estimator_args = merge_missing(sagemaker_config.additional_args, estimator_args)
    return estimator_args, inputs
