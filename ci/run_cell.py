"""Run one cell of the nightly matrix: its environment, the suites, the operator sweep, the benchmarks.

    python -m ci.run_cell --cell cpu-torch2.13.0-py3.11 --out results
                          [--matrix ci/matrix.yaml] [--profile local] [--pip-args "..."]
                          [--venv-cache DIR] [--reuse-venv] [--python PYTHON]
                          [--bench off|quick|full] [--ops off|quick|full] [-k EXPR] [--dry-run]

What it does, in order (every command's output goes to ``OUT/CELL/logs/<step>.log``):

1. a virtual environment for the cell (``python -m venv``) in ``VENV_CACHE/<cell id>`` from the
   cell's python (``--python``, else this interpreter when its version matches, else
   ``python3.X`` on PATH); a ``preinstalled`` cell's environment sees the system site-packages;
2. torch, **first and pinned**, with the cell's install spec (index URL, ``--pre``, ...; the install
   profile, ``--pip-args`` and ``$ACCEL_CI_PIP_ARGS`` adjust it); the installed ``torch.__version__``
   must be the cell's version, or the cell stops here;
3. accel from this checkout (``pip install -e <repo>[test]``) under a constraint that pins the torch
   just installed, so pip can never swap it for another build; torch is checked again;
4. the conformance suites: ``pytest <repo>/suites -m <backend> --backend <backend>
   --world-sizes ... --results-dir OUT/CELL/results --junitxml OUT/CELL/junit.xml`` (the JUnit file
   stays outside ``results/``: the report reads the harness records, which carry more detail);
5. ``accel ops`` (the operator sweep, quick or full, per the matrix) into ``OUT/CELL/ops`` unless
   it is off: ``-n`` the cell's workers (else the CPU count), the matrix's known issues; its result
   records land in ``OUT/CELL/ops/results`` for the report;
6. ``accel bench`` (quick or full, per the matrix) into ``OUT/CELL/bench`` unless it is off (last:
   the benchmarks want a quiet machine);
7. ``OUT/CELL/cell.json``: the cell (id, backend, torch requested and installed, python, runner
   labels, install), start and end times, every command with its exit code and duration, the
   suites' and the operator sweep's outcome counts.

Exit status: **0 whenever the environment was built**, also when tests or operator rows failed
(``accel ops`` exit 1) or the benchmarks broke: test failures are data (in the results and in
cell.json, judged later by ``accel report``), not a crash of the cell. 3 when the environment could not be built (no such python, venv or pip
failure, torch not the requested version, accel not importable); cell.json then says why. 2 for a
usage error (unknown cell, bad matrix file, an output folder that is not a cell's).

``--reuse-venv`` keeps an environment built earlier for the same cell, install spec, pip arguments
and python (recorded in ``VENV/accel-ci.json``) and skips the venv and torch steps; accel is still
reinstalled and torch checked. Without it the environment is rebuilt from scratch.
``--dry-run`` prints the commands and creates nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ci.cell_steps import Step, count_outcomes, in_github, run_logged, utc_now
from ci.matrix import (BENCH_MODES, DEFAULT_MATRIX, OPS_MODES, PROFILE_ENV, REPO, Cell, MatrixError, load_matrix,
                       version_matches)

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_ENVIRONMENT = 3

PIP_ARGS_ENV = "ACCEL_CI_PIP_ARGS"
VENV_CACHE_ENV = "ACCEL_CI_VENV_CACHE"
STAMP = "accel-ci.json"
CONSTRAINTS = "accel-ci-constraints.txt"
CELL_SCHEMA = "accel.ci.cell"
CELL_SCHEMA_VERSION = "1.0"

#: prints what the cell's torch is, as JSON (run inside the cell's environment)
TORCH_PROBE = (
    "import json, sys, importlib.metadata as md, torch\n"
    "v = torch.version\n"
    "print(json.dumps({'version': torch.__version__, 'dist_version': md.version('torch'), 'cuda': getattr(v, 'cuda', None), 'hip': getattr(v, 'hip', None),"
    " 'xpu': getattr(v, 'xpu', None), 'git': getattr(v, 'git_version', None), 'file': torch.__file__,"
    " 'python': '%d.%d.%d' % sys.version_info[:3]}))"
)
ACCEL_PROBE = TORCH_PROBE.replace("import json, sys, importlib.metadata as md, torch", "import json, sys, importlib.metadata as md, torch, accel").replace(
    "'python':", "'accel': accel.__version__, 'accel_file': accel.__file__, 'python':")


class UsageError(Exception):
    pass


class EnvironmentFailure(Exception):
    """The cell's environment could not be built; the message says which step and why."""


