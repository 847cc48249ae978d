"""The nightly matrix file (``ci/matrix.yaml``): load, check, expand into cells.

:func:`load_matrix` reads the file and checks every key; anything wrong raises :class:`MatrixError`
naming the file, the line and the key (``backends.cpu.world_sizes``), with a did-you-mean for a
mistyped key or name. :meth:`Matrix.cells` expands backend x torch x python minus the exclusions
into :class:`Cell` objects, the unit that one CI job (``python -m ci.run_cell``) runs.

Only PyYAML and the standard library are used: the file is read before any cell environment
(with torch and accel) exists.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from accel.commands.config_file import FileValueError  # stdlib-only: usable before accel is installed

__all__ = [
    "DEFAULT_MATRIX",
    "PROFILE_ENV",
    "REPO",
    "Backend",
    "Cell",
    "Exclusion",
    "InstallSpec",
    "Matrix",
    "MatrixError",
    "load_matrix",
    "version_matches",
]

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MATRIX = REPO / "ci" / "matrix.yaml"
#: environment variable choosing an install profile (``local``) when --profile is not given
PROFILE_ENV = "ACCEL_CI_PROFILE"
SCHEMA_VERSION = 1

TOP_KEYS = ("version", "defaults", "backends", "torch", "exclude", "profiles", "known_issues")
BACKEND_KEYS = ("runner", "comm", "world_sizes", "python", "suites", "workers", "bench", "ops", "dist_timeout",
                "timeout_minutes", "setup_python", "enabled", "plugins")
TORCH_KEYS = ("enabled", "install")
INSTALL_KEYS = ("requirement", "index_url", "extra_index_url", "pre", "pip_args")
EXCLUDE_KEYS = ("backend", "torch", "python", "world_sizes", "reason")
PROFILE_KEYS = ("install", "description")
BENCH_MODES = ("off", "quick", "full")
#: how much of the operator sweep (`accel ops`) a cell runs after its suites
OPS_MODES = ("off", "quick", "full")
PREINSTALLED = "preinstalled"

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_TORCH_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
_VERSION = re.compile(r"^\d+(\.\d+)*((a|b|rc|\.post|\.dev)\d+)*(\+[A-Za-z0-9.]+)?$")
_PYTHON = re.compile(r"^3\.\d+t?$")
_WORD = re.compile(r"^\S+$")

KeyPath = tuple  # ("backends", "cpu", "world_sizes", 0)


# ---------------------------------------------------------------------------- errors
class MatrixError(FileValueError):
    """A matrix file (or a request against one) that cannot be used; the message says where and why."""

    what = "matrix file"


def suggest(word: Any, options: Iterable[Any]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``options``, or an empty string."""
    match = difflib.get_close_matches(str(word), [str(o) for o in options], n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _dotted(path: KeyPath) -> str:
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            part = str(part)
            shown = part if re.fullmatch(r"[\w-]+", part) else f'"{part}"'
            text += ("." if text else "") + shown
    return text


# ---------------------------------------------------------------------------- YAML with line numbers
class _Document:
    """The parsed file plus the line of every key and the raw text of every scalar."""

    def __init__(self, path: Path, text: str, error: type[MatrixError] = MatrixError,
                 empty_hint: str = "expected `version: 1`, `backends:`, `torch:`, ..."):
        import yaml

        self.path = path
        self.Error = error  # the kind of error this document raises (matrix or workflow file)
        self.lines: dict[KeyPath, int] = {}
        self.raw: dict[KeyPath, str] = {}
        from accel.facts import yaml_safe

        try:  # aliases are checked before anything is built: an anchor bomb is refused, never expanded
            root = yaml_safe.compose(text, path)
        except yaml_safe.YamlError as exc:
            kind = "refused" if exc.refused else "YAML syntax error"
            raise self.Error(f"{kind}: {exc.problem}", path, exc.line) from None
        if root is None:
            raise self.Error(f"the file is empty ({empty_hint})", path)
        self._constructor = yaml.SafeLoader("")
        self._yaml = yaml
        self.data = self._build(root, ())

    def error(self, path: KeyPath, message: str) -> MatrixError:
        line = None
        probe = tuple(path)
        while probe and line is None:
            line = self.lines.get(probe)
            probe = probe[:-1]
        return self.Error(message, self.path, line if line is not None else self.lines.get(()), _dotted(path) or None)

    def _build(self, node: Any, path: KeyPath) -> Any:
        yaml = self._yaml
        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            result: dict[str, Any] = {}
            merged: dict[str, Any] = {}
            for key_node, value_node in node.value:
                line = key_node.start_mark.line + 1
                if key_node.tag == "tag:yaml.org,2002:merge":
                    sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                    for source in sources:
                        value = self._build(source, path)
                        if not isinstance(value, dict):
                            raise self.Error("`<<` merges mappings only", self.path, line, _dotted(path) or None)
                        for k, v in value.items():
                            merged.setdefault(k, v)
                    continue
                if not isinstance(key_node, yaml.ScalarNode):
                    raise self.Error("keys must be plain names", self.path, line, _dotted(path) or None)
                key = key_node.value
                if key in result:
                    raise self.Error(f"appears twice (lines {self.lines[path + (key,)]} and {line})",
                                      self.path, line, _dotted(path + (key,)))
                self.lines[path + (key,)] = line
                result[key] = self._build(value_node, path + (key,))
            for k, v in merged.items():
                result.setdefault(k, v)
            return result
        if isinstance(node, yaml.SequenceNode):
            return [self._build(item, path + (i,)) for i, item in enumerate(node.value)]
        self.raw[path] = node.value
        return self._constructor.construct_object(node, deep=True)


# ---------------------------------------------------------------------------- value checks
class _Checker:
    def __init__(self, doc: _Document):
        self.doc = doc

    def fail(self, path: KeyPath, message: str) -> MatrixError:
        return self.doc.error(path, message)

    def mapping(self, value: Any, path: KeyPath, keys: Sequence[str] | None, what: str) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(path, f"expected a mapping of {what}, got {_kind(value)}")
        if keys is not None:
            for key in value:
                if key not in keys:
                    raise self.fail(path + (key,), f"unknown key{suggest(key, keys)}; known keys: {', '.join(keys)}")
        return value

    def text(self, value: Any, path: KeyPath, pattern: re.Pattern[str] = _WORD, what: str = "a word without spaces") -> str:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and path in self.doc.raw:
            value = self.doc.raw[path]  # versions: the text as written, so 3.10 stays "3.10"
        if not isinstance(value, str) or not pattern.match(value.strip()):
            raise self.fail(path, f"expected {what}, got {value!r}")
        return value.strip()

    def texts(self, value: Any, path: KeyPath, pattern: re.Pattern[str] = _WORD, what: str = "words",
              single_ok: bool = False, empty_ok: bool = False) -> list[str]:
        if single_ok and isinstance(value, (str, int, float)) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, list):
            raise self.fail(path, f"expected a list of {what}, got {_kind(value)}")
        if not value and not empty_ok:
            raise self.fail(path, f"expected a non-empty list of {what}")
        items = [self.text(v, path + (i,) if (path + (i,)) in self.doc.lines else path, pattern, what) for i, v in enumerate(value)]
        for i, item in enumerate(items):
            if item in items[:i]:
                raise self.fail(path, f"lists {item!r} twice")
        return items

    def whole(self, value: Any, path: KeyPath, minimum: int) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise self.fail(path, f"expected a whole number >= {minimum}, got {value!r}")
        return value

    def flag(self, value: Any, path: KeyPath) -> bool:
        if not isinstance(value, bool):
            raise self.fail(path, f"expected true or false, got {value!r}")
        return value


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, str):
        return f"the text {value!r}"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    return {dict: "a mapping", list: "a list"}.get(type(value), type(value).__name__)


