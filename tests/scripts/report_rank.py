"""Launched by tests/lib/launch/test_launch.py: each rank writes what it saw to $ACCEL_TEST_OUT/rank<RANK>.json.

With ``--collective`` it also builds accel's PartialState and all-reduces a tensor, proving the
ranks really formed a group of the reported size. It leaves the group open, as most scripts do, and
notes at exit (rank<RANK>.exit) whether the launcher's bootstrap closed it.
"""

import atexit
import json
import os
import sys

record = {
    "argv": sys.argv[1:],
    "rank": int(os.environ["RANK"]),
    "world_size": int(os.environ["WORLD_SIZE"]),
    "local_rank": int(os.environ["LOCAL_RANK"]),
    "env": {
        name: os.environ.get(name)
        for name in (
            "ACCEL_USE_CPU",
            "ACCEL_MIXED_PRECISION",
            "ACCEL_DEBUG_MODE",
            "ACCEL_DEVICE",
            "OMP_NUM_THREADS",
            "GLOO_SOCKET_IFNAME",
            "MASTER_ADDR",
            "MASTER_PORT",
        )
    },
    "name": __name__,
    "path0": sys.path[0],
}
if "--collective" in sys.argv:
    import torch
    import torch.distributed as dist

    from accel.state import PartialState

    state = PartialState()
    total = torch.tensor([float(state.process_index + 1)])
    dist.all_reduce(total)
    record.update(
        state_world=state.num_processes,
        state_rank=state.process_index,
        distributed_type=str(state.distributed_type),
        comm=state.backend,
        all_reduce=total.item(),
    )

    def note_group_at_exit() -> None:
        with open(os.path.join(os.environ["ACCEL_TEST_OUT"], f"rank{state.process_index}.exit"), "w") as fh:
            fh.write("open" if dist.is_initialized() else "closed")

    atexit.register(note_group_at_exit)

out = os.environ["ACCEL_TEST_OUT"]
with open(os.path.join(out, f"rank{record['rank']}.json"), "w") as fh:
    json.dump(record, fh)
