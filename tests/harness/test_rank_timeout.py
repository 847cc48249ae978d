"""``rank_timeout(scale)``: a test whose ranks may run longer than ``--dist-timeout`` (a long model run on a slow device)."""

from __future__ import annotations

import types

import pytest

from accel_harness import rank_runs
from accel_harness.distributed import PoolResult
from accel_harness.marker_checks import MarkerUsageError, parse_marks, rank_timeout_scale


def _body():
    """The test body the fake ranks would run (never called: the pool is a stand-in)."""


class _Item:
    """The parts of a pytest item the scale and the rank run read."""

    def __init__(self, *marks):
        self._marks = list(marks)
        self.nodeid = "suites/test_x.py::test_long[cpu-ws2]"
        self._fixtureinfo = types.SimpleNamespace(argnames=())
        self.funcargs = {}
        self.obj = _body
        self.module = types.SimpleNamespace(__file__=__file__)

    def get_closest_marker(self, name):
        return next((m for m in self._marks if m.name == name), None)


class _Pool:
    def __init__(self):
        self.timeouts = []

    def run(self, task, timeout=None):
        self.timeouts.append(timeout)
        return PoolResult("timeout", message="rank 0 did not finish in time", stacks={0: "  File x"})


def _ctx(pool):
    backend = types.SimpleNamespace(name="cpu", start_method="fork", is_host=True)
    manager = types.SimpleNamespace(get=lambda *args, **kwargs: pool)
    return types.SimpleNamespace(timeout=120.0, backend=lambda name: backend, pool_manager=lambda: manager,
                                 runs_device_backend=False)


def test_the_scale_multiplies_the_limit_and_the_failure_says_so(monkeypatch):
    monkeypatch.setattr(rank_runs, "pool_start_method", lambda ctx, backend: "fork")
    monkeypatch.setattr(rank_runs, "visible_devices_env", lambda backend, world: {})
    pool = _Pool()
    with pytest.raises(pytest.fail.Exception, match=r"--dist-timeout=120 x rank_timeout 2.5 = 300 s"):
        rank_runs.run_in_ranks(_ctx(pool), _Item(pytest.mark.rank_timeout(2.5).mark), "cpu", 2)
    with pytest.raises(pytest.fail.Exception, match=r"\(--dist-timeout=120\)"):
        rank_runs.run_in_ranks(_ctx(pool), _Item(), "cpu", 2)
    assert pool.timeouts == [300.0, 120.0]


def test_without_the_mark_the_scale_is_one():
    assert rank_timeout_scale(_Item()) == 1.0
    assert rank_timeout_scale(_Item(pytest.mark.rank_timeout(scale=3).mark)) == 3.0


@pytest.mark.parametrize("mark, problem", [
    (pytest.mark.rank_timeout(0.5), "from 1 to 10"),
    (pytest.mark.rank_timeout(11), "from 1 to 10"),
    (pytest.mark.rank_timeout(True), "from 1 to 10"),
    (pytest.mark.rank_timeout("2"), "from 1 to 10"),
    (pytest.mark.rank_timeout(), "takes one scale"),
    (pytest.mark.rank_timeout(2, 3), "takes one scale"),
    (pytest.mark.rank_timeout(seconds=300), "unexpected keyword argument"),
])
def test_a_bad_scale_is_refused_when_the_test_is_collected(mark, problem):
    with pytest.raises(MarkerUsageError, match=problem):
        parse_marks([mark.mark], "suites/test_x.py::test_long")
