"""Installing a suite's test dependencies with the vendor's torch pinned; what cannot be installed or imported is recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from .common import _normalise, _run, _tail

#: distributions a vendor's torch build comes with: pinned at their installed versions while the
#: suite's dependencies install (names compared after PEP 503 normalisation; a trailing ``*``
#: matches a prefix)
PINNED_DISTRIBUTIONS = (
    "torch", "torchvision", "torchaudio", "triton", "pytorch-triton*", "intel-extension-for-pytorch",
    "torch-npu", "torch-xla", "habana-torch-plugin", "habana-torch-dataloader", "torch-mlu", "torch-musa",
)

#: extras that hold a project's test dependencies, in order of preference


@dataclass
class InstallResult:
    """What installing a suite's dependencies did."""

    constraints: list[str] = field(default_factory=list)
    already: list[str] = field(default_factory=list)
    installed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    skipped: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"constraints": self.constraints, "already": self.already, "installed": self.installed,
                "failed": self.failed, "skipped": self.skipped}


def pinned_constraints(distributions: Iterable[Any] | None = None) -> list[str]:
    """``name==version`` for every installed distribution in :data:`PINNED_DISTRIBUTIONS`."""
    from importlib import metadata

    dists = list(distributions) if distributions is not None else list(metadata.distributions())
    pins = {}
    for dist in dists:
        name = dist.metadata.get("Name") if hasattr(dist, "metadata") else None
        if not name:
            continue
        norm = _normalise(name)
        for pattern in PINNED_DISTRIBUTIONS:
            if (pattern.endswith("*") and norm.startswith(pattern[:-1])) or norm == pattern:
                pins[norm] = f"{norm}=={dist.version}"
    return sorted(pins.values())


def _satisfied(requirement: str) -> bool:
    from importlib import metadata

    from packaging.requirements import Requirement

    req = Requirement(requirement)
    try:
        version = metadata.version(req.name)
    except metadata.PackageNotFoundError:
        return False
    return req.specifier.contains(version, prereleases=True) if req.specifier else True


#: prints, as JSON, which of the requirements in argv the interpreter running it already satisfies
_SATISFIED_CHECK = """
import json, sys
from importlib import metadata
from packaging.requirements import Requirement
ok = []
for text in sys.argv[1:]:
    req = Requirement(text)
    try:
        version = metadata.version(req.name)
    except metadata.PackageNotFoundError:
        continue
    if not req.specifier or req.specifier.contains(version, prereleases=True):
        ok.append(text)
print(json.dumps(ok))
"""

#: prints, as JSON, the normalised names of the distributions installed in the folder argv[1]
_FOLDER_DISTS = """
import json, re, sys
from importlib import metadata
print(json.dumps(sorted({re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower() for d in metadata.distributions(path=[sys.argv[1]])
                         if d.metadata["Name"]})))
"""


def _last_json(proc: subprocess.CompletedProcess, default: Any) -> Any:
    try:
        return json.loads((proc.stdout or "").strip().splitlines()[-1]) if proc.returncode == 0 else default
    except (ValueError, IndexError):
        return default


