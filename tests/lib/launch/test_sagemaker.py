"""SageMaker: `accel config sagemaker` questions, Accelerate's mapping of a launch to the SDK's HuggingFace
estimator (built for real when the SDK 2.x is installed, with placeholder keys: nothing is sent), and the
stop where AWS credentials are missing."""

import argparse

import pytest

from accel.commands.config import config as config_command
from accel.commands.config.config_args import SageMakerConfig, load_config_from_file
from accel.launch import sagemaker as sagemaker_utils
from accel.utils.launch import prepare_sagemager_args_inputs

ROLE = "arn:aws:iam::123456789012:role/accel-test"


def _config(tmp_path, **overrides):
    values = dict(compute_environment="AMAZON_SAGEMAKER", distributed_type="DATA_PARALLEL", mixed_precision="bf16",
                  use_cpu=False, debug=False, ec2_instance_type="ml.p3.2xlarge", iam_role_name=ROLE,
                  pytorch_version="2.1.0", transformers_version="4.36.0", py_version="py310", num_machines=2)
    values.update(overrides)
    return SageMakerConfig(**values)


def _args(**overrides):
    values = dict(training_script="train/run.py", training_script_args=["--lr", "0.1", "--epochs", "3", "--name", "x"],
                  mixed_precision="bf16", dynamo_backend="no", aws_access_key_id="placeholder-id",
                  aws_secret_access_key="placeholder-secret")
    values.update(overrides)
    return argparse.Namespace(**values)


@pytest.fixture(autouse=True)
def _no_aws(monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_DEFAULT_REGION", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_the_mapping_follows_accelerate(tmp_path):
    inputs = tmp_path / "inputs.tsv"
    inputs.write_text("channel\turi\ntrain\ts3://bucket/train\n")
    metrics = tmp_path / "metrics.tsv"
    metrics.write_text("name\tregex\nloss\tloss: ([0-9.]+)\n")
    config = _config(tmp_path, sagemaker_inputs_file=str(inputs), sagemaker_metrics_file=str(metrics),
                     additional_args={"max_run": 3600, "environment": {"EXTRA": "1"}})
    kwargs, fit_inputs = prepare_sagemager_args_inputs(config, _args())
    assert (kwargs["entry_point"], kwargs["source_dir"], kwargs["role"]) == ("run.py", "train", ROLE)
    assert (kwargs["instance_count"], kwargs["instance_type"]) == (2, "ml.p3.2xlarge")
    assert kwargs["hyperparameters"] == {"lr": 0.1, "epochs": 3, "name": "x"}
    assert kwargs["environment"]["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert kwargs["environment"]["ACCELERATE_SAGEMAKER_DISTRIBUTED_TYPE"] == "DATA_PARALLEL"
    assert kwargs["environment"]["EXTRA"] == "1" and kwargs["max_run"] == 3600  # additional_args merged under
    assert kwargs["distribution"] == {"smdistributed": {"dataparallel": {"enabled": True}}}
    assert fit_inputs == {"train": "s3://bucket/train"}
    assert kwargs["metric_definitions"] == [{"Name": "loss", "Regex": "loss: ([0-9.]+)"}]


def test_bad_launches_are_refused_with_the_reason(tmp_path):
    with pytest.raises(OSError, match="aws_access_key_id"):
        prepare_sagemager_args_inputs(_config(tmp_path), _args(aws_access_key_id=None))
    with pytest.raises(ValueError, match="python script"):
        prepare_sagemager_args_inputs(_config(tmp_path), _args(training_script="train.sh"))
    with pytest.raises(ValueError, match="store_true"):
        prepare_sagemager_args_inputs(_config(tmp_path), _args(training_script_args=["--flag"]))
    with pytest.raises(ValueError, match="mixed_precision"):
        prepare_sagemager_args_inputs(_config(tmp_path), _args(mixed_precision="fp64"))
    with pytest.raises(ValueError, match="--module"):
        sagemaker_utils.build_sagemaker_estimator(_config(tmp_path), _args(module=True))


def test_without_credentials_the_launch_stops_before_aws(tmp_path):
    pytest.importorskip("boto3", reason="[needs-package] the SageMaker SDK (pip install 'sagemaker<3') brings boto3")
    with pytest.raises(sagemaker_utils.SageMakerCredentialsError, match="no AWS credentials"):
        sagemaker_utils._check_credentials(None)
    with pytest.raises(sagemaker_utils.SageMakerCredentialsError, match="profile 'nobody'"):
        sagemaker_utils._check_credentials("nobody")


def test_the_real_sdk_builds_the_estimator(tmp_path):
    try:
        sagemaker_utils.check_sagemaker_sdk()
    except ImportError as exc:
        pytest.skip(f"[needs-package] {exc}")
    estimator, inputs = sagemaker_utils.build_sagemaker_estimator(_config(tmp_path), _args())
    assert type(estimator).__name__ == "HuggingFace" and inputs is None
    assert estimator.role == ROLE and estimator.instance_count == 2
    assert estimator.environment["ACCELERATE_USE_SAGEMAKER"] == "true"
    assert estimator.hyperparameters()["epochs"] == "3"


def test_a_missing_sdk_is_named(monkeypatch):
    monkeypatch.setattr(sagemaker_utils, "is_sagemaker_available", lambda: False)
    with pytest.raises(ImportError, match="sagemaker<3"):
        sagemaker_utils.check_sagemaker_sdk()


def test_accel_config_sagemaker_asks_and_writes_a_config_launch_can_read(tmp_path, monkeypatch):
    # NO distribution: accel.launch.config_file does not accept SageMaker's DATA_PARALLEL/MODEL_PARALLEL yet
    answers = iter(["yes", "research", "eu-west-1", ROLE, "no", "no", "no", "NO", "ml.g5.xlarge", "2", "bf16"])
    prompts: list[str] = []

    def answer(prompt: str = "") -> str:
        prompts.append(prompt)
        return next(answers)

    monkeypatch.setattr("builtins.input", answer)
    monkeypatch.setattr(config_command, "_stdin_is_tty", lambda: True)
    path = tmp_path / "sm.yaml"
    from accel.commands.cli import main

    assert main(["config", "sagemaker", "--config_file", str(path)]) == 0
    loaded = load_config_from_file(str(path))
    assert isinstance(loaded, SageMakerConfig)
    assert (loaded.profile, loaded.region, loaded.iam_role_name, loaded.num_machines) == ("research", "eu-west-1", ROLE, 2)
    assert str(loaded.distributed_type).endswith("NO") and loaded.mixed_precision == "bf16"
    assert any("IAM role" in p for p in prompts)
    # asking again offers the file's answers
    prompts.clear()
    monkeypatch.setattr("builtins.input", lambda prompt="": prompts.append(prompt) or "")
    assert main(["config", "--config_file", str(path)]) == 0
    assert any(p.startswith("Which AWS region?") and p.endswith("[eu-west-1]: ") for p in prompts)
