"""accel.checkpointing: crashes (killed runs, killed saves, exceptions mid-save), rotation with total_limit
(also in a fresh process), and replacing an existing (read-only) checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from accel import checkpointing as C
from tests.scripts import ckpt_train
from _checkpoint_helpers import auto, hidden, make
from _waits import SAFETY_NET_S

REPO = Path(__file__).resolve().parents[3]


# ---------------------------------------------------------------------------------------------- crashes
def _train(project: Path, losses: Path, kill_at: int | None = None, resume: bool = False) -> int:
    """ckpt_train.py's run (32 steps, a checkpoint every 5) in a fresh forked process; the child's pid."""
    return ckpt_train.start_in_fork(str(project), str(losses), steps=32, save_every=5, kill_at=kill_at, resume=resume)


def _exit_status(pid: int) -> int:
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _losses(path: Path) -> dict[int, str]:
    return {int(step): value for step, value in (line.split() for line in path.read_text().splitlines())}


def test_sigkilled_run_resumes_identically(tmp_path):
    children = [_train(tmp_path / "ref", tmp_path / "ref.txt"), _train(tmp_path / "run", tmp_path / "run.txt", kill_at=23)]
    assert [_exit_status(pid) for pid in children] == [0, -signal.SIGKILL]  # the reference ran through; the run was killed
    checkpoints = tmp_path / "run" / "checkpoints"
    assert sorted(os.listdir(checkpoints)) == ["checkpoint_1", "checkpoint_2", "checkpoint_3"]  # total_limit=3

    assert _exit_status(_train(tmp_path / "run", tmp_path / "resumed.txt", resume=True)) == 0
    ref, run, res = _losses(tmp_path / "ref.txt"), _losses(tmp_path / "run.txt"), _losses(tmp_path / "resumed.txt")
    assert sorted(run) == list(range(1, 24)) and all(run[k] == ref[k] for k in run)
    # resumed from checkpoint_3 (step 20, mid-epoch: 4 of 8 batches seen) and continued bitwise
    assert sorted(res) == list(range(21, 33))
    assert [res[k] for k in res] == [ref[k] for k in res]
    # numbering continued after checkpoint_3 (steps 25 and 30), total_limit=3 still applies
    assert sorted(os.listdir(checkpoints)) == ["checkpoint_3", "checkpoint_4", "checkpoint_5"]


def _die_in_child(action) -> int:
    """Run ``action`` in a forked child that may os._exit mid-way; return its exit status."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 0
        try:
            action()
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _crash_at(point: str):
    """A patch that kills the process while writing files, or at the first or second rename."""
    real_replace, real_save = os.replace, C.serialization.torch_save
    calls = {"save": 0, "replace": 0}

    def save(obj, path):
        calls["save"] += 1
        if point == "writing" and calls["save"] == 2:
            os._exit(17)
        real_save(obj, path)

    def replace(src, dst):
        calls["replace"] += 1
        if point == f"replace-{calls['replace']}":
            os._exit(17)
        real_replace(src, dst)

    def install():
        C.serialization.torch_save = save
        os.replace = replace  # the os module itself: the child dies anyway

    return install


@pytest.mark.parametrize("point", ["writing", "replace-1"])  # replace-1: renaming the temp dir into place
def test_killed_mid_save_keeps_previous_checkpoint_automatic(tmp_path, point):
    s = make(counter=10, project_config=auto(tmp_path))
    s.accelerator.save_state()
    s.counter.value = 11

    def doomed():
        _crash_at(point)()
        s.accelerator.save_state()

    assert _die_in_child(doomed) == 17
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == ["checkpoint_0"]
    assert len(hidden(root)) == 1 and ".checkpoint_1.tmp-" in hidden(root)[0]

    s.counter.value = 99
    s.accelerator.load_state()  # the temp dir is not a candidate
    assert s.counter.value == 10
    assert s.accelerator.project_configuration.iteration == 1
    s.accelerator.save_state()
    assert hidden(root) == []  # cleaned up by the next save
    assert sorted(os.listdir(root)) == ["checkpoint_0", "checkpoint_1"]


# replace-1 moves the old directory aside, replace-2 renames the new one into place
@pytest.mark.parametrize("point", ["writing", "replace-1", "replace-2"])
def test_killed_while_replacing_an_existing_directory(tmp_path, point):
    s = make(counter=10)
    target = tmp_path / "ck"
    s.accelerator.save_state(target)
    s.counter.value = 11

    def doomed():
        _crash_at(point)()
        s.accelerator.save_state(target)

    assert _die_in_child(doomed) == 17
    s.counter.value = 99
    if point == "replace-2":  # old moved aside, new not yet renamed in: load finds the moved copy
        assert not target.exists()
        with pytest.warns(UserWarning, match="moved aside"):
            s.accelerator.load_state(target)
    else:
        s.accelerator.load_state(target)
    assert s.counter.value == 10

    s.counter.value = 12
    s.accelerator.save_state(target)
    assert hidden(tmp_path) == []
    s.counter.value = 99
    s.accelerator.load_state(target)
    assert s.counter.value == 12


def test_exception_mid_save_leaves_previous_and_no_temp(tmp_path, monkeypatch):
    s = make(counter=5)
    target = tmp_path / "ck"
    s.accelerator.save_state(target)
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    real = C.serialization.torch_save

    def failing(obj, path):
        if Path(path).name == "optimizer.bin":
            raise OSError(28, "No space left on device")
        real(obj, path)

    monkeypatch.setattr(C.serialization, "torch_save", failing)
    s.counter.value = 6
    with pytest.raises(OSError, match="No space left"):
        s.accelerator.save_state(target)
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    assert hidden(tmp_path) == []
    assert s.accelerator.project_configuration.iteration == 1  # only the successful save counted