def default_venv_cache() -> Path:
    configured = os.environ.get(VENV_CACHE_ENV)
    if configured:
        return Path(configured).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "accel" / "ci-venvs"


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


# ---------------------------------------------------------------------------- arguments
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ci.run_cell", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run one cell of the nightly matrix in its own virtual environment: install the cell's torch "
                    "(pinned, first), accel from this checkout, run the suites, the operator sweep and the benchmarks, "
                    "record the results.",
        epilog="exit status: 0 the environment was built (test failures are data: see cell.json and the results); "
               "3 the environment could not be built; 2 usage error.\n"
               f"environment: {PIP_ARGS_ENV} (extra pip arguments), {PROFILE_ENV} (install profile), "
               f"{VENV_CACHE_ENV} (venv cache folder).")
    parser.add_argument("--cell", required=True, metavar="ID", help="cell id, e.g. cpu-torch2.13.0-py3.11 (python -m ci.plan --format table lists them)")
    parser.add_argument("--matrix", default=str(DEFAULT_MATRIX), metavar="YAML", help="matrix file (default: ci/matrix.yaml)")
    parser.add_argument("--out", required=True, metavar="DIR", help="results root: the cell writes OUT/<cell id>/")
    parser.add_argument("--venv-cache", metavar="DIR", help=f"where cell environments live (default ${VENV_CACHE_ENV} or ~/.cache/accel/ci-venvs)")
    parser.add_argument("--reuse-venv", action="store_true", help="keep an environment built earlier with the same install spec")
    parser.add_argument("--python", metavar="PYTHON", help="interpreter for the cell's environment (default: this one if its version matches, else python3.X on PATH)")
    parser.add_argument("--profile", metavar="NAME", help=f"install profile from the matrix, e.g. local (default ${PROFILE_ENV})")
    parser.add_argument("--pip-args", metavar="ARGS", help=f"extra arguments for every pip install, one shell-quoted string; write --pip-args=\"--find-links DIR\" (added to ${PIP_ARGS_ENV})")
    parser.add_argument("--bench", choices=BENCH_MODES, help="override the matrix's benchmark mode")
    parser.add_argument("--ops", choices=OPS_MODES, help="override the matrix's operator sweep mode (accel ops)")
    parser.add_argument("-k", dest="keyword", metavar="EXPR", help="only suite tests matching this pytest -k expression")
    parser.add_argument("--repo", default=str(REPO), metavar="DIR", help="accel checkout to install and test (default: this one)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands without running anything")
    return parser


