"""accel's own multi-process check scripts (accel.test_utils.scripts), run as Accelerate's suite runs them."""

from __future__ import annotations

import pytest

from accel import debug_launcher
from accel.test_utils import test_ops, test_script, test_sync


@pytest.mark.parametrize("script", [test_ops, test_sync, test_script], ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_scripts_pass_on_two_cpu_processes(script):
    debug_launcher(script.main, num_processes=2)


def test_scripts_pass_on_one_process():
    for script in (test_ops, test_sync):
        debug_launcher(script.main, num_processes=1)


def test_test_ops_fails_loudly_when_a_collective_is_wrong(monkeypatch):
    from accel.utils import operations

    def gather_object_dropping_the_last_rank(obj):
        return [obj[0]] if isinstance(obj, list) else [obj]

    # debug_launcher forks: the ranks inherit the broken collective
    monkeypatch.setattr(operations, "gather_object", gather_object_dropping_the_last_rank)
    with pytest.raises(Exception) as info:
        debug_launcher(test_ops.main, num_processes=2)
    assert "gather_object gave" in str(info.value) or "gather_object gave" in repr(info.value.__cause__)


def test_test_sync_fails_loudly_when_no_sync_synchronises(monkeypatch):
    import contextlib

    from accel.accelerator import Accelerator

    monkeypatch.setattr(Accelerator, "no_sync", lambda self, model: contextlib.nullcontext())
    with pytest.raises(Exception) as info:
        debug_launcher(test_sync.main, num_processes=2)
    assert "no_sync" in str(info.value) or "no_sync" in repr(info.value.__cause__)
