"""Launched by tests/lib/launch/test_faults.py: rank 1 raises while rank 0 waits for it in a collective, so
rank 0 fails too (its collective breaks when rank 1 exits). The launcher must name rank 1 every time.

``slow-exit``: rank 1's exit then takes up to half a minute (an atexit handler, as a tracker flushing its
logs would), so rank 0's failure reaches the launcher first and the launcher stops rank 1 while it exits
(however busy the host): blame by exit order names rank 0.
"""

import atexit
import sys
import time

import torch

from accel import Accelerator


def explode():
    raise ValueError("boom from rank 1")


accelerator = Accelerator(cpu=True)
accelerator.gather(torch.ones(1))  # the group is up on both ranks
if accelerator.process_index == 1:
    if sys.argv[1:] == ["slow-exit"]:
        atexit.register(time.sleep, 30.0)
    explode()
for _ in range(1000):
    accelerator.gather(torch.ones(1))  # breaks once rank 1 is gone
