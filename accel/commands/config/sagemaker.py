"""Accelerate asks SageMaker questions here; accel runs local processes only and says so."""

from __future__ import annotations

from typing import Any

__all__ = ["get_sagemaker_input"]


def get_sagemaker_input() -> Any:
    """Refuse: accel launches through torch elastic on this machine, not Amazon SageMaker jobs."""
    from accel.commands import UsageError

    raise UsageError(
        "accel does not launch on Amazon SageMaker (compute_environment AMAZON_SAGEMAKER): use `accelerate config` "
        "and `accelerate launch` for SageMaker jobs; accel loads such files but will not run them"
    )