def install_requirements(requirements: Sequence[str], workdir: str | os.PathLike[str], *, pip_args: Sequence[str] = (),
                         runner: Callable[..., subprocess.CompletedProcess] = _run,
                         constraints: Sequence[str] | None = None, verify: bool = True,
                         python: str | None = None, log: str | os.PathLike[str] | None = None,
                         verify_all_in: str | os.PathLike[str] | None = None) -> InstallResult:
    """Install ``requirements`` with the vendor's torch pinned; what fails is recorded, not raised.

    Requirements already satisfied are not passed to pip (nothing is upgraded). The rest install
    in one pip call under a constraints file pinning :func:`pinned_constraints`; when that call
    fails, each requirement is tried alone so one uninstallable package (say, one that would need
    another torch) does not block the others. With ``verify``, each installed package is then
    imported in a fresh interpreter; one that fails to import is uninstalled again and recorded
    as failed (a test extra's newest release can break an installed library's imports).

    ``python``: the interpreter whose environment receives the packages (default: this one);
    ``log``: a file that gets every pip command and its whole output; ``verify_all_in``: a site
    folder whose every distribution (dependencies included) is import-checked, not only the
    requirements.
    """
    python = python or sys.executable
    result = InstallResult(constraints=list(pinned_constraints() if constraints is None else constraints))
    logged = _logging_runner(runner, log)
    if python == sys.executable:
        present = [req for req in requirements if _satisfied(req)]
    else:
        present = _last_json(logged([python, "-c", _SATISFIED_CHECK, *requirements]), [])
    todo = []
    for req in requirements:
        (result.already if req in present else todo).append(req)
    if not todo:
        return result
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    cfile = workdir / "constraints.txt"
    cfile.write_text("".join(f"{c}\n" for c in result.constraints), encoding="utf-8")
    base = [python, "-m", "pip", "install", "--disable-pip-version-check", "-c", str(cfile), *pip_args]
    folder_dists = [python, "-c", _FOLDER_DISTS, str(verify_all_in)]
    there_before = set(_last_json(logged(folder_dists), [])) if verify and verify_all_in else set()
    proc = logged([*base, *todo])
    if proc.returncode == 0:
        result.installed = list(todo)
    else:
        for req in todo:
            single = logged([*base, req])
            if single.returncode == 0:
                result.installed.append(req)
            else:
                result.failed[req] = _tail(single.stdout + single.stderr, 2) or f"pip exit {single.returncode}"
    if verify and result.installed:
        # what pip added beside the requirements (their dependencies), not what the folder held before
        extra = sorted(set(_last_json(logged(folder_dists), [])) - there_before) if verify_all_in else []
        _drop_broken(result, logged, python=python, also=extra)
    return result


def _logging_runner(runner: Callable[..., subprocess.CompletedProcess],
                    log: str | os.PathLike[str] | None) -> Callable[..., subprocess.CompletedProcess]:
    """``runner``, appending each command and its whole output to ``log`` (when given)."""
    if log is None:
        return runner

    def run(cmd: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess:
        proc = runner(cmd, **kwargs)
        shown = [c if len(c) < 200 else c[:60] + " ..." for c in cmd]
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(f"$ {' '.join(shown)}\n# exit {proc.returncode}\n{proc.stdout or ''}{proc.stderr or ''}\n")
        return proc

    return run


#: imports the top-level modules of the distributions named in argv; prints {dist: error} as JSON
_IMPORT_CHECK = """
import importlib, importlib.metadata as md, json, re, sys
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
wanted = set(sys.argv[1:])
mods = {}
for mod, dists in md.packages_distributions().items():
    for d in dists:
        if norm(d) in wanted and not mod.startswith("_") and mod.isidentifier():
            mods.setdefault(norm(d), set()).add(mod)
bad = {}
for dist in sorted(wanted):
    for mod in sorted(mods.get(dist, ()))[:3]:
        try:
            importlib.import_module(mod)
        except BaseException as exc:
            bad[dist] = ("import %s: %s: %s" % (mod, type(exc).__name__, exc)).splitlines()[0][:300]
            break
print(json.dumps(bad))
"""


def _drop_broken(result: InstallResult, runner: Callable[..., subprocess.CompletedProcess], *, python: str | None = None,
                 also: Sequence[str] = ()) -> None:
    """Uninstall what pip installed but does not import here (pip checks versions, not that a
    package works with its neighbours: a test extra can name a release that breaks an installed
    library's imports), and record it as not installed, with the import error. ``also``: further
    distributions (dependencies pip pulled in) to check the same way; a broken one is recorded
    under its own name."""
    from packaging.requirements import Requirement

    python = python or sys.executable
    names = {_normalise(Requirement(req).name): req for req in result.installed}
    wanted = sorted(set(names) | {_normalise(d) for d in also})
    broken = _last_json(runner([python, "-c", _IMPORT_CHECK, *wanted]), {})
    for dist, error in sorted(broken.items()):
        if dist not in names and dist not in {_normalise(d) for d in also}:
            continue
        runner([python, "-m", "pip", "uninstall", "-y", dist])
        req = names.get(dist)
        if req is not None:
            result.installed.remove(req)
        result.failed[req or dist] = f"installed, but {error}; uninstalled again"
