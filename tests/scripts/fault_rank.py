"""Launched by tests/lib/launch/test_faults.py: every rank trains a small DDP model in a loop (each backward
runs DDP's gradient allreduce) until the test stops, kills or freezes one of them from outside.

Each rank writes its pid into ``$ACCEL_TEST_OUT/pid-{RANK}`` and, after a few steps, ``ready-{RANK}``
(the point the test waits for before it injects the fault). A rank left alone ends after 300 s, so a
launcher that never acts cannot keep the test waiting forever. With ``ACCEL_TEST_QUIET_NODE=N`` the
ranks of node N stop after that point and sleep outside any collective: they never notice a peer's
death, as gloo's ranks sometimes do not.
"""

import os
import time

import torch

from accel import Accelerator

out = os.environ["ACCEL_TEST_OUT"]
accelerator = Accelerator(cpu=True)
rank = accelerator.process_index
with open(os.path.join(out, f"pid-{rank}"), "w") as handle:
    handle.write(str(os.getpid()))
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
model, optimizer = accelerator.prepare(model, optimizer)
end = time.monotonic() + 300
step = 0
while time.monotonic() < end:
    loss = model(torch.ones(4, 8)).sum()
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    step += 1
    if step == 5:
        with open(os.path.join(out, f"ready-{rank}"), "w") as handle:
            handle.write(str(step))
        if os.environ.get("ACCEL_TEST_QUIET_NODE") == os.environ.get("GROUP_RANK"):
            while time.monotonic() < end:
                time.sleep(0.5)
