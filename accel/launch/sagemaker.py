"""Launching a training script as an Amazon SageMaker job, through the SageMaker Python SDK.

:func:`build_sagemaker_estimator` maps a SageMaker config and the launch arguments to the SDK's
``HuggingFace`` estimator (the mapping is :func:`accel.launch.sagemaker_args.prepare_sagemager_args_inputs`,
Accelerate's); :func:`sagemaker_launcher` builds it and starts the job (``estimator.fit``), as
``accelerate launch`` does for a config whose ``compute_environment`` is ``AMAZON_SAGEMAKER``.

What needs AWS is checked before anything is sent: the SDK must be a 2.x release (SageMaker SDK 3
removed the ``HuggingFace`` estimator), and boto3 must find credentials for the chosen profile or
keys; without them :class:`SageMakerCredentialsError` says so, before any request.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..utils.imports import is_sagemaker_available
from .sagemaker_args import prepare_sagemager_args_inputs

__all__ = ["SageMakerCredentialsError", "build_sagemaker_estimator", "check_sagemaker_sdk", "sagemaker_launcher"]


class SageMakerCredentialsError(RuntimeError):
    """No AWS credentials were found for a SageMaker launch (nothing was sent to AWS)."""


def check_sagemaker_sdk() -> Any:
    """The SDK's ``HuggingFace`` estimator class, or an ImportError saying which SDK to install."""
    if not is_sagemaker_available():
        raise ImportError("launching on Amazon SageMaker needs the SageMaker Python SDK: pip install 'sagemaker<3'")
    try:
        from sagemaker.huggingface import HuggingFace
    except ImportError as exc:
        import importlib.metadata

        version = importlib.metadata.version("sagemaker")
        raise ImportError(f"the installed SageMaker SDK ({version}) has no sagemaker.huggingface.HuggingFace estimator "
                          f"(SageMaker SDK 3 removed it): pip install 'sagemaker<3' ({exc})") from None
    return HuggingFace


def _check_credentials(profile: Any) -> None:
    import boto3
    import botocore.exceptions

    try:
        credentials = boto3.Session(profile_name=profile).get_credentials()
    except botocore.exceptions.ProfileNotFound as exc:
        raise SageMakerCredentialsError(f"the AWS profile {profile!r} is not configured ({exc}): run `aws configure "
                                        f"--profile {profile}` or name another profile in the SageMaker config") from None
    if credentials is None:
        raise SageMakerCredentialsError(
            "no AWS credentials found for the SageMaker job: give a profile in the SageMaker config (`accel config`), "
            "or --aws_access_key_id and --aws_secret_access_key, or the AWS_* environment variables")


def build_sagemaker_estimator(sagemaker_config: Any, args: argparse.Namespace) -> tuple[Any, Any]:
    """The SDK's ``HuggingFace`` estimator for this launch and the inputs to ``fit`` it with.

    Refuses ``--module``/``--no_python`` (SageMaker runs a Python script file), a missing or 2.x-less
    SDK, and missing AWS credentials (:class:`SageMakerCredentialsError`), before contacting AWS.
    """
    if getattr(args, "module", False) or getattr(args, "no_python", False):
        raise ValueError("SageMaker requires a python training script file and cannot be used with --module or --no_python")
    estimator_class = check_sagemaker_sdk()
    estimator_args, inputs = prepare_sagemager_args_inputs(sagemaker_config, args)
    _check_credentials(getattr(sagemaker_config, "profile", None))
    return estimator_class(**estimator_args), inputs


def sagemaker_launcher(sagemaker_config: Any, args: argparse.Namespace) -> Any:
    """Build the estimator and start the SageMaker training job (``fit``); returns the estimator."""
    estimator, inputs = build_sagemaker_estimator(sagemaker_config, args)
    estimator.fit(inputs=inputs)
    return estimator
