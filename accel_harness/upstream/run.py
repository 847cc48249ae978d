"""Running a suite under pytest for one backend, in an environment free of the caller's configuration."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .install import InstallResult
from .results import SuiteRun, _finish
from .source import Suite, rewrite_imports

#: hub variables set for the run unless asked online: the suite must not depend on the network
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


#: prefixes of the caller's variables an upstream run never sees (user configuration of accel and Accelerate)
CALLER_PREFIXES = ("ACCEL_", "ACCELERATE_")

#: variables that would point a run at the caller's own configuration or pytest options; PYTHONSAFEPATH
#: (which accel qualify sets for its own children) would stop the suite's ``python -m tests.x`` ranks from
#: finding its tests in the working folder, where a plain pytest run finds them
CALLER_VARIABLES = ("PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER", "PYTEST_PLUGINS", "HF_HOME", "HF_HUB_CACHE",
                    "TRANSFORMERS_CACHE", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "PYTHONSAFEPATH")


def backend_env(backend: str, others_visible: Mapping[str, str | None] | None = None) -> dict[str, str]:
    """Environment that puts a suite on ``backend``: ``ACCEL_DEVICE`` (accel and the harness honour it),
    the backend's own device settings (``Backend.device_environment``), and, for the other *available*
    backends with a visible-devices variable, that variable empty, so the upstream project's own
    device detection cannot pick them (``CUDA_VISIBLE_DEVICES=``).

    ``others_visible``: backend name -> visible-devices variable of the available backends
    (default: asked of accel's registry).
    """
    env = {"ACCEL_DEVICE": backend}
    try:
        from accel.backends import get_registry

        registry = get_registry()
        env.update(registry.get(backend).device_environment())  # the device's own settings travel along
        if others_visible is None:
            others_visible = {b.name: b.visible_devices_env for b in registry.available()}
    except Exception:  # a broken backend must not stop the run; the suite then sees every device
        others_visible = others_visible or {}
    for name, var in others_visible.items():
        if name != backend and var:
            env[var] = ""
    return env


def caller_free_environment(base: Mapping[str, str], home: str | os.PathLike[str], *, offline: bool = True,
                            keep: Sequence[str] = ()) -> dict[str, str]:
    """``base`` without the caller's accel/Accelerate configuration, with ``home`` as a fresh home folder.

    ``keep`` names variables to keep anyway (set by the run itself, e.g. ``ACCEL_DEVICE``).
    """
    home = Path(home)
    env = {k: v for k, v in base.items()
           if k in keep or not (k.startswith(CALLER_PREFIXES) or k in CALLER_VARIABLES)}
    for sub in (".cache", ".config", ".local/share"):
        (home / sub).mkdir(parents=True, exist_ok=True)
    env.update({"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"), "XDG_CONFIG_HOME": str(home / ".config"),
                "XDG_DATA_HOME": str(home / ".local" / "share"), "HF_HOME": str(home / ".cache" / "huggingface")})
    if offline:
        env.update(OFFLINE_ENV)
    return env


def harness_option(dest: str, default: str) -> str:
    """The command-line spelling of the harness plugin's option stored in ``dest`` (its longest name),
    asked of the plugin's own ``pytest_addoption``, so a renamed or prefixed option still works."""

    class _Recorder:
        def __init__(self) -> None:
            self.options: list[tuple[tuple[str, ...], dict[str, Any]]] = []

        def getgroup(self, *args: Any, **kwargs: Any) -> "_Recorder":
            return self

        def addoption(self, *names: str, **kwargs: Any) -> None:
            self.options.append((names, kwargs))

        _addoption = addoption

        def __getattr__(self, name: str) -> Callable[..., None]:
            return lambda *args, **kwargs: None

    recorder = _Recorder()
    try:
        from .. import plugin

        plugin.pytest_addoption(recorder)  # type: ignore[arg-type]
    except Exception:
        return default
    for names, kwargs in recorder.options:
        if kwargs.get("dest") == dest:
            longs = [n for n in names if n.startswith("--")]
            if longs:
                return max(longs, key=len)
    return default


def _pytest_timeout_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("pytest_timeout") is not None


def run_suite(suite: Suite, backend: str, out_dir: str | os.PathLike[str], *, against: str | None = None,
              workers: int = 0, test_timeout: float | None = 600.0, session_timeout: float | None = None,
              offline: bool = True, keyword: str | None = None, known_issues: str | None = None,
              pytest_args: Sequence[str] = (), install: InstallResult | None = None,
              on_line: Callable[[str], None] | None = None, python: str | os.PathLike[str] | None = None) -> SuiteRun:
    """Run ``suite`` on ``backend`` (against ``against``; default: the project itself) into ``out_dir``.

    Layout: ``out_dir/work/<side>-<backend>/`` (the copy that runs), ``out_dir/results/<side>-<backend>.jsonl``
    (completed records; the report's input), ``out_dir/logs/<side>-<backend>.{log,junit.xml}``.
    ``on_line`` gets each line pytest prints (progress display). ``python``: the interpreter of the
    suite's own environment (see :mod:`accel_harness.upstream_env`; default: this one). The run sees
    none of the caller's accel/Accelerate configuration: a temporary home under its work folder, no
    ``ACCEL_*``/``ACCELERATE_*`` variables but the backend's own.
    """

    out_dir = Path(out_dir)
    side = against or suite.project
    tag = f"{suite.project}-{suite.version or 'local'}-against-{side}-{backend}"
    work = out_dir / "work" / tag
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    tests = work / suite.tests_dir.name
    shutil.copytree(suite.tests_dir, tests, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache"))
    _pytest_config(suite, work)
    rewritten = rewrite_imports(tests, suite.project, against) if against and against != suite.project else 0
    raw_dir, logs, results = work / "raw", out_dir / "logs", out_dir / "results"
    logs.mkdir(parents=True, exist_ok=True)
    results.mkdir(parents=True, exist_ok=True)
    junit = logs / f"{tag}.junit.xml"
    log = logs / f"{tag}.log"
    # the backend goes by ACCEL_DEVICE (backend_env), not by an option an upstream conftest might define too
    python = str(python or sys.executable)
    cmd = [python, "-m", "pytest", tests.name, "-p", "no:cacheprovider", "-v", "--no-header", "-rfE",
           "--continue-on-collection-errors",
           harness_option("accel_results_dir", "--results-dir"), str(raw_dir), "--junitxml", str(junit), "-o", "junit_family=xunit1"]
    if workers:
        cmd += ["-n", str(workers)]
    if test_timeout and _pytest_timeout_available():
        cmd += ["--timeout", f"{test_timeout:g}"]
    if keyword:
        cmd += ["-k", keyword]
    if known_issues:
        cmd += [harness_option("accel_known_issues", "--known-issues"), known_issues]
    cmd += list(pytest_args)
    device_env = backend_env(backend)
    env = caller_free_environment(os.environ, work / "home", offline=offline, keep=tuple(device_env))
    env.update({"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **device_env})
    # commands the tests start (accel launch, torchrun, accelerate) come from the suite's environment first
    env["PATH"] = os.pathsep.join([str(Path(python).parent), env.get("PATH", "")])
    env["VIRTUAL_ENV"] = str(Path(python).parent.parent)
    start = time.perf_counter()
    from ..progress import run_streamed

    header = "$ " + " ".join(cmd) + f"\n# cwd {work}; ACCEL_DEVICE={backend}; rewritten files: {rewritten}\n"
    try:
        exit_code = run_streamed(cmd, log, on_line=on_line, env=env, cwd=work, timeout=session_timeout or None,
                                 header=header)
    except KeyboardInterrupt:
        _finish(suite, backend, side, raw_dir, junit, results / f"{tag}.jsonl", None, install, rewritten, log, python)
        raise
    final = results / f"{tag}.jsonl"
    block = _finish(suite, backend, side, raw_dir, junit, final, exit_code, install, rewritten, log, python)
    from ..records import read_records

    _, recs, _ = read_records(final)
    counts: dict[str, int] = {}
    for rec in recs:
        counts[rec["outcome"]] = counts.get(rec["outcome"], 0) + 1
    return SuiteRun(backend, side, block["status"], exit_code, final, log, counts, block["collection_errors"],
                    time.perf_counter() - start)


_PYTEST_SECTIONS = {"pytest.ini": "[pytest]", ".pytest.ini": "[pytest]", "pyproject.toml": "[tool.pytest.ini_options]",
                    "tox.ini": "[pytest]", "setup.cfg": "[tool:pytest]"}


def _pytest_config(suite: Suite, work: Path) -> Path:
    """Give the run its upstream project's own pytest configuration (copied from the source tree),
    or an empty ``pytest.ini``: either stops pytest's upward search, so the configuration of a
    project the output folder happens to sit in (its markers, ``--strict-markers``) never applies."""
    if suite.root != suite.tests_dir:
        for name, section in _PYTEST_SECTIONS.items():
            candidate = suite.root / name
            if candidate.is_file() and section in candidate.read_text(encoding="utf-8", errors="replace"):
                shutil.copy2(candidate, work / name)
                return work / name
    target = work / "pytest.ini"
    target.write_text("[pytest]\n", encoding="utf-8")
    return target