def test_unloadable_state_is_refused_at_save_time(tmp_path):
    import numpy as np

    class NumpyState:
        def state_dict(self):
            return {"best": np.float64(0.5)}

        def load_state_dict(self, state):
            pass

    s = make(counter=None)
    s.accelerator.register_for_checkpointing(NumpyState())
    with pytest.raises(TypeError, match=r"registered object 0 \(NumpyState\).*\['best'\].*numpy"):
        s.accelerator.save_state(tmp_path / "ck")
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------------------------------------- rotation
def test_total_limit_keeps_newest_and_load_picks_highest_number(tmp_path):
    s = make(counter=0, project_config=auto(tmp_path, total_limit=2))
    for i in range(4):
        s.counter.value = i
        assert s.accelerator.save_state() == os.path.join(str(tmp_path), "checkpoints", f"checkpoint_{i}")
    root = tmp_path / "checkpoints"
    assert sorted(os.listdir(root)) == ["checkpoint_2", "checkpoint_3"]
    assert s.accelerator.save_iteration == 4
    s.counter.value = 99
    s.accelerator.load_state()
    assert s.counter.value == 3

    # by number, not by name or mtime; a temp dir or a directory without manifest is never picked
    s.accelerator.project_configuration.total_limit = None
    s.accelerator.project_configuration.iteration = 9
    s.counter.value = 9
    s.accelerator.save_state()
    s.counter.value = 10
    s.accelerator.save_state()
    os.utime(root / "checkpoint_9", (2**31, 2**31))
    (root / ".checkpoint_11.tmp-abc-123").mkdir()
    (root / "checkpoint_12").mkdir()
    s.counter.value = 99
    s.accelerator.load_state()
    assert s.counter.value == 10
    assert s.accelerator.save_iteration == 13  # numbering continues after the highest existing
    with pytest.raises(ValueError, match="already exists"):
        s.accelerator.project_configuration.iteration = 10
        s.accelerator.save_state()


# ---------------------------------------------------------------------------------------------- faults
ROTATION_SCRIPT = REPO / "tests" / "scripts" / "rotation_fresh.py"


def _rotation_in_fresh_process(base: Path, *libs: str) -> dict[str, dict[str, dict]]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    env.pop("ACCEL_DEVICE", None)
    done = subprocess.run([sys.executable, str(ROTATION_SCRIPT), str(base), *libs], env=env, capture_output=True,
                          text=True, timeout=SAFETY_NET_S)
    assert done.returncode == 0, done.stderr[-3000:]
    rows: dict[str, dict[str, dict]] = {lib: {} for lib in libs}
    for row in map(json.loads, done.stdout.splitlines()):
        rows[row.pop("lib")][row["scenario"]] = row
    return rows


def test_total_limit_in_a_fresh_process_keeps_the_checkpoint_it_wrote(tmp_path):
    """A new process (no load_state) saving into a project that already holds checkpoints: each save
    returns a folder that exists, and rotation retires the folders Accelerate retires, in its order."""
    with_reference = __import__("importlib").util.find_spec("accelerate") is not None
    rows = _rotation_in_fresh_process(tmp_path, "accel", *(["accelerate"] if with_reference else []))
    ours = rows["accel"]
    for row in ours.values():
        for path, exists in row["saves"]:
            assert path == "error" or exists, row
    # the case: checkpoint_5..7 exist; checkpoint_0 is written and kept (5, then 0, retired later)
    assert ours["gap"]["saves"] == [["checkpoints/checkpoint_0", True], ["checkpoints/checkpoint_1", True]]
    assert ours["gap"]["left"] == {"checkpoint_1": "new", "checkpoint_6": "old", "checkpoint_7": "old"}
    assert ours["over"]["left"] == {"checkpoint_1": "new", "checkpoint_3": "old", "checkpoint_4": "old"}
    # checkpoint_0..2 exist: the first save replaces checkpoint_0 (retired anyway); the second finds
    # checkpoint_1 in its way and raises before deleting anything (Accelerate deletes the new checkpoint_0 first)
    assert ours["full"]["saves"] == [["checkpoints/checkpoint_0", True], ["error", True]]
    assert ours["full"]["left"] == {"checkpoint_0": "new", "checkpoint_1": "old", "checkpoint_2": "old"}
    if with_reference:
        reference = rows["accelerate"]
        for name in ("gap", "over"):
            assert ours[name] == reference[name]
        assert ours["full"]["saves"] == reference["full"]["saves"]


def test_replacing_a_read_only_checkpoint_leaves_no_old_copy(tmp_path):
    s = make()
    folder = tmp_path / "ck"
    s.accelerator.save_state(folder)
    (folder / "notes.txt").write_text("mine")
    (folder / "sub").mkdir()
    (folder / "sub" / "kept.txt").write_text("mine too")
    for path in [folder / "sub", folder]:
        for entry in path.iterdir():
            entry.chmod(0o444) if entry.is_file() else None
        path.chmod(0o555)
    try:
        s.train(max_steps=1)
        s.accelerator.save_state(folder)
    finally:
        for path in [folder, folder / "sub"]:
            if path.exists():
                path.chmod(0o755)
    assert hidden(tmp_path) == []  # no .ck.old-* (nor .tmp-*) folder left behind
    assert (folder / "notes.txt").read_text() == "mine" and (folder / "sub" / "kept.txt").read_text() == "mine too"
    s.accelerator.load_state(folder)
