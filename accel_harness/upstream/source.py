"""Getting a suite: a release's sdist from the package index, an archive or a folder; its tests and test requirements."""

from __future__ import annotations

import email.parser
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from .common import UpstreamError, _normalise, _run, _tail

TEST_EXTRAS = ("testing", "test", "tests", "dev")

#: suffixes whose files get the import rewrite
REWRITE_SUFFIXES = (".py", ".yaml", ".yml", ".json")


_ARCHIVES = (".tar.gz", ".tgz", ".zip")
_SPEC = re.compile(r"\A(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)==(?P<version>[A-Za-z0-9][A-Za-z0-9.+!_-]*)\Z")


@dataclass(frozen=True)
class Spec:
    """What ``--upstream`` names: a release on the package index, or a folder at hand."""

    kind: str  # "index", "archive" (an sdist file at hand) or "path" (a folder)
    name: str | None = None
    version: str | None = None
    path: Path | None = None

    @property
    def label(self) -> str:
        return f"{self.name}=={self.version}" if self.kind == "index" else str(self.path)


def parse_spec(text: str) -> Spec:
    """``NAME==VERSION`` (a release on the package index), an sdist file at hand, or an existing folder."""
    value = (text or "").strip()
    if value and os.path.isdir(value):
        return Spec("path", path=Path(value).resolve())
    if value and os.path.isfile(value) and value.endswith(_ARCHIVES):
        return Spec("archive", path=Path(value).resolve())
    match = _SPEC.match(value)
    if match:
        return Spec("index", name=match.group("name"), version=match.group("version"))
    if value and (os.sep in value or value.startswith(".")) or os.path.exists(value):
        raise UpstreamError(f"--upstream {value!r}: no such folder (a PATH must be a test folder or a source tree with tests/)")
    raise UpstreamError(f"--upstream takes NAME==VERSION (a release on the package index, e.g. accelerate==1.15.0), "
                        f"an sdist file (.tar.gz/.zip) or the path of a test folder; got {value!r}")


@dataclass
class Suite:
    """An upstream suite ready to run."""

    project: str              # import name the --against rewrite replaces (e.g. "accelerate")
    version: str | None       # release version (None: a folder at hand without metadata)
    tests_dir: Path           # the folder pytest runs
    root: Path                # the source tree (or the test folder itself)
    requirements: list[str] = field(default_factory=list)
    extras: list[str] = field(default_factory=list)
    source: str = ""          # where it came from (sdist file or folder)

    @property
    def label(self) -> str:
        return f"{self.project} {self.version}" if self.version else self.project