# ---------------------------------------------------------------------------- the model
@dataclass(frozen=True)
class InstallSpec:
    """How a cell gets its torch: ``pip install <options> <requirement>``, or the image's own."""

    preinstalled: bool = False
    requirement: str | None = None
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    pre: bool = False
    pip_args: tuple[str, ...] = ()
    #: the install profile this spec came from (None: the matrix's own entry)
    profile: str | None = None

    def pip_options(self) -> list[str]:
        """pip arguments before the requirement (index, --pre, extra arguments)."""
        options: list[str] = []
        if self.index_url:
            options += ["--index-url", self.index_url]
        for url in self.extra_index_urls:
            options += ["--extra-index-url", url]
        if self.pre:
            options.append("--pre")
        options += list(self.pip_args)
        return options

    def describe(self) -> str:
        if self.preinstalled:
            return PREINSTALLED
        return " ".join([*self.pip_options(), str(self.requirement)])

    def to_dict(self) -> dict[str, Any]:
        if self.preinstalled:
            return {"preinstalled": True}
        return {"requirement": self.requirement, "index_url": self.index_url,
                "extra_index_urls": list(self.extra_index_urls), "pre": self.pre,
                "pip_args": list(self.pip_args), "profile": self.profile}


@dataclass(frozen=True)
class Backend:
    name: str
    runner: tuple[str, ...]
    comm: str
    world_sizes: tuple[int, ...]
    python: tuple[str, ...]
    suites: tuple[str, ...] | None  # None: all
    workers: int
    bench: str
    dist_timeout: int
    timeout_minutes: int
    setup_python: bool
    enabled: bool
    #: off | quick | full: the operator sweep after the suites
    ops: str = "off"
    #: backend plug-in packages (folders in the repository) installed after accel
    plugins: tuple[str, ...] = ()


