"""The questions `accel config` asks for an Amazon SageMaker job (Accelerate's ``get_sagemaker_input``).

The answers make a :class:`~accel.commands.config.config_args.SageMakerConfig`, which `accel launch`
turns into a SageMaker ``HuggingFace`` estimator (:mod:`accel.launch.sagemaker`). Accelerate can also
create an IAM role through boto3 here; that needs AWS credentials, so accel asks for the name (or
ARN) of an existing role and says how to create one.
"""

from __future__ import annotations

from typing import Any

from accel.facts.precision import PRECISIONS

__all__ = ["get_sagemaker_input"]

_DISTRIBUTED = ("NO", "DATA_PARALLEL", "MODEL_PARALLEL")


def _text(required: bool = True):
    def check(answer: str) -> Any:
        answer = answer.strip()
        if not answer and required:
            raise ValueError("an answer is needed")
        return answer or None
    return check


def _count(answer: str) -> int:
    value = int(answer)
    if value < 1:
        raise ValueError("give a number of at least 1")
    return value


def _yes_no_text(value: bool) -> str:
    return "yes" if value else "no"


def get_sagemaker_input(current: Any = None) -> Any:
    """Ask the SageMaker questions (offering ``current``'s values, a SageMakerConfig, as defaults) and
    return a ``SageMakerConfig``."""
    from accel.commands.config.config_args import SageMakerConfig
    from accel.commands.config.config_utils import _ask, _choice
    from accel.commands.config.config_utils import _convert_yes_no_to_bool as _yes_no

    def was(key: str, fallback: Any) -> Any:
        value = getattr(current, key, None) if current is not None else None
        return fallback if value is None else value

    use_profile = _ask("How do you want to authorize with AWS: an AWS profile? (yes: a profile from your AWS "
                       "credentials file; no: pass --aws_access_key_id/--aws_secret_access_key to accel launch)",
                       _yes_no, _yes_no_text(was("profile", None) is not None))
    profile = _ask("Which AWS profile?", _text(), was("profile", "default")) if use_profile else None
    region = _ask("Which AWS region?", _text(), was("region", "us-east-1"))
    role = _ask("Which IAM role (name or ARN) may SageMaker run the job as? (creating one needs AWS access: "
                "`aws iam create-role`, with the AmazonSageMakerFullAccess policy)", _text(), was("iam_role_name", None))
    image_uri = None
    if _ask("Use a custom Docker image? (yes/no)", _yes_no, _yes_no_text(was("image_uri", None) is not None)):
        image_uri = _ask("Which Docker image (URI)?", _text(), was("image_uri", None))
    inputs_file = None
    if _ask("Pass SageMaker inputs (a tab-separated file: channel, S3 URI)? (yes/no)", _yes_no,
            _yes_no_text(was("sagemaker_inputs_file", None) is not None)):
        inputs_file = _ask("Which inputs file?", _text(), was("sagemaker_inputs_file", None))
    metrics_file = None
    if _ask("Track metrics (a tab-separated file: name, regex)? (yes/no)", _yes_no,
            _yes_no_text(was("sagemaker_metrics_file", None) is not None)):
        metrics_file = _ask("Which metrics file?", _text(), was("sagemaker_metrics_file", None))
    distributed = _ask(f"How should SageMaker distribute the job? ({', '.join(_DISTRIBUTED)})", _choice(_DISTRIBUTED),
                       str(was("distributed_type", "NO")).split(".")[-1])
    instance = _ask("Which EC2 instance type?", _text(), was("ec2_instance_type", "ml.p3.2xlarge"))
    machines = _ask("How many machines?", _count, was("num_machines", 1))
    precision = _ask(f"Mixed precision? ({', '.join(PRECISIONS)})", _choice(PRECISIONS), was("mixed_precision", "no"))
    return SageMakerConfig(
        compute_environment="AMAZON_SAGEMAKER", distributed_type=distributed, mixed_precision=precision, use_cpu=False,
        debug=False, ec2_instance_type=instance, iam_role_name=role, image_uri=image_uri, profile=profile, region=region,
        num_machines=machines, base_job_name=was("base_job_name", "accelerate-sagemaker-1"),
        pytorch_version=was("pytorch_version", None), transformers_version=was("transformers_version", None),
        py_version=was("py_version", None), sagemaker_inputs_file=inputs_file, sagemaker_metrics_file=metrics_file,
        additional_args=was("additional_args", None))
