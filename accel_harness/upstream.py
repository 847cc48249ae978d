"""Upstream test suites: run a project's own tests (Accelerate's, say) with the harness's records.

A vendor qualifies a backend by running the upstream project's test suite on it. This module does
that in one call, for ``accel qualify --upstream``:

1. **get the suite**: ``NAME==VERSION`` downloads that release's sdist from the package index
   (``pip download --no-binary :all:``) and unpacks it; a ``PATH`` is a test folder (or a source
   tree with ``tests/``) at hand;
2. **install its test dependencies** (the sdist's ``testing``/``test`` extras, and the release
   itself) with the installed torch and the vendor's torch companions pinned through a pip
   constraints file, so a vendor's torch build is never replaced; what cannot be installed is
   recorded, not fatal;
3. **run it** once per selected backend in a fresh copy (``--against accel`` rewrites
   ``\\bproject\\b`` to ``accel`` in its ``.py``/``.yaml``/``.json`` files, which measures accel's
   compatibility), under pytest with the harness's ``--results-dir`` records, the hub offline and
   ``--continue-on-collection-errors``;
4. **complete the records**: every record gets the run's backend; skips whose message carries no
   harness reason code get one from the data table ``upstream_skips.yaml``; modules that failed to
   import become ``error`` records; and the run gets a status — a suite that fails at collection
   (nothing ran) is ``collection-failed``, its own outcome, never "0 tests, 0 failures".

The completed results file's header carries ``extra["upstream"]`` (project, version, against,
status, pytest exit code, collection errors, installation), which the report generator uses for
the vendor table (upstream version x torch version x backend).
"""

from __future__ import annotations

import email.parser
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

__all__ = [
    "PINNED_DISTRIBUTIONS",
    "SKIP_TABLE",
    "STATUSES",
    "InstallResult",
    "SkipRule",
    "Spec",
    "Suite",
    "SuiteRun",
    "UpstreamError",
    "backend_env",
    "caller_free_environment",
    "classify_skip",
    "complete_records",
    "fetch_sdist",
    "harness_option",
    "install_requirements",
    "junit_collection_errors",
    "load_skip_table",
    "locate_tests",
    "unpack_sdist",
    "parse_spec",
    "pinned_constraints",
    "prepare_suite",
    "rewrite_imports",
    "run_suite",
    "test_requirements",
]

#: the skip-message table (one YAML file beside this module)
SKIP_TABLE = Path(__file__).with_name("upstream_skips.yaml")

#: a run's status: it ran; nothing ran because collection failed; nothing was collected; it was cut short
STATUSES = ("completed", "collection-failed", "no-tests", "interrupted")

#: distributions a vendor's torch build comes with: pinned at their installed versions while the
#: suite's dependencies install (names compared after PEP 503 normalisation; a trailing ``*``
#: matches a prefix)
PINNED_DISTRIBUTIONS = (
    "torch", "torchvision", "torchaudio", "triton", "pytorch-triton*", "intel-extension-for-pytorch",
    "torch-npu", "torch-xla", "habana-torch-plugin", "habana-torch-dataloader", "torch-mlu", "torch-musa",
)

#: extras that hold a project's test dependencies, in order of preference
TEST_EXTRAS = ("testing", "test", "tests", "dev")

#: suffixes whose files get the import rewrite
REWRITE_SUFFIXES = (".py", ".yaml", ".yml", ".json")

#: hub variables set for the run unless asked online: the suite must not depend on the network
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


#: prefixes of the caller's variables an upstream run never sees (user configuration of accel and Accelerate)
CALLER_PREFIXES = ("ACCEL_", "ACCELERATE_")

