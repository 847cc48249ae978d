"""The launch plan as a value: what the command line decided (:func:`accel.commands.launch.plan.build_plan`)
and what the runtime carries out (:func:`accel.launch.execution.execute`)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["DEFAULT_HANG_TIMEOUT", "LaunchPlan"]

#: seconds without progress on any rank before `accel launch` ends the job as hung: NCCL's own collective
#: timeout, which training users already live with; a step, an accel collective or a checkpoint file resets it
DEFAULT_HANG_TIMEOUT = 600.0


@dataclass
class LaunchPlan:
    """Everything decided before starting: torchrun's arguments and the environment for the ranks
    (or, for mpirun and DeepSpeed's multi-node runner, the command to run instead)."""

    backend: str
    comm_backend: str | None
    num_machines: int
    machine_rank: int
    nproc_per_node: int
    mixed_precision: str
    debug: bool
    endpoint: str
    torchrun_args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    #: a command run instead of torch elastic (mpirun, DeepSpeed's multi-node runner)
    command: list[str] | None = None
    log_dir: str | None = None
    quiet: bool = False
    #: seconds without progress before the job is ended as hung (0: never)
    hang_timeout: float = DEFAULT_HANG_TIMEOUT
    #: torch elastic's rendezvous backend (the nodes swap failure evidence through the static one's store)
    rdzv_backend: str = "static"

    @property
    def num_processes(self) -> int:
        """Ranks over all machines."""
        return self.nproc_per_node * self.num_machines
