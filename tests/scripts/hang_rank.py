"""Launched by tests/lib/launch/test_faults.py: two ranks train a few steps, then rank 1 hangs (sleeps in
``stuck_forever``) while rank 0 waits for it in a collective: ``gather`` (an accel collective) or
``barrier`` (``wait_for_everyone``, which passes no progress point). Each rank writes its pid, and rank 1
the wall-clock time it started hanging, into $ACCEL_TEST_OUT.
"""

import os
import sys
import time

import torch

from accel import Accelerator


def stuck_forever():
    time.sleep(3600)


out = os.environ["ACCEL_TEST_OUT"]
accelerator = Accelerator(cpu=True)
rank = accelerator.process_index
with open(os.path.join(out, f"pid-{rank}"), "w") as handle:
    handle.write(str(os.getpid()))
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
for _ in range(3):
    loss = model(torch.ones(2, 4)).sum()
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
if rank == 1:
    with open(os.path.join(out, "hang-started"), "w") as handle:
        handle.write(repr(time.time()))
    stuck_forever()
elif sys.argv[1] == "gather":
    accelerator.gather(torch.ones(1))
else:
    accelerator.wait_for_everyone()
print("rank", rank, "got past the collective", flush=True)