@dataclass(frozen=True)
class TorchVersion:
    name: str
    enabled: bool
    install: dict[str, InstallSpec]  # backend name or "*" -> spec

    def install_for(self, backend: str) -> InstallSpec | None:
        return self.install.get(backend) or self.install.get("*")


@dataclass(frozen=True)
class Exclusion:
    index: int
    backends: tuple[str, ...] | None
    torch: tuple[str, ...] | None
    python: tuple[str, ...] | None
    world_sizes: tuple[int, ...] | None
    reason: str | None

    def matches(self, backend: str, torch: str, python: str) -> bool:
        return ((self.backends is None or backend in self.backends)
                and (self.torch is None or torch in self.torch)
                and (self.python is None or python in self.python))

    def describe(self) -> str:
        parts = [f"{k}={','.join(map(str, v))}" for k, v in
                 (("backend", self.backends), ("torch", self.torch), ("python", self.python)) if v is not None]
        what = " ".join(parts) or "every cell"
        if self.world_sizes is not None:
            what += f": world sizes {','.join(map(str, self.world_sizes))}"
        return what + (f" ({self.reason})" if self.reason else "")


@dataclass(frozen=True)
class Cell:
    """One CI job: one backend with one torch version and one python version."""

    id: str
    backend: str
    torch: str
    python: str
    runner: tuple[str, ...]
    comm: str
    world_sizes: tuple[int, ...]
    suites: tuple[str, ...] | None
    workers: int
    bench: str
    dist_timeout: int
    timeout_minutes: int
    setup_python: bool
    install: InstallSpec
    #: the torch version the cell must end up with (None: any, e.g. a nightly)
    expected_torch: str | None
    enabled: bool = True
    #: known-issues YAML (path from the repository root) for the suites and the report
    known_issues: str | None = None
    #: world sizes an exclusion removed from this cell
    removed_world_sizes: tuple[int, ...] = ()
    #: backend plug-in packages (folders in the repository) installed after accel
    plugins: tuple[str, ...] = ()
    #: off | quick | full: the operator sweep (`accel ops`) after the suites
    ops: str = "off"

    def github(self) -> dict[str, Any]:
        """The cell as one ``include`` entry of the GitHub Actions job matrix."""
        return {"id": self.id, "backend": self.backend, "torch": self.torch, "python": self.python,
                "runner": list(self.runner), "setup_python": self.setup_python,
                "timeout_minutes": self.timeout_minutes}

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "backend": self.backend, "torch": self.torch, "python": self.python,
                "runner": list(self.runner), "comm": self.comm, "world_sizes": list(self.world_sizes),
                "removed_world_sizes": list(self.removed_world_sizes),
                "suites": "all" if self.suites is None else list(self.suites), "workers": self.workers,
                "bench": self.bench, "ops": self.ops, "dist_timeout": self.dist_timeout,
                "timeout_minutes": self.timeout_minutes,
                "setup_python": self.setup_python, "install": self.install.to_dict(),
                "expected_torch": self.expected_torch, "enabled": self.enabled, "plugins": list(self.plugins),
                "known_issues": self.known_issues}