def fetch_sdist(name: str, version: str, dest: str | os.PathLike[str], *, pip_args: Sequence[str] = (),
                runner: Callable[..., subprocess.CompletedProcess] = _run) -> tuple[Path, Path]:
    """Download ``name==version``'s sdist into ``dest`` and unpack it: ``(archive, source root)``.

    ``pip_args`` go to ``pip download`` (e.g. ``--index-url``, ``--find-links``, ``--no-index``).
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation",
           f"{name}=={version}", "-d", str(dest), *pip_args]
    proc = runner(cmd)  # first with the build backend installed here (no downloads for it) ...
    if proc.returncode != 0:  # ... else the normal way (pip fetches the sdist's build backend)
        proc = runner([c for c in cmd if c != "--no-build-isolation"])
    archives = sorted(p for p in dest.iterdir() if p.is_file() and p.name.endswith(_ARCHIVES))
    if proc.returncode != 0 or not archives:
        raise UpstreamError(f"cannot download the sdist of {name}=={version}: {_tail(proc.stdout + proc.stderr) or 'pip found nothing'}")
    wanted = _normalise(name)
    archive = next((a for a in archives if _normalise(a.name).startswith(wanted)), archives[0])
    return archive, unpack_sdist(archive, dest / "src")


def unpack_sdist(archive: str | os.PathLike[str], unpacked: str | os.PathLike[str]) -> Path:
    """Unpack an sdist (``.tar.gz``/``.tgz``/``.zip``) into the fresh folder ``unpacked``: its source root."""
    archive, unpacked = Path(archive), Path(unpacked)
    if unpacked.exists():
        shutil.rmtree(unpacked)
    unpacked.mkdir(parents=True)
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            for member in zf.namelist():
                target = (unpacked / member).resolve()
                if not str(target).startswith(str(unpacked.resolve()) + os.sep):
                    raise UpstreamError(f"{archive}: member {member!r} would unpack outside the folder")
            zf.extractall(unpacked)
    else:
        try:
            with tarfile.open(archive) as tf:
                tf.extractall(unpacked, filter="data")  # no absolute paths, links out of the folder or devices
        except (tarfile.TarError, OSError) as exc:
            raise UpstreamError(f"cannot unpack {archive}: {exc}") from None
    tops = [p for p in unpacked.iterdir() if p.is_dir()]
    return tops[0] if len(tops) == 1 else unpacked


def locate_tests(root: str | os.PathLike[str]) -> Path:
    """The test folder of a source tree (``tests/``, ``test/``), or ``root`` itself if it holds tests."""
    root = Path(root)
    for name in ("tests", "test"):
        if (root / name).is_dir():
            return root / name
    if any(root.glob("test_*.py")) or any(root.glob("*_test.py")) or (root / "conftest.py").is_file():
        return root
    raise UpstreamError(f"{root}: no tests/ folder and no test_*.py files")


def _metadata(root: Path) -> email.message.Message | None:
    for candidate in (root / "PKG-INFO", root.parent / "PKG-INFO"):
        if candidate.is_file():
            return email.parser.Parser().parsestr(candidate.read_text(encoding="utf-8", errors="replace"))
    return None


def test_requirements(root: str | os.PathLike[str], extras: Sequence[str] | None = None) -> tuple[list[str], list[str]]:
    """The test dependencies a source tree declares: ``(requirements, extras used)``.

    Read from the sdist's ``PKG-INFO`` (``Requires-Dist`` with ``extra == ...`` markers). Without
    ``extras``, the first of :data:`TEST_EXTRAS` the project provides is used. No metadata: none.
    """
    from packaging.requirements import InvalidRequirement, Requirement

    meta = _metadata(Path(root))
    if meta is None:
        return [], []
    provided = [_normalise(e) for e in meta.get_all("Provides-Extra") or []]
    if extras is None:
        chosen = next(([e] for e in TEST_EXTRAS if e in provided), [])
    else:
        chosen = [_normalise(e) for e in extras]
        missing = [e for e in chosen if e not in provided]
        if missing:
            raise UpstreamError(f"the project provides no extra {', '.join(missing)} (it has: {', '.join(provided) or 'none'})")
    out: list[str] = []
    for line in meta.get_all("Requires-Dist") or []:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.marker is None:
            continue  # a runtime dependency, not a test one (the release itself brings those)
        if any(req.marker.evaluate({"extra": extra}) for extra in chosen):
            text = str(req).split(";")[0].strip()
            if text not in out:
                out.append(text)
    return out, chosen


def rewrite_imports(folder: str | os.PathLike[str], old: str, new: str) -> int:
    """Replace the word ``old`` by ``new`` in the ``.py``/``.yaml``/``.yml``/``.json`` files under ``folder``; files changed."""
    pattern = re.compile(rf"\b{re.escape(old)}\b")
    changed = 0
    for path in sorted(Path(folder).rglob("*")):
        if not path.is_file() or path.suffix.lower() not in REWRITE_SUFFIXES:
            continue
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
        updated = pattern.sub(new, text)
        if updated != text:
            path.write_text(updated, encoding="utf-8", errors="surrogateescape")
            changed += 1
    return changed


def prepare_suite(spec: Spec, workdir: str | os.PathLike[str], *, pip_args: Sequence[str] = (), extras: Sequence[str] | None = None,
                  project: str | None = None, runner: Callable[..., subprocess.CompletedProcess] = _run) -> Suite:
    """Fetch (index) or locate (path) the suite; read its test requirements."""
    workdir = Path(workdir)
    if spec.kind == "index":
        archive, root = fetch_sdist(spec.name, spec.version, workdir / "sdist", pip_args=pip_args, runner=runner)
        requirements, used = test_requirements(root, extras)
        name = project or _import_name(root, spec.name)
        return Suite(name, spec.version, locate_tests(root), root, requirements, used, source=str(archive))
    if spec.kind == "archive":  # an sdist at hand (an air-gapped lab): unpack it, then as a folder
        root = unpack_sdist(spec.path, workdir / "sdist" / "src")
        return _folder_suite(root, extras, project, source=str(spec.path))
    return _folder_suite(spec.path, extras, project, source=str(spec.path))


def _folder_suite(root: Path, extras: Sequence[str] | None, project: str | None, source: str) -> Suite:
    """A suite from a source tree or test folder at hand (its metadata, if any, names project and version)."""
    tests = locate_tests(root)
    requirements, used = test_requirements(root, extras)
    meta = _metadata(root)
    version = meta.get("Version") if meta is not None else None
    name = project or (meta.get("Name") if meta is not None else None) or _guess_project(tests)
    if not name:
        raise UpstreamError(f"{root}: cannot tell which project these tests are for; pass --upstream-project NAME")
    return Suite(_normalise(name).replace("-", "_"), version, tests, root, requirements, used, source=source)


def _import_name(root: Path, dist_name: str) -> str:
    """The top-level import name of a source tree (``src/<name>`` or ``<name>/``), else the normalised dist name."""
    norm = _normalise(dist_name).replace("-", "_")
    for base in (root / "src", root):
        if (base / norm / "__init__.py").is_file():
            return norm
    return norm


def _guess_project(tests: Path) -> str | None:
    """The most imported third-party top-level name in the tests (``from X...`` / ``import X``)."""
    counts: dict[str, int] = {}
    stdlib = set(getattr(sys, "stdlib_module_names", ()))
    for path in tests.rglob("*.py"):
        for match in re.finditer(r"^\s*(?:from|import)\s+([A-Za-z_]\w*)", path.read_text(errors="replace"), re.MULTILINE):
            name = match.group(1)
            if name not in stdlib and name not in ("pytest", "torch", "numpy", "tests", "conftest", "parameterized"):
                counts[name] = counts.get(name, 0) + 1
    return max(counts, key=counts.get) if counts else None
