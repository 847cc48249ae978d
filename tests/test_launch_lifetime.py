"""accel.launch.lifetime: a child armed with the parent-death signal dies with its parent; one whose parent
is already gone exits at once. Real processes (Linux only: elsewhere nothing is armed, which is checked too)."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

from accel.launch import lifetime
from _waits import SAFETY_NET_S

LINUX = sys.platform.startswith("linux")

# the parent starts a child that arms the signal, prints the child's pid once armed, and waits for ever
PARENT = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", '''
import os, sys, time
from accel.launch.lifetime import die_with_parent
print(os.getpid() if die_with_parent(os.getppid()) else "unarmed", flush=True)
while True:
    time.sleep(60)
'''], stdout=subprocess.PIPE, text=True)
print(child.stdout.readline().strip(), flush=True)
while True:
    import time; time.sleep(60)
"""


@pytest.mark.skipif(not LINUX, reason="[backend-unavailable] the parent-death signal is Linux's")
def test_a_child_dies_with_its_parent():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        line = parent.stdout.readline().strip()
        assert line.isdigit(), f"the child did not arm the signal: {line!r}"
        child = psutil.Process(int(line))
        parent.kill()  # SIGKILL: the parent runs nothing on its way out
        parent.wait(SAFETY_NET_S)
        child.wait(SAFETY_NET_S)  # raises TimeoutExpired if the child outlived its parent
        assert not child.is_running()
    finally:
        parent.kill()


@pytest.mark.skipif(not LINUX, reason="[backend-unavailable] the parent-death signal is Linux's")
def test_a_child_whose_parent_is_not_the_expected_one_exits_at_once():
    code = "import os\nfrom accel.launch.lifetime import die_with_parent\ndie_with_parent(os.getppid() + 1_000_000)\nprint('alive')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=SAFETY_NET_S)
    assert done.returncode == 1 and "alive" not in done.stdout


def test_nothing_is_armed_where_prctl_is_missing(monkeypatch):
    monkeypatch.setattr(lifetime.sys, "platform", "darwin")
    assert lifetime.prctl(lifetime.PR_SET_PDEATHSIG, 9) is False
    assert lifetime.die_with_parent(os.getppid() + 1_000_000) is False  # not armed, so no exit either
