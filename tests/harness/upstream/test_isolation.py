"""``accel qualify --upstream`` installs into an environment of its own and runs without the caller's
configuration: the active environment's packages are the same afterwards, a failed install's reason
reaches the console, the pip log and the report, and a user's config file or ``ACCEL_*`` variables
change nothing in the run."""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile
from pathlib import Path

from accel_harness.records import read_records
from accel_harness.upstream import caller_free_environment


def _wheel(folder: Path, name: str, version: str, module_source: str) -> Path:
    """A minimal, valid pure-Python wheel, built by hand (no build backend, no network)."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": module_source,
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{dist}/top_level.txt": f"{name}\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{dist}/RECORD,,")
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
        zf.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")
    return wheel


def _project(tmp_path: Path) -> Path:
    root = tmp_path / "isoproj-1.0"
    (root / "src" / "isoproj").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "PKG-INFO").write_text(
        "Metadata-Version: 2.1\nName: isoproj\nVersion: 1.0\nProvides-Extra: testing\n"
        'Requires-Dist: isodep==1.0; extra == "testing"\n'
        'Requires-Dist: isobroken==1.0; extra == "testing"\n'
        'Requires-Dist: no-such-dependency==9.9; extra == "testing"\n')
    (root / "src" / "isoproj" / "__init__.py").write_text("VALUE = 1\n")
    (root / "tests" / "test_iso.py").write_text(
        "import os\n\n"
        "def test_dependency_from_the_suite_environment():\n"
        "    import isodep\n    assert isodep.ANSWER == 42\n\n"
        "def test_commands_come_from_the_suite_environment():\n"
        "    import shutil, subprocess, sys\n"
        "    script = shutil.which('accel')\n"
        "    assert os.path.dirname(script) == os.path.dirname(sys.executable), script  # the suite's own bin folder\n"
        "    out = subprocess.run([script, '--version'], capture_output=True, text=True)\n"
        "    assert out.returncode == 0 and out.stdout.startswith('accel '), out.stderr\n"
        "    code = 'import isodep; print(isodep.ANSWER)'\n"
        "    launched = subprocess.run(['python', '-c', code], capture_output=True, text=True)\n"
        "    assert launched.stdout.strip() == '42', launched.stderr\n\n"
        "def test_no_caller_configuration():\n"
        "    leaked = sorted(k for k in os.environ if k.startswith(('ACCEL_', 'ACCELERATE_')) and k != 'ACCEL_DEVICE')\n"
        "    assert leaked == []\n"
        "    assert not os.path.exists(os.path.expanduser('~/.cache/accel/default_config.yaml'))\n"
        "    assert os.environ['HF_HUB_OFFLINE'] == '1'\n")
    return root


def _freeze() -> list[str]:
    """Every distribution the active environment holds, NAME==VERSION at its place (what ``pip freeze --all``
    reads, read here without starting pip each time)."""
    import importlib
    from importlib.metadata import distributions

    importlib.invalidate_caches()  # the folders are read afresh
    return sorted(f"{dist.metadata['Name']}=={dist.version} {dist.locate_file('')}" for dist in distributions())


def test_upstream_dependencies_go_to_their_own_environment_and_failures_are_reported(tmp_path, monkeypatch, capsys):
    wheels = tmp_path / "wheels"
    _wheel(wheels, "isodep", "1.0", "ANSWER = 42\n")
    _wheel(wheels, "isobroken", "1.0", "raise ImportError('built for another torch')\n")
    root = _project(tmp_path)
    # the user's own configuration, which the run must not see
    user_cache = tmp_path / "user-cache"
    (user_cache / "accel").mkdir(parents=True)
    (user_cache / "accel" / "default_config.yaml").write_text("compute_environment: LOCAL_MACHINE\nbackend: cpu\nnum_processes: 4\n")
    before = _freeze()
    out = tmp_path / "q"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root / "src"), "XDG_CACHE_HOME": str(user_cache),
           "ACCELERATE_MIXED_PRECISION": "fp16", "ACCEL_HANG_TIMEOUT": "5"}
    env.pop("ACCEL_DEVICE", None)
    # qualify runs through main() in this process, in that environment (the suite, pip and the report run as
    # processes of their own either way; test_qualify.py's Ctrl-C test starts the command as one)
    from accel.commands.cli import main

    monkeypatch.chdir(tmp_path)
    for name in set(os.environ) - set(env):
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code = main(["qualify", "--upstream", str(root), "--no-bench", "--pip-args", f"--no-index --find-links {wheels}",
                 "-o", str(out)])
    first = capsys.readouterr()
    text = first.out + first.err
    assert code == 0, text  # the suite passed (what could not be installed is reported, not a failure)
    assert _freeze() == before  # nothing installed into, or removed from, the active environment

    assert "the active one is not changed" in text, text
    assert "not installed: no-such-dependency==9.9:" in text  # the reason on the console
    assert "not installed: isobroken==1.0: installed, but import isobroken: ImportError: built for another torch" in text
    pip_log = (out / "logs" / "pip-install.log").read_text()
    assert "no-such-dependency" in pip_log and "$ " in pip_log  # every pip command with its whole output
    header, records, _ = read_records(out / "results" / "isoproj-1.0-against-isoproj-cpu.jsonl")
    outcomes = {r["nodeid"].split("::")[-1]: r["outcome"] for r in records}
    assert outcomes == {"test_dependency_from_the_suite_environment": "passed", "test_no_caller_configuration": "passed",
                        "test_commands_come_from_the_suite_environment": "passed"}, text
    assert set(header["extra"]["upstream"]["install"]["failed"]) == {"no-such-dependency==9.9", "isobroken==1.0"}
    md = (out / "report" / "report.md").read_text()
    assert "Not installed for" in md and "no-such-dependency==9.9 (" in md and "built for another torch" in md
    envs = list((user_cache / "accel" / "upstream-envs").glob("isoproj-1.0-*/accel-upstream-env.json"))
    assert len(envs) == 1  # the suite's venv lives in accel's cache, and is kept for the next run

    # a second run (one test of the suite) reuses that environment
    code = main(["qualify", "--upstream", str(root), "--no-bench", "--pip-args", f"--no-index --find-links {wheels}",
                 "-k", "test_no_caller_configuration", "-o", str(tmp_path / "q2")])
    again = capsys.readouterr()
    assert code == 0 and "(reused)" in again.out, again.out + again.err
    _, records, _ = read_records(tmp_path / "q2" / "results" / "isoproj-1.0-against-isoproj-cpu.jsonl")
    assert [(r["nodeid"].split("::")[-1], r["outcome"]) for r in records] == [("test_no_caller_configuration", "passed")]
    assert _freeze() == before


def test_caller_free_environment_drops_user_configuration(tmp_path):
    base = {"PATH": "/bin", "ACCEL_CONFIG_FILE": "/x.yaml", "ACCELERATE_USE_CPU": "1", "ACCEL_DEVICE": "cpu",
            "PYTEST_ADDOPTS": "-x", "HF_HOME": "/hf", "HOME": "/root", "CUDA_VISIBLE_DEVICES": "0",
            "PYTHONSAFEPATH": "1"}
    env = caller_free_environment(base, tmp_path / "home", keep=("ACCEL_DEVICE",))
    assert env["PATH"] == "/bin" and env["CUDA_VISIBLE_DEVICES"] == "0" and env["ACCEL_DEVICE"] == "cpu"
    # PYTHONSAFEPATH would hide the suite's own tests from the `python -m tests.x` ranks it starts
    assert not {"ACCEL_CONFIG_FILE", "ACCELERATE_USE_CPU", "PYTEST_ADDOPTS", "PYTHONSAFEPATH"} & set(env)
    assert env["HOME"] == str(tmp_path / "home") and env["HF_HOME"].startswith(str(tmp_path / "home"))
    assert env["HF_HUB_OFFLINE"] == "1" and (tmp_path / "home" / ".cache").is_dir()
    assert "HF_HUB_OFFLINE" not in caller_free_environment({}, tmp_path / "h2", offline=False)