def cell_id(backend: str, torch: str, python: str) -> str:
    return f"{backend}-torch{torch}-py{python}"


def version_matches(installed: str, expected: str | None) -> bool:
    """Whether an installed torch version (``2.13.0+cpu``) is the one a cell asked for (``2.13.0``).

    The local part (``+cpu``, ``+cu130``) is ignored unless the request names one; ``None`` accepts any.
    """
    if expected is None:
        return True
    installed, expected = installed.strip(), expected.strip()
    if "+" in expected:
        return installed == expected
    return installed.split("+", 1)[0] == expected


def _pinned(requirement: str) -> str | None:
    match = re.fullmatch(r"\s*torch\s*===?\s*([^\s,;]+)\s*", requirement)
    return match.group(1) if match else None


@dataclass
class Matrix:
    path: Path
    backends: dict[str, Backend]
    torch: dict[str, TorchVersion]
    exclusions: list[Exclusion]
    profiles: dict[str, InstallSpec]
    known_issues: str | None
    _doc: Any = field(default=None, repr=False, compare=False)

    # ------------------------------------------------------------------ expansion
    def _combinations(self) -> Iterable[tuple[Backend, TorchVersion, str]]:
        for backend in self.backends.values():
            for torch in self.torch.values():
                for python in backend.python:
                    yield backend, torch, python

    def excluded_by(self, backend: str, torch: str, python: str) -> Exclusion | None:
        """The exclusion removing this whole cell, or None."""
        for rule in self.exclusions:
            if rule.world_sizes is None and rule.matches(backend, torch, python):
                return rule
        return None

    def _make_cell(self, backend: Backend, torch: TorchVersion, python: str, profile: str | None) -> Cell:
        removed: list[int] = []
        for rule in self.exclusions:
            if rule.world_sizes is not None and rule.matches(backend.name, torch.name, python):
                removed += [w for w in rule.world_sizes if w in backend.world_sizes and w not in removed]
        sizes = tuple(w for w in backend.world_sizes if w not in removed)
        spec = torch.install_for(backend.name)
        assert spec is not None  # checked at load time
        if profile is not None and not spec.preinstalled:
            spec = self._profile_spec(profile, torch.name)
        expected = torch.name if _VERSION.match(torch.name) else None
        if not spec.preinstalled and spec.requirement and _pinned(spec.requirement):
            expected = _pinned(spec.requirement)
        return Cell(
            id=cell_id(backend.name, torch.name, python), backend=backend.name, torch=torch.name, python=python,
            runner=backend.runner, comm=backend.comm, world_sizes=sizes, suites=backend.suites,
            workers=backend.workers, bench=backend.bench, dist_timeout=backend.dist_timeout,
            timeout_minutes=backend.timeout_minutes, setup_python=backend.setup_python, install=spec,
            expected_torch=expected, enabled=backend.enabled and torch.enabled, known_issues=self.known_issues,
            removed_world_sizes=tuple(removed), plugins=backend.plugins, ops=backend.ops,
        )

    def _profile_spec(self, profile: str, torch: str) -> InstallSpec:
        if profile not in self.profiles:
            known = ", ".join(self.profiles) or "none"
            raise MatrixError(f"unknown install profile {profile!r}{suggest(profile, self.profiles)}; "
                              f"profiles in {self.path}: {known}", key="--profile")
        spec = self.profiles[profile]
        values = [spec.requirement or "", spec.index_url or "", *spec.extra_index_urls, *spec.pip_args]
        if any("{torch}" in v for v in values) and not _VERSION.match(torch):
            raise MatrixError(f"install profile {profile!r} puts the torch version into its install, "
                              f"but torch {torch!r} is not a version number", key="--profile")

        def fill(text: str | None) -> str | None:
            return None if text is None else text.replace("{torch}", torch)

        return InstallSpec(requirement=fill(spec.requirement) or f"torch=={torch}", index_url=fill(spec.index_url),
                           extra_index_urls=tuple(fill(u) or "" for u in spec.extra_index_urls), pre=spec.pre,
                           pip_args=tuple(fill(a) or "" for a in spec.pip_args), profile=profile)

    def cells(self, only: Iterable[str] | None = None, torch: Iterable[str] | None = None,
              python: Iterable[str] | None = None, include_disabled: bool = False,
              profile: str | None = None) -> list[Cell]:
        """The cells to run, in file order: backend x torch x python minus the exclusions.

        ``only``/``torch``/``python`` filter by backend name, torch version and python version
        (unknown names are an error); disabled backends and torch versions are left out unless
        ``include_disabled``.
        """
        only_set = self._check_filter(only, list(self.backends), "backend", "--only")
        torch_set = self._check_filter(torch, list(self.torch), "torch version", "--torch")
        all_pythons = list(dict.fromkeys(p for b in self.backends.values() for p in b.python))
        python_set = self._check_filter(python, all_pythons, "python version", "--python")
        cells = []
        for backend, version, py in self._combinations():
            if only_set is not None and backend.name not in only_set:
                continue
            if torch_set is not None and version.name not in torch_set:
                continue
            if python_set is not None and py not in python_set:
                continue
            if not include_disabled and not (backend.enabled and version.enabled):
                continue
            if self.excluded_by(backend.name, version.name, py):
                continue
            cells.append(self._make_cell(backend, version, py, profile))
        return cells

    @staticmethod
    def _check_filter(values: Iterable[str] | None, known: list[str], what: str, option: str) -> set[str] | None:
        if values is None:
            return None
        items = [v.strip() for value in values for v in str(value).split(",") if v.strip()]
        if not items:
            return None
        for item in items:
            if item not in known:
                raise MatrixError(f"unknown {what} {item!r}{suggest(item, known)}; known: {', '.join(known)}", key=option)
        return set(items)

    def cell(self, identifier: str, profile: str | None = None) -> Cell:
        """The cell with this id (disabled ones too); MatrixError listing the known ids otherwise."""
        for backend, version, py in self._combinations():
            if cell_id(backend.name, version.name, py) != identifier:
                continue
            rule = self.excluded_by(backend.name, version.name, py)
            if rule is not None:
                raise MatrixError(f"cell {identifier!r} is excluded by exclude[{rule.index}]: {rule.describe()}", key="--cell")
            return self._make_cell(backend, version, py, profile)
        known = [c.id for c in self.cells(include_disabled=True)]
        raise MatrixError(f"unknown cell {identifier!r}{suggest(identifier, known)}; cells in {self.path}: "
                          + ", ".join(known), key="--cell")


