"""Launched by tests/lib/launch/test_faults.py: each rank writes its pid into $ACCEL_TEST_OUT and sleeps."""

import os
import time

with open(os.path.join(os.environ["ACCEL_TEST_OUT"], f"pid-{os.environ['RANK']}"), "w") as handle:
    handle.write(str(os.getpid()))
time.sleep(120)