# ---------------------------------------------------------------------------- the cell
@dataclass
class CellRunner:
    cell: Cell
    out_root: Path
    venv_cache: Path
    repo: Path
    python: str | None = None
    reuse: bool = False
    pip_args: list[str] = field(default_factory=list)
    bench: str | None = None
    ops: str | None = None
    keyword: str | None = None
    dry_run: bool = False
    steps: list[Step] = field(default_factory=list)

    def __post_init__(self) -> None:
        suffix = f"-{self.cell.install.profile}" if self.cell.install.profile else ""
        self.venv = self.venv_cache / f"{self.cell.id}{suffix}"
        self.cell_dir = self.out_root / self.cell.id
        self.results = self.cell_dir / "results"
        self.bench_dir = self.cell_dir / "bench"
        self.ops_dir = self.cell_dir / "ops"
        self.logs = self.cell_dir / "logs"
        self.vpy = str(venv_python(self.venv))
        self.bench_mode = self.bench or self.cell.bench
        self.ops_mode = self.ops or self.cell.ops

    # ------------------------------------------------------------------ the commands
    def pip(self, *args: str) -> list[str]:
        return [self.vpy, "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "off", *args]

    def venv_command(self, python: str) -> list[str]:
        return [python, "-m", "venv", *(["--system-site-packages"] if self.cell.install.preinstalled else []), str(self.venv)]

    def torch_command(self) -> list[str]:
        spec = self.cell.install
        return self.pip(*spec.pip_options(), *self.pip_args, str(spec.requirement))

    def accel_command(self) -> list[str]:
        return self.pip(*self.pip_args, "--constraint", str(self.venv / CONSTRAINTS), "--editable", f"{self.repo}[test]")

    def plugin_commands(self) -> list[list[str]]:
        """One pip install per backend plug-in of the cell, under the same torch constraint as accel."""
        return [self.pip(*self.pip_args, "--constraint", str(self.venv / CONSTRAINTS), str(self.repo / folder))
                for folder in self.cell.plugins]

    def suites_command(self) -> list[str]:
        cell, suites = self.cell, self.repo / "suites"
        targets = [str(suites / s) for s in cell.suites] if cell.suites else [str(suites)]
        cmd = [self.vpy, "-m", "pytest", *targets, "-p", "no:cacheprovider", "-q", "-rfE",
               "--ignore", str(suites / "benchmarks"),
               "-m", cell.backend, "--backend", cell.backend,
               "--world-sizes", ",".join(str(w) for w in cell.world_sizes),
               "--dist-timeout", str(cell.dist_timeout),
               "--results-dir", str(self.results), "--junitxml", str(self.cell_dir / "junit.xml")]
        if cell.workers:
            cmd += ["-n", str(cell.workers)]
        if cell.known_issues:
            cmd += ["--known-issues", str(self.repo / cell.known_issues)]
        if self.keyword:
            cmd += ["-k", self.keyword]
        return cmd

    def ops_command(self) -> list[str]:
        cell = self.cell
        cmd = [self.vpy, "-m", "accel.commands.cli", "ops", "--backend", cell.backend]
        if self.ops_mode == "quick":
            cmd.append("--quick")
        cmd += ["-o", str(self.ops_dir), "-n", str(cell.workers or os.cpu_count() or 1)]
        if cell.known_issues:
            cmd += ["--known-issues", str(self.repo / cell.known_issues)]
        return cmd

    def bench_command(self) -> list[str]:
        cmd = [self.vpy, "-m", "accel.commands.cli", "bench", "--backend", self.cell.backend,
               "--results-dir", str(self.bench_dir)]
        if self.bench_mode == "quick":
            cmd.append("--quick")
        return cmd

    # ------------------------------------------------------------------ environment
    def child_env(self, suites: bool = False) -> dict[str, str]:
        """The environment of commands run in the cell: its venv first on PATH, nothing leaking in."""
        env = dict(os.environ)
        for name in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTEST_ADDOPTS", "PIP_REQUIRE_VIRTUALENV"):
            env.pop(name, None)
        bindir = str(Path(self.vpy).parent)
        env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
        env["VIRTUAL_ENV"] = str(self.venv)
        env["PYTHONUNBUFFERED"] = "1"
        if suites:
            env.setdefault("OMP_NUM_THREADS", "1")  # as ci/test.sh: ranks of one machine share its cores
        return env

    def find_python(self) -> str:
        wanted = self.cell.python.rstrip("t")
        if self.python:
            found = shutil.which(self.python) or (self.python if Path(self.python).exists() else None)
            if not found:
                raise EnvironmentFailure(f"python interpreter {self.python!r} not found")
        elif "%d.%d" % sys.version_info[:2] == wanted:
            found = sys.executable
        else:
            found = shutil.which(f"python{wanted}")
            if not found:
                raise EnvironmentFailure(
                    f"the cell needs python {self.cell.python}: no python{wanted} on PATH (this interpreter is "
                    f"{platform.python_version()}); pass --python, or in CI let actions/setup-python install it")
        if self.dry_run:
            return found
        try:
            version = subprocess.run([found, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                     capture_output=True, text=True, timeout=60).stdout.strip()
        except (OSError, subprocess.SubprocessError) as exc:
            raise EnvironmentFailure(f"cannot run {found}: {exc}") from None
        if version != wanted:
            raise EnvironmentFailure(f"{found} is python {version or '?'}, the cell needs {self.cell.python}")
        return found

    def stamp(self, python_version: str) -> dict[str, Any]:
        return {"cell": self.cell.id, "install": self.cell.install.to_dict(), "pip_args": self.pip_args,
                "python": python_version}

    def reusable(self) -> tuple[bool, str]:
        """Whether the cached environment can be kept, and why (not)."""
        path = self.venv / STAMP
        if not Path(self.vpy).exists() or not path.is_file():
            return False, "no finished environment there yet"
        try:
            recorded = json.loads(path.read_text())
        except (OSError, ValueError):
            return False, f"{path} is unreadable"
        expected = self.stamp(recorded.get("python", ""))
        for key in ("cell", "install", "pip_args"):
            if recorded.get(key) != expected[key]:
                return False, f"it was built with another {key.replace('_', ' ')}"
        if not str(recorded.get("python", "")).startswith(self.cell.python.rstrip("t") + "."):
            return False, f"it has python {recorded.get('python')}"
        return True, f"built {recorded.get('built', '?')} with torch {recorded.get('torch', '?')}"

    # ------------------------------------------------------------------ running
    def run_step(self, step: Step, env: dict[str, str]) -> int:
        """Run one of the cell's steps (:func:`ci.cell_steps.run_logged`) and keep it for ``cell.json``."""
        self.steps.append(step)
        return run_logged(step, env, self.logs, self.cell_dir, self.cell.id)

    def probe(self, name: str, code: str, env: dict[str, str]) -> dict[str, Any]:
        step = Step(name, [self.vpy, "-c", code], cwd=str(self.cell_dir), label=f"{self.vpy} -c <print torch/accel versions>")
        if self.run_step(step, env) != 0:
            raise EnvironmentFailure(f"{name}: the cell's python could not import torch/accel (see {self.cell_dir / step.log})")
        lines = (self.cell_dir / step.log).read_text(errors="replace").strip().splitlines()
        try:
            return json.loads(lines[-1])
        except (IndexError, ValueError):
            raise EnvironmentFailure(f"{name}: unexpected output (see {self.cell_dir / step.log})") from None

    def check_torch(self, info: dict[str, Any], when: str) -> None:
        installed, expected = str(info.get("version")), self.cell.expected_torch
        if not version_matches(installed, expected):
            how = "the runner image has" if self.cell.install.preinstalled else "pip installed"
            raise EnvironmentFailure(f"{when}: the cell asks for torch {expected}, but {how} torch {installed} "
                                     f"({info.get('file')})")

    def prepare_out(self) -> None:
        if self.cell_dir.exists():
            entries = list(self.cell_dir.iterdir())
            if entries and not (self.cell_dir / "cell.json").is_file():
                raise UsageError(f"{self.cell_dir} exists and is not a cell's output (no cell.json): choose another --out")
            shutil.rmtree(self.cell_dir)  # a previous run of this cell: replaced
        self.results.mkdir(parents=True)
        self.logs.mkdir(parents=True)

    def remove_venv(self) -> None:
        if not self.venv.exists():
            return
        if any(self.venv.iterdir()) and not (self.venv / "pyvenv.cfg").is_file():
            raise UsageError(f"refusing to delete {self.venv}: it is not a virtual environment (choose another --venv-cache)")
        shutil.rmtree(self.venv)

    def build_environment(self, record: dict[str, Any]) -> dict[str, Any]:
        """Steps 1-3; returns the torch/accel probe. Raises EnvironmentFailure."""
        env = self.child_env()
        reuse_ok, why = self.reusable() if self.reuse else (False, "")
        record["venv"] = {"path": str(self.venv), "reused": reuse_ok}
        if self.reuse:
            print(f"ci.run_cell [{self.cell.id}] environment {self.venv}: "
                  + ("reused, " + why if reuse_ok else "rebuilt: " + why), flush=True)
        if not reuse_ok:
            python = self.find_python()
            self.remove_venv()
            self.venv.parent.mkdir(parents=True, exist_ok=True)
            base_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
            if self.run_step(Step("venv", self.venv_command(python)), base_env) != 0:
                raise EnvironmentFailure(f"python -m venv failed (see {self.logs / 'venv.log'})")
            if not self.cell.install.preinstalled:
                if self.run_step(Step("install-torch", self.torch_command()), env) != 0:
                    raise EnvironmentFailure(f"installing torch failed: {self.cell.install.describe()} "
                                             f"(see {self.logs / 'install-torch.log'})")
        torch_info = self.probe("check-torch", TORCH_PROBE, env)
        record["torch"].update(installed=torch_info["version"], distribution=torch_info.get("dist_version"))
        record["python"]["version"] = torch_info.get("python")
        self.check_torch(torch_info, "after installing torch" if not reuse_ok else "in the reused environment")
        # pin the installed distribution (its metadata version: a wheel whose torch.__version__ says
        # 2.14.1+cu130 may be the distribution 2.14.1)
        (self.venv / CONSTRAINTS).write_text(f"# written by ci.run_cell: accel's install must keep this torch\n"
                                             f"torch=={torch_info.get('dist_version') or torch_info['version']}\n")
        if self.run_step(Step("install-accel", self.accel_command()), env) != 0:
            raise EnvironmentFailure(f"installing accel from {self.repo} failed (see {self.logs / 'install-accel.log'})")
        for folder, command in zip(self.cell.plugins, self.plugin_commands()):
            if self.run_step(Step(f"install-plugin-{Path(folder).name}", command), env) != 0:
                raise EnvironmentFailure(f"installing the plug-in {folder} failed (see the install-plugin log in {self.logs})")
        info = self.probe("check-accel", ACCEL_PROBE, env)
        self.check_torch(info, "after installing accel")
        if info["version"] != torch_info["version"]:
            raise EnvironmentFailure(f"installing accel replaced torch {torch_info['version']} by {info['version']}")
        stamp = {**self.stamp(info["python"]), "torch": info["version"], "built": utc_now()}
        if not reuse_ok:
            (self.venv / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
        return info

    def run(self) -> int:
        """Build the environment and run the cell; writes cell.json; returns the exit status."""
        if self.dry_run:
            return self.print_dry_run()
        self.prepare_out()
        started, t0 = utc_now(), time.perf_counter()
        record: dict[str, Any] = {
            "schema": CELL_SCHEMA, "schema_version": CELL_SCHEMA_VERSION, "cell": self.cell.to_dict(),
            "id": self.cell.id, "backend": self.cell.backend, "runner": list(self.cell.runner),
            "torch": {"requested": self.cell.torch, "expected": self.cell.expected_torch, "installed": None,
                      "install": self.cell.install.describe()},
            "python": {"requested": self.cell.python, "version": None},
            "pip_args": self.pip_args, "host": platform.node(), "platform": platform.platform(),
            "repo": str(self.repo), "start_time": started, "status": "running",
        }
        if in_github():
            record["github"] = {k: os.environ.get(k) for k in ("GITHUB_RUN_ID", "GITHUB_RUN_ATTEMPT", "GITHUB_SHA",
                                                              "GITHUB_REF", "RUNNER_NAME", "RUNNER_OS")}
        code = EXIT_OK
        try:
            info = self.build_environment(record)
            record["torch"].update(installed=info["version"], distribution=info.get("dist_version"), cuda=info.get("cuda"),
                                   hip=info.get("hip"), xpu=info.get("xpu"), file=info.get("file"))
            record["python"]["version"] = info["python"]
            record["accel"] = {"version": info.get("accel"), "file": info.get("accel_file")}
            record["environment_s"] = round(time.perf_counter() - t0, 2)
            record["status"] = "ok"
            self.run_tests(record)
        except EnvironmentFailure as exc:
            record["status"] = "environment-failed"
            record["error"] = str(exc)
            code = EXIT_ENVIRONMENT
            print(f"ci.run_cell [{self.cell.id}] error: {exc}", file=sys.stderr, flush=True)
            if in_github():
                print(f"::error title=cell {self.cell.id}::environment could not be built: {exc}", flush=True)
        finally:
            if record["status"] == "running":  # interrupted (Ctrl-C, a CI cancel): keep what finished
                record["status"] = "interrupted"
            record["end_time"] = utc_now()
            record["duration_s"] = round(time.perf_counter() - t0, 2)
            record["steps"] = [s.to_dict() for s in self.steps]
            (self.cell_dir / "cell.json").write_text(json.dumps(record, indent=2) + "\n")
        self.print_summary(record)
        return code

    def run_tests(self, record: dict[str, Any]) -> None:
        step = Step("suites", self.suites_command(), cwd=str(self.repo), echo=True)
        code = self.run_step(step, self.child_env(suites=True))
        counts = count_outcomes(self.results)
        verdict = {0: "passed", 1: "failed", 2: "interrupted", 3: "internal-error", 4: "usage-error", 5: "no-tests"}.get(code, "crashed")
        record["suites"] = {"exit_code": code, "verdict": verdict, "counts": counts,
                            "duration_s": step.duration_s, "results": "results"}
        if code not in (0, 1) and in_github():
            print(f"::warning title=cell {self.cell.id}::the suites did not run to the end: pytest exit {code} ({verdict})", flush=True)
        self.run_ops(record)
        if self.bench_mode == "off":
            record["bench"] = {"mode": "off"}
            return
        step = Step("bench", self.bench_command(), cwd=str(self.repo), echo=True)
        code = self.run_step(step, self.child_env())
        files = sorted(self.bench_dir.glob("*.json")) if self.bench_dir.is_dir() else []
        benchmarks = 0
        for path in files:
            try:
                benchmarks += len(json.loads(path.read_text() or "{}").get("benchmarks", []))
            except (OSError, ValueError):
                pass
        record["bench"] = {"mode": self.bench_mode, "exit_code": code, "files": [str(p.relative_to(self.cell_dir)) for p in files],
                           "benchmarks": benchmarks, "duration_s": step.duration_s}

    def run_ops(self, record: dict[str, Any]) -> None:
        """The operator sweep: exit 1 (failed rows) is a test failure like the suites', recorded, not raised."""
        if self.ops_mode == "off":
            record["ops"] = {"mode": "off"}
            return
        step = Step("ops", self.ops_command(), cwd=str(self.repo), echo=True)
        code = self.run_step(step, self.child_env())
        verdict = {0: "passed", 1: "failed", 2: "not-run"}.get(code, "crashed")
        counts = count_outcomes(self.ops_dir / "results", split_known=True)
        record["ops"] = {"mode": self.ops_mode, "exit_code": code, "verdict": verdict, "rows": sum(counts.values()),
                         "counts": counts, "duration_s": step.duration_s, "results": "ops/results"}
        if code not in (0, 1) and in_github():
            print(f"::warning title=cell {self.cell.id}::the operator sweep did not run to the end: accel ops exit {code} "
                  f"({verdict})", flush=True)

    def print_summary(self, record: dict[str, Any]) -> None:
        suites = record.get("suites") or {}
        counts = suites.get("counts") or {}
        bench = record.get("bench") or {}
        ops = record.get("ops") or {}
        print(f"ci.run_cell [{self.cell.id}] {record['status']}: torch {record['torch'].get('installed') or '-'} "
              f"(asked {record['torch']['requested']}), python {record['python'].get('version') or '-'}; "
              + (f"suites exit {suites.get('exit_code')} ({suites.get('verdict')}): "
                 + ", ".join(f"{counts.get(k, 0)} {k}" for k in ("passed", "failed", "error", "skipped")) + "; "
                 if suites else "")
              + (f"ops {ops.get('mode')}: {ops.get('rows', 0)} rows, {(ops.get('counts') or {}).get('failed', 0)} failed, "
                 f"exit {ops.get('exit_code')}; " if ops.get("mode") not in (None, "off") else "")
              + (f"bench {bench.get('mode')}: {bench.get('benchmarks', 0)} benchmarks, exit {bench.get('exit_code')}; "
                 if bench.get("mode") not in (None, "off") else "")
              + f"{record['duration_s']:.0f}s; {self.cell_dir / 'cell.json'}", flush=True)

    def print_dry_run(self) -> int:
        cell = self.cell
        print(f"# cell {cell.id}: backend {cell.backend}, torch {cell.torch} (expected {cell.expected_torch or 'any'}), "
              f"python {cell.python}, runner {','.join(cell.runner)}")
        print(f"# install: {cell.install.describe()}" + (f" (profile {cell.install.profile})" if cell.install.profile else ""))
        print(f"# output: {self.cell_dir}; environment: {self.venv}")
        reuse_ok, why = self.reusable() if self.reuse else (False, "")
        if self.reuse:
            print(f"# --reuse-venv: {'reuse (' + why + ')' if reuse_ok else 'rebuild: ' + why}")
        try:
            python = self.find_python()
        except EnvironmentFailure as exc:
            print(f"# warning: {exc}")
            python = f"python{cell.python}"
        steps: list[tuple[str, list[str]]] = []
        if not reuse_ok:
            steps.append(("venv", self.venv_command(python)))
            if not cell.install.preinstalled:
                steps.append(("install-torch", self.torch_command()))
        steps.append(("check-torch", [self.vpy, "-c", "<print torch.__version__; must match " + (cell.expected_torch or "any") + ">"]))
        steps.append(("install-accel", self.accel_command()))
        steps += [(f"install-plugin-{Path(folder).name}", command) for folder, command in zip(cell.plugins, self.plugin_commands())]
        steps.append(("check-accel", [self.vpy, "-c", "<import accel; torch unchanged>"]))
        steps.append(("suites", self.suites_command()))
        if self.ops_mode != "off":
            steps.append(("ops", self.ops_command()))
        if self.bench_mode != "off":
            steps.append(("bench", self.bench_command()))
        for name, command in steps:
            print(f"{name}: {' '.join(shlex.quote(c) for c in command)}")
        print(f"# then: {self.cell_dir / 'cell.json'}")
        return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        matrix = load_matrix(args.matrix)
        profile = args.profile or os.environ.get(PROFILE_ENV) or None
        cell = matrix.cell(args.cell, profile=profile)
        repo = Path(args.repo).resolve()
        if not (repo / "pyproject.toml").is_file() or not (repo / "suites").is_dir():
            raise UsageError(f"{repo} is not an accel checkout (no pyproject.toml and suites/)")
        try:
            pip_args = shlex.split(os.environ.get(PIP_ARGS_ENV, "")) + shlex.split(args.pip_args or "")
        except ValueError as exc:
            raise UsageError(f"cannot split the pip arguments: {exc}") from None
        runner = CellRunner(
            cell=cell, out_root=Path(args.out).resolve(),
            venv_cache=Path(args.venv_cache).expanduser().resolve() if args.venv_cache else default_venv_cache(),
            repo=repo, python=args.python, reuse=args.reuse_venv, pip_args=pip_args, bench=args.bench,
            ops=args.ops, keyword=args.keyword, dry_run=args.dry_run)
        return runner.run()
    except (MatrixError, UsageError) as exc:
        print(f"ci.run_cell: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