# ---------------------------------------------------------------------------- loading
def load_matrix(path: str | os.PathLike[str] | None = None) -> Matrix:
    """Read and check a matrix file (default ``ci/matrix.yaml``).

    Raises MatrixError naming the file, the line and the key for a YAML syntax error, an empty
    file, an unknown key (with a did-you-mean), a value of the wrong type, an exclusion naming an
    unknown backend/torch/python or matching nothing, and a cell without a way to install torch.
    """
    path = Path(path) if path is not None else DEFAULT_MATRIX
    from accel.facts import yaml_safe

    try:
        yaml_safe.check_size(path)
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MatrixError("no such file", path) from None
    except yaml_safe.YamlError as exc:
        raise MatrixError(f"refused: {exc.problem}", path) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise MatrixError(f"cannot be read: {exc}", path) from None
    doc = _Document(path, text)
    check = _Checker(doc)
    data = doc.data
    if not isinstance(data, dict):
        raise MatrixError(f"expected a mapping with keys {', '.join(TOP_KEYS)}, got {_kind(data)}", path, doc.lines.get(()))
    check.mapping(data, (), TOP_KEYS, "top-level keys")
    for required in ("version", "backends", "torch"):
        if required not in data:
            raise MatrixError(f"missing the top-level key {required!r}", path, 1)
    if data["version"] != SCHEMA_VERSION:
        raise check.fail(("version",), f"this reader knows matrix version {SCHEMA_VERSION}, got {data['version']!r}")

    defaults = check.mapping(data.get("defaults"), ("defaults",), BACKEND_KEYS, "backend settings")
    backends_data = check.mapping(data["backends"], ("backends",), None, "backend names to settings")
    if not backends_data:
        raise check.fail(("backends",), "no backends defined")
    backends: dict[str, Backend] = {}
    for name, settings in backends_data.items():
        backends[name] = _backend(check, name, settings, defaults)

    torch_data = check.mapping(data["torch"], ("torch",), None, "torch versions to settings")
    if not torch_data:
        raise check.fail(("torch",), "no torch versions defined")
    versions: dict[str, TorchVersion] = {}
    for name, settings in torch_data.items():
        versions[name] = _torch_version(check, name, settings, backends)

    known_issues = None
    if data.get("known_issues") is not None:
        known_issues = check.text(data["known_issues"], ("known_issues",), _WORD, "a file path")
        if not (REPO / known_issues).is_file():
            raise check.fail(("known_issues",), f"no such file {known_issues!r} (paths are relative to {REPO})")

    profiles: dict[str, InstallSpec] = {}
    for name, settings in check.mapping(data.get("profiles"), ("profiles",), None, "profile names to settings").items():
        where = ("profiles", name)
        if not _NAME.match(name):
            raise check.fail(where, "profile names are lower-case words (a-z, 0-9, _)")
        settings = check.mapping(settings, where, PROFILE_KEYS, "profile settings")
        if "install" not in settings:
            raise check.fail(where, "missing `install` (a mapping of requirement, index_url, ...)")
        spec = _install_spec(check, settings["install"], where + ("install",), None, allow_preinstalled=False)
        profiles[name] = spec

    matrix = Matrix(path=path, backends=backends, torch=versions, exclusions=[], profiles=profiles,
                    known_issues=known_issues, _doc=doc)
    raw_rules = data.get("exclude") or []
    if not isinstance(raw_rules, list):
        raise check.fail(("exclude",), f"expected a list of exclusions, got {_kind(raw_rules)}")
    for i, rule in enumerate(raw_rules):
        matrix.exclusions.append(_exclusion(check, i, rule, matrix))

    # every cell that can be planned has a torch install, and a world size it can run
    for backend, version, py in matrix._combinations():
        if matrix.excluded_by(backend.name, version.name, py):
            continue
        if version.install_for(backend.name) is None:
            raise check.fail(("torch", version.name, "install"),
                             f"no install for backend {backend.name!r} (add `{backend.name}:` or `\"*\":`, or exclude the cell)")
        cell = matrix._make_cell(backend, version, py, None)
        if not cell.world_sizes:
            raise check.fail(("exclude",), f"the exclusions remove every world size of {cell.id}: exclude the cell instead")
    return matrix