#: variables that would point a run at the caller's own configuration or pytest options
CALLER_VARIABLES = ("PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER", "PYTEST_PLUGINS", "HF_HOME", "HF_HUB_CACHE",
                    "TRANSFORMERS_CACHE", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME")


class UpstreamError(RuntimeError):
    """An upstream suite cannot be fetched, found or run (the message says which and why)."""


# ---------------------------------------------------------------------------- the skip table
@dataclass(frozen=True)
class SkipRule:
    """One row of the skip table: a regular expression and the reason code it gives."""

    match: str
    code: str

    @functools.cached_property
    def pattern(self) -> re.Pattern[str]:
        return re.compile(self.match, re.IGNORECASE)


@functools.lru_cache(maxsize=8)
def _load_table(path: str) -> tuple[SkipRule, ...]:
    import yaml

    from .markers import SKIP_CODES

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise UpstreamError(f"skip table {path}: {exc}") from None
    rows = data.get("rules") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not rows:
        raise UpstreamError(f"skip table {path}: expected a mapping with a non-empty 'rules' list")
    rules = []
    for number, row in enumerate(rows, start=1):
        if not isinstance(row, dict) or set(row) != {"match", "code"}:
            raise UpstreamError(f"skip table {path}: rule {number} must have exactly the keys 'match' and 'code', got {row!r}")
        if row["code"] not in SKIP_CODES:
            raise UpstreamError(f"skip table {path}: rule {number} has unknown reason code {row['code']!r}; "
                                f"known codes: {', '.join(SKIP_CODES)}")
        try:
            re.compile(str(row["match"]), re.IGNORECASE)
        except re.error as exc:
            raise UpstreamError(f"skip table {path}: rule {number} has a bad regular expression: {exc}") from None
        rules.append(SkipRule(str(row["match"]), str(row["code"])))
    return tuple(rules)


def load_skip_table(path: str | os.PathLike[str] | None = None) -> tuple[SkipRule, ...]:
    """The rules of the skip table (default: :data:`SKIP_TABLE`), validated."""
    return _load_table(str(Path(path or SKIP_TABLE).resolve()))


def classify_skip(message: str | None, rules: Sequence[SkipRule] | None = None) -> str:
    """The reason code for an upstream skip message: the first matching rule's, else ``"unspecified"``."""
    from .markers import UNSPECIFIED

    text = (message or "").strip()
    if text.startswith("Skipped:"):
        text = text[len("Skipped:"):].strip()
    for rule in rules if rules is not None else load_skip_table():
        if rule.pattern.search(text):
            return rule.code
    return UNSPECIFIED


# ---------------------------------------------------------------------------- what to run
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


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _run(cmd: Sequence[str], *, cwd: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None,
         timeout: float | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), cwd=cwd, env=dict(env) if env is not None else None, capture_output=True,
                          text=True, timeout=timeout, check=False)


def _tail(text: str, lines: int = 3) -> str:
    kept = [line for line in (text or "").strip().splitlines() if line.strip()]
    return " | ".join(kept[-lines:])


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


# ---------------------------------------------------------------------------- installing
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


# ---------------------------------------------------------------------------- preparing and running
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


@dataclass
class SuiteRun:
    """One run of a suite on one backend."""

    backend: str
    against: str
    status: str
    exit_code: int | None
    results: Path | None
    log: Path
    counts: dict[str, int]
    collection_errors: int
    seconds: float


def junit_collection_errors(path: str | os.PathLike[str]) -> list[dict[str, str]]:
    """Modules that failed (or skipped) at collection, from a pytest ``--junitxml`` file:
    ``[{"nodeid", "outcome" ("error"/"skipped"), "text"}]``."""
    try:
        tree = ET.parse(path)
    except (OSError, ET.ParseError):
        return []
    out = []
    for case in tree.iter("testcase"):
        for child in case:
            message = child.get("message") or ""
            if child.tag == "error" and message == "collection failure":
                outcome = "error"
            elif child.tag == "skipped" and message == "collection skipped":
                outcome = "skipped"
            else:
                continue
            classname = case.get("classname") or ""
            name = case.get("name") or ""
            module = (classname + "." + name).strip(".") if classname else name
            parts = module.split(".")
            nodeid = "/".join(parts) + ".py" if parts and parts[-1] else module
            out.append({"nodeid": nodeid, "outcome": outcome, "text": child.text or message})
    return out


