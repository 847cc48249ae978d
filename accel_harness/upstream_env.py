"""The environment an upstream suite runs in: its own venv, and no trace of the user's configuration.

``accel qualify --upstream`` must measure the backend, not the machine's history, and must leave
the user's environment as it found it. So:

- **packages**: the suite's test dependencies go into a virtual environment of their own under
  accel's cache folder (``upstream-envs/<project>-<key>``), keyed by the suite, its requirements,
  the pinned torch (and companions), accel's version and the interpreter. The venv sees the active
  environment's packages *behind* its own (a ``.pth`` hook adds the active site folders), so the
  installed torch, accel and everything already present are used as they are, never copied or
  replaced; what pip adds or upgrades lands in the venv only. A venv that matches is reused.
  After installing, every distribution the venv holds is imported once; one that does not import
  (a torch companion built for another torch, say) is removed again and reported with the error.
  pip's whole output is kept in ``logs/pip-install.log``.
- **configuration** (:func:`accel_harness.upstream.caller_free_environment`): the run gets a
  temporary home (``HOME``, ``XDG_*``, ``HF_HOME``), no ``ACCEL_*``/``ACCELERATE_*`` variable of the
  caller's, the hub offline unless asked otherwise.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import site
import sys
import sysconfig
import venv
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

__all__ = ["ENV_MARKER", "IsolatedEnv", "environment_key", "prepare_environment"]

#: written last into a venv that finished installing; a venv without it is rebuilt
ENV_MARKER = "accel-upstream-env.json"

@dataclass
class IsolatedEnv:
    """A venv for one upstream suite: where it is, its interpreter, whether it was reused."""

    root: Path
    python: Path
    reused: bool
    install: dict[str, Any]


def _cache_root() -> Path:
    from accel.io.paths import cache_dir

    return cache_dir() / "upstream-envs"


#: the way an environment is made (its .pth hook); a change makes every cached environment stale
ENVIRONMENT_LAYOUT = "site-dirs+package-links"


def environment_key(label: str, requirements: Sequence[str], constraints: Sequence[str]) -> str:
    """A digest of everything that makes two upstream environments different."""
    from accel import __version__

    blob = json.dumps({"suite": label, "requirements": sorted(requirements), "constraints": sorted(constraints),
                       "accel": __version__, "python": sys.version, "prefix": sys.prefix, "layout": ENVIRONMENT_LAYOUT}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _active_site_dirs() -> list[str]:
    """The running interpreter's site folders (venv or system, plus the user site if it is on)."""
    dirs = list(site.getsitepackages())
    user = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    if user and os.path.isdir(user):
        dirs.append(user)
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


#: the packages a suite environment must import from a checkout of accel that no site folder installs
ACCEL_PACKAGES = ("accel", "accel_harness", "accel_reports")


def _running_accel_root() -> str | None:
    """The folder that holds the running ``accel`` package when no site folder provides it (a checkout on
    PYTHONPATH); None when accel is installed there, editable installs included (their own finder imports it)."""
    import importlib.metadata

    import accel

    parent = str(Path(accel.__file__).resolve().parents[1])
    site_dirs = [str(Path(d).resolve()) for d in _active_site_dirs()]
    if parent in site_dirs:
        return None
    installed = {str(Path(d.locate_file("")).resolve()) for d in importlib.metadata.distributions(name="accel")}
    return None if installed & set(site_dirs) else parent


def _package_links(root: Path, checkout: str) -> Path:
    """A folder in the venv holding links to accel's packages in ``checkout``, to put on the path instead of the
    checkout itself: the checkout's other folders (its own ``tests`` package) must not shadow the suite's."""
    folder = root / "accel-checkout"
    folder.mkdir(exist_ok=True)
    for name in ACCEL_PACKAGES:
        source = Path(checkout) / name
        if source.is_dir():
            (folder / name).symlink_to(source, target_is_directory=True)
    return folder