def _backend(check: _Checker, name: str, settings: Any, defaults: dict[str, Any]) -> Backend:
    where = ("backends", name)
    if not _NAME.match(name):
        raise check.fail(where, "backend names are lower-case words (a-z, 0-9, _) as accel registers them")
    settings = check.mapping(settings, where, BACKEND_KEYS, "backend settings")
    merged = {**defaults, **settings}

    def at(key: str) -> KeyPath:
        return where + (key,) if key in settings else ("defaults", key)

    for required in ("runner", "comm", "world_sizes", "python"):
        if required not in merged:
            raise check.fail(where, f"missing {required!r} (set it here or under defaults)")
    runner = check.texts(merged["runner"], at("runner"), what="runner labels", single_ok=True)
    comm = check.text(merged["comm"], at("comm"), _WORD, "a collective backend name (gloo, nccl, ..., none)").lower()
    if not isinstance(merged["world_sizes"], list) or not merged["world_sizes"]:
        raise check.fail(at("world_sizes"), f"expected a non-empty list of whole numbers, got {_kind(merged['world_sizes'])}")
    sizes = [check.whole(v, at("world_sizes") + (i,), 1) for i, v in enumerate(merged["world_sizes"])]
    if len(set(sizes)) != len(sizes):
        raise check.fail(at("world_sizes"), f"lists a world size twice: {sizes}")
    if comm == "none" and any(s > 1 for s in sizes):
        raise check.fail(at("world_sizes"), f"comm is none (single process only) but the world sizes are {sizes}")
    python = check.texts(merged["python"], at("python"), _PYTHON, 'quoted python versions such as "3.11"')
    suites_value = merged.get("suites", "all")
    if suites_value == "all":
        suites = None
    else:
        suites = tuple(check.texts(suites_value, at("suites"), re.compile(r"^[\w/.-]+\.py$"),
                                   "`all` or suite files such as test_collectives.py"))
        for i, item in enumerate(suites):
            if item.startswith("benchmarks"):
                raise check.fail(at("suites") + (i,), "the benchmarks are run by `bench`, not as a suite")
            if not (REPO / "suites" / item).is_file():
                known = sorted(p.name for p in (REPO / "suites").glob("test_*.py"))
                raise check.fail(at("suites") + (i,), f"no suite {item!r} in {REPO / 'suites'}{suggest(item, known)}")
    workers = check.whole(merged.get("workers", 0), at("workers"), 0)
    bench = _mode(check, merged.get("bench", "full"), at("bench"), BENCH_MODES)
    ops = _mode(check, merged.get("ops", "off"), at("ops"), OPS_MODES)
    plugins: tuple[str, ...] = ()
    if merged.get("plugins") is not None:
        plugins = tuple(check.texts(merged["plugins"], at("plugins"), re.compile(r"^[\w/.-]+$"),
                                    "plug-in package folders in the repository, such as plugins/accel-emu"))
        for i, item in enumerate(plugins):
            if not (REPO / item / "pyproject.toml").is_file():
                raise check.fail(at("plugins") + (i,), f"no plug-in package (a folder with a pyproject.toml) at {item!r}")
    return Backend(
        plugins=plugins,
        name=name, runner=tuple(runner), comm=comm, world_sizes=tuple(sizes), python=tuple(python), suites=suites,
        workers=workers, bench=bench, ops=ops,
        dist_timeout=check.whole(merged.get("dist_timeout", 120), at("dist_timeout"), 1),
        timeout_minutes=check.whole(merged.get("timeout_minutes", 120), at("timeout_minutes"), 1),
        setup_python=check.flag(merged.get("setup_python", True), at("setup_python")),
        enabled=check.flag(merged.get("enabled", True), at("enabled")),
    )


