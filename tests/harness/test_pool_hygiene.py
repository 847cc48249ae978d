"""Rank-pool hygiene: leftover processes, state reset between pooled tests, stale folders, crash stacks.

The pooled scenarios run as one inner session: one check for each reads its part of the output.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

import _inner_session as inner
from _waits import SAFETY_NET_S
from accel_harness.pool_hygiene import POOL_DIR_PREFIX, remove_stale_pool_dirs, write_owner

POOLED = {
    # a test that starts a child and leaves it running
    "test_leak": """
        import subprocess, sys, time
        import pytest

        @pytest.mark.world_size(2)
        def test_starts_a_sleeper(backend, rank):
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
            with open(f"child-{rank}.pid", "w") as fh:
                fh.write(str(child.pid))
            # until the child has exec'd it is a copy of this rank (its command line too): wait for it
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                with open(f"/proc/{child.pid}/cmdline", "rb") as fh:
                    if b"sleep(120)" in fh.read():
                        break
                time.sleep(0.01)

        @pytest.mark.world_size(2)
        def test_next_one_runs(backend, rank):
            pass
        """,
    # the shell exits at once: its background sleep is orphaned, which without a subreaper rank
    # would escape to init, out of the rank's subtree
    "test_orphan": """
        import subprocess
        import pytest

        @pytest.mark.world_size(2)
        def test_orphans_a_sleeper(backend, rank):
            out = subprocess.run(["sh", "-c", "sleep 121 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True,
                                 check=True).stdout
            with open(f"grandchild-{rank}.pid", "w") as fh:
                fh.write(out.strip())

        @pytest.mark.world_size(2)
        def test_next_one_runs(backend, rank):
            pass
        """,
    "test_state": """
        import os, random
        import numpy
        import pytest
        import torch
        import torch._dynamo  # what use_deterministic_algorithms imports (seconds): once here, not in each rank

        def _fingerprint():
            return (str(torch.get_default_dtype()), os.environ.get("ACCEL_LEAK"), os.environ.get("OMP_NUM_THREADS"),
                    os.getcwd(), torch.rand(3).tolist(), random.random(), numpy.random.rand(2).tolist(),
                    torch.is_grad_enabled(), torch.are_deterministic_algorithms_enabled())

        @pytest.mark.world_size(2)
        def test_a_changes_everything(backend, rank):
            with open(f"a-{rank}.txt", "w") as fh:
                fh.write(repr(_fingerprint()))
            torch.set_default_dtype(torch.float64)
            os.environ["ACCEL_LEAK"] = "1"
            del os.environ["OMP_NUM_THREADS"]
            os.chdir("/")
            torch.manual_seed(1234)
            random.seed(99)
            numpy.random.seed(5)
            numpy.random.standard_normal(3)  # leaves a cached normal in the legacy generator
            torch.set_grad_enabled(False)
            torch.use_deterministic_algorithms(True)

        @pytest.mark.world_size(2)
        def test_b_sees_a_fresh_rank(backend, rank):
            seen = _fingerprint()
            first = open(os.path.join(os.environ["PYTEST_STATE_DIR"], f"a-{rank}.txt")).read()
            assert repr(seen) == first
        """,
    "test_restore": """
        import pytest
        import torch

        def _refuse(dtype):
            raise RuntimeError("set_default_dtype refused by the test")

        @pytest.mark.world_size(2)
        def test_a_breaks_the_way_back(backend, rank):
            torch.set_default_dtype(torch.float64)
            torch.set_default_dtype = _refuse

        @pytest.mark.world_size(2)
        def test_b_gets_the_reason(backend, rank):
            pass

        @pytest.mark.world_size(2)
        def test_c_runs_on_fresh_ranks(backend, rank):
            assert torch.get_default_dtype() == torch.float32
        """,
    "test_segfault": """
        import ctypes
        import pytest

        def _crash_here():
            ctypes.string_at(0)

        @pytest.mark.world_size(2)
        def test_rank_1_segfaults(backend, rank):
            if rank == 1:
                _crash_here()
        """,
}


def _kill_a_session_in_its_test(folder: Path, env: dict[str, str]) -> list[Path]:
    """Start a session whose two ranks sleep in a test, SIGKILL it once both are in; what it left in TMPDIR."""
    started = folder / "started"
    started.mkdir(parents=True)
    inner.write(folder, test_slow=f"""
        import time
        import pytest

        @pytest.mark.world_size(2)
        def test_sleeps(backend, rank):
            open({str(started)!r} + f"/rank-{{rank}}", "w").close()
            time.sleep(600)
        """)
    session = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--backend", "cpu",
                                "-m", "cpu"], cwd=folder, env={**os.environ, "OMP_NUM_THREADS": "1", **env},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # both ranks inside the test: the pool folder and its owner record exist (generous: a busy host starts slowly)
        deadline = time.monotonic() + SAFETY_NET_S
        while time.monotonic() < deadline and len(list(started.iterdir())) < 2 and session.poll() is None:
            time.sleep(0.1)
        assert len(list(started.iterdir())) == 2, "the session never got its ranks into the test"
        left = [p for p in Path(env["TMPDIR"]).iterdir() if p.name.startswith(POOL_DIR_PREFIX)]
        assert left and all((p / "owner").exists() for p in left)
    finally:
        session.send_signal(signal.SIGKILL)
        session.wait()
    assert all(p.exists() for p in left)  # SIGKILL: nobody could clean up
    return left


def test_pooled_scenarios_in_one_session_after_a_killed_one(tmp_path):
    """Every scenario of POOLED in one session, whose ranks serve them one after another as in a real run,
    started after a session that was SIGKILLed while its ranks were in a test (both with one TMPDIR).

    One session instead of one per scenario: each check below reads its part of the output and files.
    """
    tmp, folder = tmp_path / "tmp", tmp_path / "next"
    tmp.mkdir()
    folder.mkdir()
    left = _kill_a_session_in_its_test(tmp_path / "killed", {"TMPDIR": str(tmp)})
    inner.write(folder, **POOLED)
    result = inner.run(folder, "--backend", "cpu", "-m", "cpu", env={"TMPDIR": str(tmp), "PYTEST_STATE_DIR": str(folder)})
    inner.check_all({
        "a process left running is killed and warned about": lambda: _leftover_child(result, folder),
        "a grandchild left running is killed and warned about": lambda: _leftover_grandchild(result, folder),
        "state set by one pooled test does not reach the next": lambda: _state_reset(result),
        "a rank whose state cannot be put back fails its next test and is replaced": lambda: _restore_refused(result),
        "a segfaulting rank is reported with its stack": lambda: _segfault(result),
        "the killed session's pool folders are removed by the next": lambda: _folders_removed(left, tmp),
    }, result)


def _ended(pid: int) -> bool:
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def _leftover_child(result: pytest.RunResult, folder: Path) -> None:
    assert inner.outcomes(result, "test_leak.py") == {"passed": 2}
    for rank in (0, 1):
        result.stdout.fnmatch_lines([f"*LeftoverProcessWarning: rank {rank} of 2: the test left 1 process(es) running; "
                                     f"killed: pid *sleep(120)*"])
        assert _ended(int((folder / f"child-{rank}.pid").read_text()))


def _leftover_grandchild(result: pytest.RunResult, folder: Path) -> None:
    assert inner.outcomes(result, "test_orphan.py") == {"passed": 2}
    for rank in (0, 1):
        result.stdout.fnmatch_lines([f"*LeftoverProcessWarning: rank {rank} of 2: the test left 1 process(es) running; "
                                     f"killed: pid *sleep 121*"])
        assert _ended(int((folder / f"grandchild-{rank}.pid").read_text()))


def _state_reset(result: pytest.RunResult) -> None:
    assert inner.outcomes(result, "test_state.py") == {"passed": 2}


def _restore_refused(result: pytest.RunResult) -> None:
    assert inner.outcomes(result, "test_restore.py") == {"passed": 2, "failed": 1}
    assert inner.outcome_of(result, "test_restore.py::test_b_gets_the_reason[cpu-ws2]") == "failed"
    failure = inner.section(result, "test_b_gets_the_reason")
    assert "the rank's state could not be put back after the previous test" in failure
    assert "set_default_dtype refused by the test" in failure


def _segfault(result: pytest.RunResult) -> None:
    assert inner.outcomes(result, "test_segfault.py") == {"failed": 1}
    failure = inner.section(result, "test_rank_1_segfaults")
    assert "rank 1 died with exit code -11 (SIGSEGV)" in failure
    assert "Fatal Python error: Segmentation fault" in failure
    assert "_crash_here" in failure


def _folders_removed(left: list[Path], tmp: Path) -> None:
    assert not any(p.exists() for p in left)  # the next session removed them
    assert not [p for p in tmp.iterdir() if p.name.startswith(POOL_DIR_PREFIX)]  # and its own folders went too


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="child subreapers and /proc are Linux's")
def test_leftovers_are_found_in_the_rank_subtree_without_scanning_the_host():
    # in a throwaway process (it becomes a subreaper): every host-wide psutil scan raises
    script = textwrap.dedent(
        """
        import os, subprocess, sys
        import psutil

        def no_scan(*args, **kwargs):
            raise AssertionError("scanned the host's process table")

        psutil.process_iter = psutil.pids = no_scan
        psutil.Process.children = no_scan
        from accel_harness.pool_hygiene import ChildWatch

        watch = ChildWatch()
        assert watch.subreaper
        print("first", watch.end_leftovers())
        out = subprocess.run(["sh", "-c", "sleep 122 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True).stdout
        done = subprocess.Popen([sys.executable, "-c", "pass"])  # ends unwaited: reaped, not reported
        os.waitid(os.P_PID, done.pid, os.WEXITED | os.WNOWAIT)
        import multiprocessing

        worker = multiprocessing.get_context("fork").Process(target=sys.exit, args=(3,))  # ends, never joined
        worker.start()
        os.waitid(os.P_PID, worker.pid, os.WEXITED | os.WNOWAIT)
        left = watch.end_leftovers()
        print("orphan", int(out), left)
        assert len(left) == 1 and left[0].startswith(f"pid {int(out)}: sleep 122"), left
        assert not os.path.exists(f"/proc/{int(out)}"), "the orphan still runs or was not reaped"
        assert not os.path.exists(f"/proc/{done.pid}"), "the ended child was not reaped"
        assert worker.exitcode == 3 and not multiprocessing.active_children()  # multiprocessing kept its exit code
        assert watch.end_leftovers() == []
        """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "first []" in proc.stdout


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc children files are Linux's")
def test_kept_children_files_survive_a_test_that_closes_them_and_reuses_the_numbers(tmp_path):
    import threading

    from accel_harness.pool_hygiene import _OwnChildrenFiles

    files = _OwnChildrenFiles()
    # children that earlier tests of this worker left running for the session (a fork server, its resource
    # tracker) are listed too; the test's own are what it adds
    earlier = set(files.children())
    kept = {tid: entry[0] for tid, entry in files.files.items()}
    decoy = tmp_path / "decoy"
    decoy.write_text("4242 4343\n")  # what a wrong read would take for pids
    reused = []
    for fd in kept.values():  # a test that closes every descriptor it did not open and opens files of its own
        os.close(fd)
        reused.append(os.open(decoy, os.O_RDONLY))
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    started = threading.Event()
    threaded = []

    def spawn():  # a child started by another thread is listed in that thread's own file
        threaded.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]))
        started.set()
        stop.wait()

    stop = threading.Event()
    worker = threading.Thread(target=spawn)
    worker.start()
    try:
        assert started.wait(300)
        assert sorted(set(files.children()) - earlier) == sorted([sleeper.pid, threaded[0].pid])
        assert all(os.read(fd, 100) == b"4242 4343\n" for fd in reused)  # the test's files were left alone
    finally:
        stop.set()
        worker.join()
        for proc in (sleeper, *threaded):
            proc.kill()
            proc.wait()
        for fd in reused:
            os.close(fd)
    assert set(files.children()) - earlier == set()
    files.close()
    assert files.files == {}


def test_leftovers_are_ended_where_the_kernel_has_no_pidfds(monkeypatch):
    import errno

    from accel_harness import pool_hygiene

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    found = pool_hygiene.descendants([os.getpid()])
    assert sleeper.pid in found

    def no_pidfd(pid, flags=0):
        raise OSError(errno.ENOSYS, "pidfd_open is not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd, raising=False)
    pool_hygiene.end_processes({sleeper.pid: found[sleeper.pid]}, grace=10.0)
    assert not psutil.pid_exists(sleeper.pid) or psutil.Process(sleeper.pid).status() == psutil.STATUS_ZOMBIE
    sleeper.wait(timeout=60)


def test_numpy_global_generator_is_compared_cheaply_and_put_back():
    import numpy

    from accel_harness.pool_hygiene import NumpyGlobalRng

    saved = numpy.random.get_state()
    try:
        baseline = NumpyGlobalRng()
        assert baseline.address is not None, "the raw-state copy should be usable with this NumPy"
        assert not baseline.moved()
        first = numpy.random.rand(4)
        assert baseline.moved()
        baseline.restore()
        assert not baseline.moved() and numpy.array_equal(numpy.random.rand(4), first)
        baseline.restore()
        numpy.random.standard_normal(1)  # a cached normal: the legacy state's extra fields
        baseline.restore()
        assert numpy.random.get_state()[3] == saved[3] or numpy.random.get_state()[3] == baseline.state[3]
        assert numpy.array_equal(numpy.random.rand(4), first)
        baseline.restore()
        if hasattr(numpy.random, "set_bit_generator"):  # a test that swaps the global bit generator
            numpy.random.set_bit_generator(numpy.random.MT19937(3))
            assert baseline.moved()
            baseline.restore()
            assert numpy.random.mtrand._rand._bit_generator is baseline.bit_generator
            assert numpy.array_equal(numpy.random.rand(4), first)
    finally:
        numpy.random.set_state(saved)


def test_numpy_global_generator_without_a_raw_copy_is_set_every_time(monkeypatch):
    import numpy

    from accel_harness.pool_hygiene import NumpyGlobalRng

    saved = numpy.random.get_state()
    try:
        monkeypatch.setattr(NumpyGlobalRng, "_KEY_WORDS", 1)  # another layout: the copy does not match get_state
        baseline = NumpyGlobalRng()
        assert baseline.address is None and baseline.moved()
        first = numpy.random.rand(3)
        baseline.restore()
        assert numpy.array_equal(numpy.random.rand(3), first)
    finally:
        numpy.random.set_state(saved)


def test_environment_snapshot_sees_set_changed_and_removed_variables(monkeypatch):
    from accel_harness.pool_hygiene import EnvironSnapshot

    monkeypatch.setenv("ACCEL_SNAPSHOT_KEEP", "1")
    monkeypatch.setenv("ACCEL_SNAPSHOT_CHANGE", "a")
    snapshot = EnvironSnapshot()
    assert not snapshot.changed()
    for change in (lambda: os.environ.__setitem__("ACCEL_SNAPSHOT_NEW", "x"),
                   lambda: os.environ.__setitem__("ACCEL_SNAPSHOT_CHANGE", "b"),
                   lambda: os.environ.pop("ACCEL_SNAPSHOT_KEEP")):
        change()
        assert snapshot.changed()
        snapshot.restore()
        assert not snapshot.changed()
        assert os.environ["ACCEL_SNAPSHOT_KEEP"] == "1" and os.environ["ACCEL_SNAPSHOT_CHANGE"] == "a"
        assert "ACCEL_SNAPSHOT_NEW" not in os.environ


def test_stale_pool_folders_are_removed_and_live_ones_kept(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"{POOL_DIR_PREFIX}cpu-2-stale"
    stale.mkdir()
    (stale / "owner").write_text(f"{dead.pid} 1.0\n")
    (stale / "store").write_text("x")
    live = tmp_path / f"{POOL_DIR_PREFIX}cpu-2-live"
    live.mkdir()
    write_owner(str(live))
    reused = tmp_path / f"{POOL_DIR_PREFIX}cpu-4-reused"  # our pid, but another start time: a reused pid
    reused.mkdir()
    (reused / "owner").write_text(f"{os.getpid()} 12345.0\n")
    legacy = tmp_path / f"{POOL_DIR_PREFIX}cpu-1-legacy"  # no owner record: stale after an hour
    legacy.mkdir()
    os.utime(legacy, (time.time() - 7200, time.time() - 7200))
    fresh_legacy = tmp_path / f"{POOL_DIR_PREFIX}cpu-1-recent"
    fresh_legacy.mkdir()
    half_written = tmp_path / f"{POOL_DIR_PREFIX}cpu-2-starting"  # another session between mkdir and its record
    half_written.mkdir()
    (half_written / "owner").write_text("")
    other = tmp_path / "not-ours"
    other.mkdir()
    removed = remove_stale_pool_dirs(str(tmp_path))
    assert sorted(os.path.basename(p) for p in removed) == sorted([stale.name, reused.name, legacy.name])
    assert live.exists() and fresh_legacy.exists() and half_written.exists() and other.exists()


class _Devices:
    """A backend stand-in with ``count`` devices behind ``visible_devices_env``."""

    visible_devices_env = "FAKE_VISIBLE_DEVICES"

    def __init__(self, count: int):
        self.count = count

    def device_count(self) -> int:
        return self.count


@pytest.mark.parametrize(("devices", "world", "expected"), [
    (4, 2, {"gw0": "0,1", "gw1": "2,3"}),  # a slice of two per worker holds a two-rank test
    (4, 1, {"gw0": "0,1", "gw1": "2,3"}),
    (2, 1, {"gw0": "0", "gw1": "1"}),
    (2, 2, {"gw0": None, "gw1": None}),  # one device per worker cannot hold two ranks: every worker sees both
    (4, 4, {"gw0": None, "gw1": None}),
])
def test_each_xdist_worker_gets_a_slice_that_holds_the_tests_ranks(monkeypatch, devices, world, expected):
    from accel_harness.plugin import _visible_devices_env

    monkeypatch.delenv(_Devices.visible_devices_env, raising=False)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    for worker, visible in expected.items():
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        env = _visible_devices_env(_Devices(devices), world)
        assert env.get(_Devices.visible_devices_env) == visible, (worker, env)


class _Named:
    def __init__(self, name: str, start_method: str, is_host: bool):
        self.name, self.start_method, self.is_host = name, start_method, is_host


class _Session:
    """A harness context stand-in: the selected backends and their objects."""

    def __init__(self, *backends: _Named):
        self.selected = [b.name for b in backends]
        self._by_name = {b.name: b for b in backends}

    def backend(self, name: str) -> _Named:
        return self._by_name[name]


def test_forking_pools_fork_from_a_server_when_a_device_backend_shares_the_session():
    from accel_harness.rank_runs import pool_start_method

    cpu, emu = _Named("cpu", "fork", True), _Named("emu", "spawn", False)
    assert pool_start_method(_Session(cpu), cpu) == "fork"
    assert pool_start_method(_Session(cpu, emu), cpu) == "forkserver"  # emu's backward starts autograd's threads
    assert pool_start_method(_Session(cpu, emu), emu) == "spawn"


def test_a_rank_forked_after_a_device_backward_fails_and_one_from_a_server_does_not(tmp_path):
    """Why the rule above exists, on this torch: the host process runs a backward on emu first."""
    pytest.importorskip("accel_emu")
    script = tmp_path / "probe.py"
    script.write_text(
        "import multiprocessing as mp, sys, torch\n"
        "import accel.backends as b\n"
        "def child(q):\n"
        "    try:\n"
        "        y = torch.ones(3, requires_grad=True); (y * 2).sum().backward(); q.put('ok')\n"
        "    except RuntimeError as exc:\n"
        "        q.put(str(exc)[:120])\n"
        "if __name__ == '__main__':\n"
        "    x = torch.ones(3, device=b.get_backend('emu').device(0), requires_grad=True); (x * 2).sum().backward()\n"
        "    for method in ('fork', 'forkserver'):\n"
        "        ctx = mp.get_context(method); q = ctx.Queue(); p = ctx.Process(target=child, args=(q,)); p.start()\n"
        "        print(method, q.get(timeout=120)); p.join()\n")
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.strip().splitlines())
    assert lines["forkserver"] == "ok" and "fork-based multiprocessing" in lines["fork"], proc.stdout


def test_spawn_only_backends_fork_ranks_from_a_server_only_where_they_allow_it():
    from accel_harness.rank_runs import pool_start_method

    plain, allowing = _Named("dev", "spawn", False), _Named("dev2", "spawn", False)
    allowing.fork_server_ranks = True
    assert pool_start_method(_Session(plain), plain) == "spawn"
    assert pool_start_method(_Session(allowing), allowing) == "forkserver"


def _rank_sees_the_variables(rank, expected):
    import os

    seen = {name: os.environ.get(name) for name in expected}
    assert seen == expected, seen


def test_ranks_forked_from_a_server_get_the_environment_of_the_pool_start(monkeypatch):
    """The fork server keeps the environment it started with; a later pool's ranks must see today's, as
    spawned ranks would (a variable changed, and one removed, after the server started)."""
    import pickle

    from accel_harness.distributed import RankPool, Task

    def run(expected):
        pool = RankPool("cpu", 2, "forkserver", timeout=120)
        pool.start()
        try:
            return pool.run(Task(__name__, __file__, _rank_sees_the_variables.__qualname__,
                                 pickle.dumps({"rank": None, "expected": expected})))
        finally:
            pool.close()

    monkeypatch.setenv("ACCEL_TEST_POOL_PROBE", "first")
    monkeypatch.setenv("ACCEL_TEST_POOL_GONE", "here")
    result = run({"ACCEL_TEST_POOL_PROBE": "first", "ACCEL_TEST_POOL_GONE": "here"})  # the server starts now
    assert result.status == "passed", result.message
    monkeypatch.setenv("ACCEL_TEST_POOL_PROBE", "second")
    monkeypatch.delenv("ACCEL_TEST_POOL_GONE")
    result = run({"ACCEL_TEST_POOL_PROBE": "second", "ACCEL_TEST_POOL_GONE": None})
    assert result.status == "passed", result.message