def complete_records(raw: str | os.PathLike[str] | None, out: str | os.PathLike[str], *, backend: str,
                     upstream: Mapping[str, Any], exit_code: int | None, collection: Sequence[Mapping[str, str]] = (),
                     rules: Sequence[SkipRule] | None = None, header_defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Write ``out``: the harness results file ``raw`` completed for an upstream run.

    Every record gets ``backend``; skips with no harness reason code get one from the skip table;
    ``collection`` entries (see :func:`junit_collection_errors`) become records of their module
    (``extra.phase = "collection"``); the header's ``extra["upstream"]`` gets ``upstream`` plus the
    run's ``status``, ``exit_code`` and ``collection_errors``. Without ``raw`` (pytest stopped
    before the session started) a header is made from ``header_defaults``. Returns the upstream block.
    """
    from .markers import UNSPECIFIED
    from .records import RecordWriter, make_record, new_run_id, read_records, utc_now

    header: dict[str, Any] | None = None
    records: list[dict[str, Any]] = []
    end_time = None
    interrupted = raw is None
    if raw is not None:
        header, records, _problems = read_records(raw)
        if header is not None:
            interrupted = bool(header.get("interrupted"))
            end_time = header.get("end_time")
    if header is None:
        header = {"run_id": new_run_id(), "start_time": utc_now(), **dict(header_defaults or {})}
    header = {k: v for k, v in header.items() if k not in ("type", "end_time", "run_end", "interrupted")}
    header["backends"] = [backend]
    for key in ("device_models", "device_count", "driver_versions", "runtime_versions", "comm_backends"):
        if isinstance(header.get(key), dict):
            header[key] = {k: v for k, v in header[key].items() if k == backend}
    rules = load_skip_table() if rules is None else rules
    run_id = str(header["run_id"])
    seen = set()
    completed = []
    for rec in records:
        rec = {k: v for k, v in rec.items() if k != "type"}
        rec["backend"] = backend
        rec["test_id"] = rec.get("nodeid")
        if rec.get("outcome") == "skipped" and rec.get("reason_code") in (None, UNSPECIFIED):
            rec["reason_code"] = classify_skip(rec.get("message"), rules)
        seen.add(rec.get("nodeid"))
        completed.append(rec)
    errors = 0
    for entry in collection:
        if entry["nodeid"] in seen:
            continue
        seen.add(entry["nodeid"])
        errors += entry["outcome"] == "error"
        record = make_record(run_id=run_id, nodeid=entry["nodeid"], backend=backend, outcome=entry["outcome"],
                             when="setup", text=entry["text"] if entry["outcome"] == "error" else entry["text"],
                             extra={"phase": "collection"}).to_dict()
        if entry["outcome"] == "skipped":
            record["reason_code"] = classify_skip(entry["text"], rules) if record["reason_code"] == UNSPECIFIED else record["reason_code"]
        record.pop("type", None)
        completed.append(record)
    ran = [r for r in completed if (r.get("extra") or {}).get("phase") != "collection"]
    if interrupted and exit_code not in (0, 1, 5):
        status = "interrupted" if ran else "collection-failed"
    elif not ran and (errors or exit_code not in (0, 1, 5)):
        status = "collection-failed"
    elif not ran:
        status = "no-tests"
    elif interrupted:
        status = "interrupted"
    else:
        status = "completed"
    block = {**dict(upstream), "status": status, "exit_code": exit_code, "collection_errors": errors}
    header.setdefault("extra", {})
    header["extra"] = {**(header.get("extra") or {}), "upstream": block}
    writer = RecordWriter(out, header)
    try:
        for rec in completed:
            writer.write(rec)
    finally:
        if not (interrupted and status == "interrupted"):
            writer.close(end_time=end_time or utc_now(), upstream_status=status)
        else:
            writer._fh.close()  # keep the run marked as cut short for the report
    return block


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
        from . import plugin

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
    from .progress import run_streamed

    header = "$ " + " ".join(cmd) + f"\n# cwd {work}; ACCEL_DEVICE={backend}; rewritten files: {rewritten}\n"
    try:
        exit_code = run_streamed(cmd, log, on_line=on_line, env=env, cwd=work, timeout=session_timeout or None,
                                 header=header)
    except KeyboardInterrupt:
        _finish(suite, backend, side, raw_dir, junit, results / f"{tag}.jsonl", None, install, rewritten, log, python)
        raise
    final = results / f"{tag}.jsonl"
    block = _finish(suite, backend, side, raw_dir, junit, final, exit_code, install, rewritten, log, python)
    from .records import read_records

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


def _finish(suite: Suite, backend: str, side: str, raw_dir: Path, junit: Path, final: Path, exit_code: int | None,
            install: InstallResult | None, rewritten: int, log: Path | None = None,
            python: str | None = None) -> dict[str, Any]:
    raws = sorted(raw_dir.glob("*.jsonl")) if raw_dir.is_dir() else []
    collection = junit_collection_errors(junit)
    if not raws and not collection and exit_code not in (0, 1, 5, None) and log is not None and log.is_file():
        # pytest stopped before its session began (a conftest or plugin that does not import, a
        # usage error): the log's tail is the reason, recorded against the test folder itself
        tail = "\n".join(log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-40:])
        collection = [{"nodeid": suite.tests_dir.name, "outcome": "error", "text": tail}]
    against_version = _installed_version(side, python)
    upstream = {"project": suite.project, "version": suite.version, "against": side, "against_version": against_version,
                "suite": suite.label, "source": suite.source, "rewritten_files": rewritten,
                "install": install.to_dict() if install is not None else None}
    defaults = _header_defaults()
    return complete_records(raws[-1] if raws else None, final, backend=backend, upstream=upstream, exit_code=exit_code,
                            collection=collection, header_defaults=defaults)


def _installed_version(name: str, python: str | None = None) -> str | None:
    from importlib import metadata

    if python and python != sys.executable:  # asked of the suite's own environment
        code = "import sys\nfrom importlib import metadata\ntry:\n    print(metadata.version(sys.argv[1]))\nexcept Exception:\n    pass\n"
        proc = _run([python, "-c", code, name])
        return (proc.stdout or "").strip() or None
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _header_defaults() -> dict[str, Any]:
    import platform

    return {"accel_version": _installed_version("accel"), "torch_version": (_installed_version("torch") or "").split("+")[0] or None,
            "python": platform.python_version(), "os": platform.platform(), "host": platform.node(),
            "schema": "accel.results", "schema_version": "1.0"}


def summary_line(suite: Suite, run: SuiteRun) -> str:
    """``accelerate 1.15.0 against accel on cpu: completed — 313 passed, 20 failed, 4 errors, 120 skipped``."""
    parts = [f"{run.counts.get(o, 0)} {o}" for o in ("passed", "failed", "error", "skipped") if run.counts.get(o)]
    return (f"{suite.label} against {run.against} on {run.backend}: {run.status}"
            + (f" — {', '.join(parts)}" if parts else "") + (f" ({run.collection_errors} modules failed to import)" if run.collection_errors else ""))


def write_summary(path: str | os.PathLike[str], suite: Suite, runs: Sequence[SuiteRun], install: InstallResult | None) -> None:
    """A JSON summary of an upstream qualification (``--json``)."""
    data = {
        "suite": suite.label, "project": suite.project, "version": suite.version, "source": suite.source,
        "extras": suite.extras, "requirements": suite.requirements,
        "install": install.to_dict() if install is not None else None,
        "runs": [{"backend": r.backend, "against": r.against, "status": r.status, "exit_code": r.exit_code,
                  "counts": r.counts, "collection_errors": r.collection_errors, "seconds": round(r.seconds, 1),
                  "results": str(r.results) if r.results else None, "log": str(r.log)} for r in runs],
    }
    Path(path).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