def _mode(check: _Checker, value: Any, path: KeyPath, modes: Sequence[str]) -> str:
    """One of ``modes``; YAML 1.1 reads an unquoted ``off`` as false, which counts as ``off``."""
    if value is False:
        value = "off"
    if value not in modes:
        raise check.fail(path, f"expected one of {', '.join(modes)}, got {value!r}{suggest(value, modes)}")
    return value


def _torch_version(check: _Checker, name: str, settings: Any, backends: dict[str, Backend]) -> TorchVersion:
    where = ("torch", name)
    if not _TORCH_NAME.match(name):
        raise check.fail(where, "torch versions are written like \"2.13.0\" or a name such as nightly (no spaces or slashes)")
    settings = check.mapping(settings, where, TORCH_KEYS, "torch version settings")
    install_data = check.mapping(settings.get("install"), where + ("install",), None, "backend names to installs")
    install: dict[str, InstallSpec] = {}
    for backend, value in install_data.items():
        if backend != "*" and backend not in backends:
            raise check.fail(where + ("install", backend), f"unknown backend{suggest(backend, backends)}; backends: {', '.join(backends)}")
        install[backend] = _install_spec(check, value, where + ("install", backend), name)
    return TorchVersion(name=name, enabled=check.flag(settings.get("enabled", True), where + ("enabled",)), install=install)