def _venv_python(root: Path) -> Path:
    return root / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _venv_site(root: Path) -> Path:
    paths = sysconfig.get_paths(vars={"base": str(root), "platbase": str(root)})
    return Path(paths["purelib"])


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (two qualify runs preparing the same venv wait for each other)."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _create(root: Path) -> Path:
    """A fresh venv at ``root`` whose packages come before the active environment's."""
    if root.exists():
        shutil.rmtree(root)
    venv.EnvBuilder(with_pip=True, clear=True, symlinks=os.name != "nt").create(root)
    hook = ["import site"]
    for folder in _active_site_dirs():
        hook.append(f"site.addsitedir({folder!r})")  # runs that folder's own .pth files too (editable installs)
    checkout = _running_accel_root()
    if checkout:
        hook.append(f"import sys; sys.path.append({str(_package_links(root, checkout))!r})")
    # a .pth line that starts with "import" is executed: one line, the active environment behind this one
    (_venv_site(root) / "_accel_upstream_base.pth").write_text("; ".join(hook) + "\n", encoding="utf-8")
    return _venv_python(root)


def _link_console_scripts(root: Path) -> int:
    """Give the venv the active environment's console scripts (``accel``, ``accelerate``, ``torchrun``,
    ...) rewritten to run under the venv's interpreter, so a test that starts ``accel launch`` or
    ``torchrun`` runs it inside the suite's environment (with its packages), not the caller's."""
    source = Path(sys.executable).parent
    target = root / ("Scripts" if os.name == "nt" else "bin")
    python = str(_venv_python(root))
    made = 0
    for script in sorted(source.iterdir()) if source.is_dir() else []:
        if not script.is_file() or (target / script.name).exists():
            continue
        try:
            with open(script, "rb") as fh:
                first = fh.readline()
                if not (first.startswith(b"#!") and b"python" in first):
                    continue
                body = fh.read()
        except OSError:
            continue
        (target / script.name).write_bytes(f"#!{python}\n".encode() + body)
        (target / script.name).chmod(0o755)
        made += 1
    return made


def prepare_environment(label: str, requirements: Sequence[str], *, log_dir: str | os.PathLike[str],
                        pip_args: Sequence[str] = (), constraints: Sequence[str] | None = None,
                        root: str | os.PathLike[str] | None = None) -> IsolatedEnv:
    """Build (or reuse) the venv for ``label`` with ``requirements`` installed into it.

    The active environment is never written to. ``log_dir`` gets ``pip-install.log``; the install
    outcome (already present / installed / failed with the reason) is in ``IsolatedEnv.install``.
    """
    from .upstream import install_requirements, pinned_constraints

    pins = list(pinned_constraints() if constraints is None else constraints)
    key = environment_key(label, requirements, pins)
    name = "".join(c if c.isalnum() or c in "-_." else "-" for c in label.replace(" ", "-"))
    target = Path(root) if root is not None else _cache_root() / f"{name}-{key}"
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / "pip-install.log"
    with _locked(target.with_name(target.name + ".lock")):
        marker = target / ENV_MARKER
        python = _venv_python(target)
        if marker.is_file() and python.exists():
            try:
                _link_console_scripts(target)  # scripts installed in the active environment since
                stored = json.loads(marker.read_text(encoding="utf-8"))
                log.write_text(f"# reused {target} (prepared before; its install log: {stored.get('log')})\n", encoding="utf-8")
                return IsolatedEnv(target, python, True, stored["install"])
            except (ValueError, KeyError):
                pass  # a damaged marker: rebuild
        python = _create(target)
        _link_console_scripts(target)
        result = install_requirements(list(requirements), target / "pip", pip_args=pip_args, constraints=pins,
                                      python=str(python), log=log, verify_all_in=_venv_site(target))
        install = result.to_dict()
        marker.write_text(json.dumps({"install": install, "log": str(log), "key": key}, indent=2) + "\n",
                          encoding="utf-8")
        return IsolatedEnv(target, python, False, install)
