"""Launched by tests/lib/launch/test_launch.py: rank 1 fails (``raise`` or ``exit N``), rank 0 would wait long.

Rank 0 sleeping for a minute shows that the launcher stops the other ranks as soon as one fails.
"""

import os
import sys
import time


def explode():
    raise ValueError("boom from rank 1")


mode = sys.argv[1]
if os.environ["RANK"] == "1":
    if mode == "raise":
        explode()
    print("rank 1 exits on purpose", file=sys.stderr, flush=True)
    sys.exit(int(mode.split(":")[1]))
time.sleep(60)