def _install_spec(check: _Checker, value: Any, where: KeyPath, torch: str | None, allow_preinstalled: bool = True) -> InstallSpec:
    if value == PREINSTALLED and allow_preinstalled:
        return InstallSpec(preinstalled=True)
    if isinstance(value, str):
        hint = f"`{PREINSTALLED}` or " if allow_preinstalled else ""
        raise check.fail(where, f"expected {hint}a mapping of {', '.join(INSTALL_KEYS)}, got {value!r}{suggest(value, [PREINSTALLED])}")
    settings = check.mapping(value, where, INSTALL_KEYS, "install settings")
    requirement = settings.get("requirement")
    if requirement is not None:
        if not isinstance(requirement, str) or not requirement.strip().lower().startswith("torch"):
            raise check.fail(where + ("requirement",), f"expected a pip requirement for torch (torch==2.13.0), got {requirement!r}")
        requirement = requirement.strip()
    elif torch is not None:
        if not _VERSION.match(torch):
            raise check.fail(where, f"torch {torch!r} is not a version number: give a `requirement` (e.g. torch)")
        requirement = f"torch=={torch}"
    index_url = settings.get("index_url")
    if index_url is not None:
        index_url = check.text(index_url, where + ("index_url",), _WORD, "a URL")
    extra = settings.get("extra_index_url")
    extras = tuple(check.texts(extra, where + ("extra_index_url",), _WORD, "URLs", single_ok=True)) if extra is not None else ()
    pip_args = tuple(check.texts(settings.get("pip_args") or [], where + ("pip_args",), _WORD, "pip arguments", empty_ok=True))
    return InstallSpec(requirement=requirement, index_url=index_url, extra_index_urls=extras,
                       pre=check.flag(settings.get("pre", False), where + ("pre",)), pip_args=pip_args)


def _exclusion(check: _Checker, index: int, rule: Any, matrix: Matrix) -> Exclusion:
    where = ("exclude", index)
    rule = check.mapping(rule, where, EXCLUDE_KEYS, "backend/torch/python/world_sizes/reason")

    def names(key: str, known: list[str], pattern: re.Pattern[str], what: str) -> tuple[str, ...] | None:
        if key not in rule:
            return None
        values = check.texts(rule[key], where + (key,), pattern, what, single_ok=True)
        for i, value in enumerate(values):
            if value not in known:
                path = where + (key, i) if isinstance(rule[key], list) else where + (key,)
                raise check.fail(path, f"unknown {what.rstrip('s')} {value!r}{suggest(value, known)}; known: {', '.join(known)}")
        return tuple(values)

    backends = names("backend", list(matrix.backends), _WORD, "backends")
    torch = names("torch", list(matrix.torch), _WORD, "torch versions")
    pythons = list(dict.fromkeys(p for b in matrix.backends.values() for p in b.python))
    python = names("python", pythons, _PYTHON, "python versions")
    sizes = None
    if "world_sizes" in rule:
        value = rule["world_sizes"]
        if not isinstance(value, list) or not value:
            raise check.fail(where + ("world_sizes",), f"expected a non-empty list of whole numbers, got {_kind(value)}")
        sizes = tuple(check.whole(v, where + ("world_sizes", i), 1) for i, v in enumerate(value))
    reason = rule.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise check.fail(where + ("reason",), f"expected text, got {_kind(reason)}")
    if backends is None and torch is None and python is None:
        raise check.fail(where, "matches every cell: name a backend, torch version or python version")
    exclusion = Exclusion(index=index, backends=backends, torch=torch, python=python, world_sizes=sizes, reason=reason)
    matched = [(b, t, p) for b, t, p in matrix._combinations() if exclusion.matches(b.name, t.name, p)]
    if not matched:
        raise check.fail(where, "matches no cell (a stale exclusion hides typos): " + exclusion.describe())
    if sizes is not None and not any(s in b.world_sizes for b, _, _ in matched for s in sizes):
        raise check.fail(where + ("world_sizes",), f"none of the matching cells runs world sizes {list(sizes)}")
    return exclusion
