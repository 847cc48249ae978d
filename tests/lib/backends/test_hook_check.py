"""A device profile's hooks run first in a child process: a hook that aborts, exits, raises on import
or hangs, and a device spec that exits, become a profile error naming the hook and the file instead
of ending (or freezing) the process that loads the profile."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from accel.backends import hook_check

ROOT = Path(__file__).resolve().parents[3]

# what accel does with a profile in its own process: load it, then probe its backend
DRIVER = textwrap.dedent(
    """\
    import json, sys
    from accel.backends.profile import ProfileBackend, ProfileError, load_profile
    try:
        backend = ProfileBackend(load_profile(sys.argv[1]))
        availability = backend.availability
    except ProfileError as exc:
        print(json.dumps({"error": str(exc), "key": exc.key}))
        sys.exit(2)
    print(json.dumps({"available": bool(availability), "reason": availability.reason}))
    """
)

HOOKS = textwrap.dedent(
    """\
    import os, sys, threading
    CALLED = []

    def abort():
        os.abort()

    def exit3(*args):
        sys.exit(3)

    def hard_exit(*args):
        os._exit(5)

    def hang(*args):
        threading.Event().wait()

    def fails():
        raise RuntimeError("no device here")

    def yes():
        return True

    def no():
        return False

    def one():
        return 1
    """
)


def load_in_child(tmp_path: Path, profile: Path, timeout: str = "60") -> tuple[int, dict]:
    """Run the driver on ``profile`` with ``tmp_path`` importable; its exit status and its JSON line."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
           hook_check.TIMEOUT_ENV: timeout}
    env.pop(hook_check.CHECKED_ENV, None)
    # the limit only keeps a broken (unchecked) load from freezing the test session
    done = subprocess.run([sys.executable, "-c", DRIVER, str(profile)], env=env, cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return done.returncode, (json.loads(lines[-1]) if lines else {"stderr": done.stderr[-2000:]})


def profile_file(tmp_path: Path, module: str, hooks: dict[str, str]) -> Path:
    """A profile for the cpu under another name whose hooks point into ``module`` (written to tmp_path)."""
    (tmp_path / f"{module}.py").write_text(HOOKS)
    lines = "".join(f"  {name}: \"{target}\"\n" for name, target in hooks.items())
    path = tmp_path / "p.yaml"
    path.write_text(f"device: {{name: mycpu, device_type: cpu}}\nhooks:\n{lines}")
    return path


@pytest.mark.parametrize(("hooks", "hook", "what"), [
    ({"is_available": "os:abort"}, "is_available", "killed it with SIGABRT"),
    ({"is_available": "HOOKS:exit3"}, "is_available", "ended it with exit status 3"),
    ({"device_count": "HOOKS:hard_exit"}, "device_count", "ended it with exit status 5"),
    ({"is_available": "HOOKS:yes", "synchronize": "HOOKS:abort"}, "synchronize", "killed it with SIGABRT"),
], ids=["abort", "sys-exit-3", "os-exit-5", "device-hook-abort"])
def test_a_hook_that_ends_the_process_is_a_profile_error(tmp_path, hooks, hook, what):
    module = f"hooks_{hook}"
    path = profile_file(tmp_path, module, {k: v.replace("HOOKS", module) for k, v in hooks.items()})
    status, out = load_in_child(tmp_path, path)
    assert status == 2, out  # before: 134 (abort) or 3 / 5 (exit), with no word of why
    assert out["key"] == f"hooks.{hook}"
    assert str(path) in out["error"] and what in out["error"], out
    assert hooks[hook].replace("HOOKS", module) in out["error"]


def test_a_hanging_hook_is_stopped_after_the_timeout_setting(tmp_path):
    path = profile_file(tmp_path, "hooks_hang", {"is_available": "hooks_hang:hang"})
    status, out = load_in_child(tmp_path, path, timeout="0.5")
    assert status == 2, out  # before: the load never returned
    assert out["key"] == "hooks.is_available" and "hooks_hang:hang" in out["error"]
    assert "no sign of progress for 0.5 s" in out["error"] and hook_check.TIMEOUT_ENV in out["error"]


def test_a_hook_module_that_raises_on_import_is_a_profile_error(tmp_path):
    (tmp_path / "hooks_raise.py").write_text("raise RuntimeError('driver library missing')\n")
    path = tmp_path / "p.yaml"
    path.write_text("device: {name: mycpu, device_type: cpu}\nhooks:\n  seed: \"hooks_raise:seed\"\n")
    status, out = load_in_child(tmp_path, path)
    assert status == 2, out  # before: a RuntimeError traceback out of load_profile (status 1)
    assert out["key"] == "hooks.seed" and "RuntimeError: driver library missing" in out["error"]


def test_a_device_spec_that_exits_is_a_profile_error(tmp_path):
    path = tmp_path / "spec.py"
    path.write_text("import sys\nDEVICE_NAME = 'cpu'\nsys.exit(3)\n")
    status, out = load_in_child(tmp_path, path)
    assert status == 2, out  # before: 3, and nothing said
    assert str(path) in out["error"] and "executing the device spec" in out["error"]
    assert "exit status 3" in out["error"]


def test_a_spec_function_that_aborts_is_named(tmp_path):
    path = tmp_path / "spec.py"
    path.write_text("import os\nDEVICE_NAME = 'cpu'\nDEVICE_COUNT_FN = os.abort\n")
    status, out = load_in_child(tmp_path, path)
    assert status == 2, out
    assert out["key"] == "DEVICE_COUNT_FN" and "SIGABRT" in out["error"]


def test_hooks_that_raise_or_find_no_device_still_load(tmp_path):
    # a raising is_available means "unavailable" in a run; the device hooks are then never called
    path = profile_file(tmp_path, "hooks_fine", {"is_available": "hooks_fine:fails", "synchronize": "hooks_fine:abort"})
    status, out = load_in_child(tmp_path, path)
    assert status == 0 and out["available"] is False and "no device here" in out["reason"], out
    path = profile_file(tmp_path, "hooks_none", {"is_available": "hooks_none:no", "empty_cache": "hooks_none:abort"})
    status, out = load_in_child(tmp_path, path)
    assert status == 0 and out["available"] is False, out


def test_a_good_profile_is_checked_once_per_process_tree(tmp_path, monkeypatch):
    path = profile_file(tmp_path, "hooks_good", {"is_available": "hooks_good:yes", "device_count": "hooks_good:one"})
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(hook_check.CHECKED_ENV, "")
    runs = []
    real = hook_check._run_child
    monkeypatch.setattr(hook_check, "_run_child", lambda *a: runs.append(a) or real(*a))
    from accel.backends.profile import load_profile

    assert load_profile(path).hooks["device_count"] == "hooks_good:one"
    load_profile(path)
    assert len(runs) == 1 and runs[0][0]["hooks"]["is_available"] == "hooks_good:yes"
    assert hook_check._token(path) in os.environ[hook_check.CHECKED_ENV]  # ranks and pytest under qualify skip it
    path.write_text(path.read_text() + "# changed\n")
    load_profile(path)
    assert len(runs) == 2  # new bytes, new check


def test_a_bad_timeout_setting_is_a_profile_error(tmp_path, monkeypatch):
    path = profile_file(tmp_path, "hooks_timeout", {"is_available": "hooks_timeout:yes"})
    monkeypatch.setenv(hook_check.TIMEOUT_ENV, "soon")
    monkeypatch.setenv(hook_check.CHECKED_ENV, "")
    from accel.backends.profile import ProfileError, load_profile

    with pytest.raises(ProfileError, match=f"{hook_check.TIMEOUT_ENV} must be a number of seconds above 0, got 'soon'"):
        load_profile(path)


def test_accel_qualify_stops_with_usage_status_naming_the_hook(tmp_path):
    path = profile_file(tmp_path, "hooks_q", {"is_available": "os:abort"})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    env.pop(hook_check.CHECKED_ENV, None)
    done = subprocess.run([sys.executable, "-m", "accel.commands.cli", "qualify", "--profile", str(path),
                           "--no-bench", "-o", str(tmp_path / "out")],
                          env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]  # before: 134 and no output
    assert "hooks.is_available" in done.stderr and "os:abort" in done.stderr and "SIGABRT" in done.stderr


def test_a_process_a_hook_leaves_behind_does_not_hold_the_check(tmp_path):
    # the forked leftover holds the check's pipes forever; the check ends with the child and kills it
    (tmp_path / "hooks_leftover.py").write_text(textwrap.dedent(
        """\
        import os, pathlib, threading

        def is_available():
            marker = pathlib.Path(__file__).with_name("forked")
            if not marker.exists():  # the first call, in the check: leave a process behind
                marker.write_text("")
                if os.fork() == 0:
                    threading.Event().wait()
            return True
        """))
    path = tmp_path / "p.yaml"
    path.write_text("device: {name: mycpu, device_type: cpu}\nhooks:\n  is_available: \"hooks_leftover:is_available\"\n")
    status, out = load_in_child(tmp_path, path, timeout="0.5")
    assert status == 0 and out["available"] is True, out
