"""`accel test` under mixed precision: passes for every precision the CPU backend runs (no, bf16, fp16 at
1 and 2 processes, through the real launcher), and its training check still catches a real divergence
(a wrong loss scale, an unsynchronised gradient) planted into otherwise healthy ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dist_utils import run_distributed

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def accel_test(*args: str, tmp_path) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "smoke.json"
    proc = subprocess.run([sys.executable, "-m", "accel.commands.cli", "test", *args, "--json", str(out)],
                          capture_output=True, text=True, timeout=300, env=ENV)
    return proc, (json.loads(out.read_text()) if out.exists() else {})


# one process is slow (nightly): two processes run the same checks with the launcher's precision, and
# test_accel_test_reads_the_precision_from_the_config_file runs one process in bf16.
# fp16 at two processes is slow (nightly) too: [bf16-2] runs the same two-process launch with a mixed precision
# (its mixed-precision check runs the fp16 autocast and grad scaler as well), and
# test_healthy_ranks_pass_the_training_check[fp16] runs the training check under fp16 on two ranks
@pytest.mark.parametrize("processes", [pytest.param("1", marks=pytest.mark.slow), "2"])
@pytest.mark.parametrize("precision", ["bf16", pytest.param("fp16", marks=pytest.mark.slow)])
def test_accel_test_passes_under_mixed_precision(precision, processes, tmp_path):
    proc, payload = accel_test("--cpu", "--num_processes", processes, "--mixed_precision", precision, tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "9 passed, 0 failed, 0 skipped" in proc.stdout
    assert f"world size {processes} (asked {processes})" in proc.stdout
    assert payload["world_size"] == int(processes) and len(payload["ranks"]) == int(processes)
    assert {r["check"] for r in payload["ranks"][-1]} >= {"launch: world size", "training equivalence", "checkpoint round trip"}
    training = {r["check"]: r for r in payload["ranks"][0]}["training equivalence"]
    assert training["detail"].startswith(f"{precision}: forward in {'bfloat16' if precision == 'bf16' else 'float16'}")
    mixed = {r["check"]: r for r in payload["ranks"][0]}["mixed precision"]
    assert f"launch {precision}, Accelerator reports {precision}" in mixed["detail"]


def test_accel_test_reads_the_precision_from_the_config_file(tmp_path):
    config = tmp_path / "bf16.yaml"
    config.write_text("use_cpu: true\nnum_processes: 1\nmixed_precision: bf16\n")
    proc, payload = accel_test("--config_file", str(config), tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "bf16: forward in bfloat16" in {r["check"]: r for r in payload["ranks"][0]}["training equivalence"]["detail"]


# ---------------------------------------------------------------------------- planted divergences
@pytest.fixture(scope="module")
def dynamo_before_the_ranks_fork():
    """The ranks fork from this process and their first optimizer imports ``torch._dynamo`` (torch.optim
    does on first use): imported once here, every forked rank inherits it instead of importing it again."""
    import torch._dynamo  # noqa: F401


def _train_with_fault(precision: str, fault: str | None) -> str:
    """Run accel test's training check in this rank, with ``fault`` planted into the Accelerator."""
    os.environ["ACCEL_MIXED_PRECISION"] = precision
    from accel import Accelerator
    from accel.state import PartialState
    from accel.test_utils.scripts import smoke

    if fault == "wrong scale":  # the loss reaches backward scaled by 1.5 (e.g. a scale not undone)
        original_backward = Accelerator.backward

        def backward(self, loss, **kwargs):
            return original_backward(self, loss * 1.5, **kwargs)

        Accelerator.backward = backward
    if fault == "unsynced gradient":  # DDP never all-reduces: each rank steps on its own shard's gradient
        original_prepare = Accelerator.prepare

        def prepare(self, *objects, **kwargs):
            prepared = original_prepare(self, *objects, **kwargs)
            for obj in prepared if isinstance(prepared, tuple) else (prepared,):
                if hasattr(obj, "require_backward_grad_sync"):
                    obj.require_backward_grad_sync = False
            return prepared

        Accelerator.prepare = prepare
    result = smoke.train_under_launch_precision(smoke.Context(PartialState(), None))
    try:
        return "PASS " + smoke.judge_training(result)
    except AssertionError as exc:
        return f"FAIL {exc}"


@pytest.mark.usefixtures("dynamo_before_the_ranks_fork")
@pytest.mark.parametrize("precision", ["no", "bf16", "fp16"])
def test_healthy_ranks_pass_the_training_check(precision):
    verdicts = run_distributed(_train_with_fault, 2, precision, None)
    assert all(v.startswith(f"PASS {precision}:") for v in verdicts), verdicts


@pytest.mark.usefixtures("dynamo_before_the_ranks_fork")
@pytest.mark.parametrize("precision", ["no", "bf16", "fp16"])
@pytest.mark.parametrize("fault, world_size", [("wrong scale", 1), ("unsynced gradient", 2)])
def test_a_planted_divergence_fails_the_training_check(precision, fault, world_size):
    verdicts = run_distributed(_train_with_fault, world_size, precision, fault)
    for verdict in verdicts:
        assert verdict.startswith("FAIL weights after"), verdict
        assert f"under {precision} differ from the fp32 one-process reference" in verdict


def test_the_check_fails_when_the_reported_precision_did_not_run():
    from accel.test_utils.scripts import smoke

    import torch

    result = {"reported": "bf16", "ran_in": torch.float32, "losses": [4.0, 1.0], "skipped": [False, False], "diff": 0.0, "scale": 1.0}
    with pytest.raises(AssertionError, match="reports mixed precision 'bf16', but the forward pass ran in torch.float32"):
        smoke.judge_training(result)
    result = {**result, "ran_in": torch.bfloat16, "losses": [4.0] * smoke.STEPS, "skipped": [False] * smoke.STEPS}
    with pytest.raises(AssertionError, match="the loss did not go down under bf16"):
        smoke.judge_training(result)
    result = {**result, "losses": [4.0] * smoke.STEPS, "skipped": [True] * smoke.STEPS}
    with pytest.raises(AssertionError, match="optimizer steps were skipped"):
        smoke.judge_training(result)
