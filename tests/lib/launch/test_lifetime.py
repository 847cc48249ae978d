"""accel.launch.lifetime: a child armed with the parent-death signal dies with its parent; one whose parent
is already gone exits at once. Real processes (Linux only: elsewhere nothing is armed, which is checked too)."""

from __future__ import annotations

import os
import select
import subprocess
import sys

import pytest

from accel.launch import lifetime
from _waits import SAFETY_NET_S

LINUX = sys.platform.startswith("linux")

CHILD = """
import os, time
from accel.launch.lifetime import die_with_parent
print("armed" if die_with_parent(os.getppid()) else "unarmed", flush=True)
while True:
    time.sleep(60)
"""

# the parent starts the child, which inherits the write end of the test's pipe (its fd in argv); the parent
# closes its own copy, passes on whether the child armed the signal, and waits for ever
PARENT = """
import os, subprocess, sys, time
fd = int(sys.argv[1])
child = subprocess.Popen([sys.executable, "-c", sys.argv[2]], stdout=subprocess.PIPE, text=True, pass_fds=(fd,))
os.close(fd)
print(child.stdout.readline().strip(), flush=True)
while True:
    time.sleep(60)
"""


@pytest.mark.skipif(not LINUX, reason="[backend-unavailable] the parent-death signal is Linux's")
def test_a_child_dies_with_its_parent():
    read_end, write_end = os.pipe()
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(write_end), CHILD], stdout=subprocess.PIPE, text=True,
                              pass_fds=(write_end,))
    os.close(write_end)
    try:
        assert parent.stdout.readline().strip() == "armed"
        parent.kill()  # SIGKILL: the parent runs nothing on its way out
        parent.wait(SAFETY_NET_S)
        # the pipe reaches its end once the child, its last writer, is gone
        ready, _, _ = select.select([read_end], [], [], SAFETY_NET_S)
        assert ready == [read_end], "the child outlived its parent"
        assert os.read(read_end, 1) == b""
    finally:
        parent.kill()
        parent.stdout.close()
        os.close(read_end)


@pytest.mark.skipif(not LINUX, reason="[backend-unavailable] the parent-death signal is Linux's")
def test_a_child_whose_parent_is_not_the_expected_one_exits_at_once():
    code = "import os\nfrom accel.launch.lifetime import die_with_parent\ndie_with_parent(os.getppid() + 1_000_000)\nprint('alive')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=SAFETY_NET_S)
    assert done.returncode == 1 and "alive" not in done.stdout


def test_nothing_is_armed_where_prctl_is_missing(monkeypatch):
    monkeypatch.setattr(lifetime.sys, "platform", "darwin")
    assert lifetime.prctl(lifetime.PR_SET_PDEATHSIG, 9) is False
    assert lifetime.die_with_parent(os.getppid() + 1_000_000) is False  # not armed, so no exit either
