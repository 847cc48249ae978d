"""The questions `accel config` asks for a local (cluster) setup; Accelerate's ``get_cluster_input``."""

from __future__ import annotations

from typing import Any

__all__ = ["get_cluster_input"]


def get_cluster_input(current: Any = None) -> Any:
    """Ask the questions (offering ``current``'s values as defaults) and return a ``ClusterConfig``."""
    from accel.commands.config.config import ask_questions
    from accel.commands.config.config_args import cluster_config_from

    return cluster_config_from(ask_questions(current))
