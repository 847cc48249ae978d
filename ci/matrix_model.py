"""The nightly matrix as objects: backends, torch versions, install specs, exclusions, and their
expansion into :class:`Cell` objects (what ``ci.matrix`` builds after checking the file).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ci.matrix_yaml import MatrixError, suggest

#: an install spec meaning "the runner image's own torch"
PREINSTALLED = "preinstalled"
#: a torch version number (``2.13.0``, ``2.14.0.dev20250101``, ``2.13.0+cpu``)
VERSION_PATTERN = re.compile(r"^\d+(\.\d+)*((a|b|rc|\.post|\.dev)\d+)*(\+[A-Za-z0-9.]+)?$")


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
    """One backend's settings (its entry under ``backends:``, with the defaults filled in)."""

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
    """One torch version (an entry under ``torch:``) and how each backend installs it."""

    name: str
    enabled: bool
    install: dict[str, InstallSpec]  # backend name or "*" -> spec

    def install_for(self, backend: str) -> InstallSpec | None:
        return self.install.get(backend) or self.install.get("*")


@dataclass(frozen=True)
class Exclusion:
    """One ``exclude:`` rule: the cells it removes, or only some world sizes of them."""

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
    """A cell's id, e.g. ``cpu-torch2.13.0-py3.11``."""
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
    """A checked matrix file (built by :func:`ci.matrix.load_matrix`); expands into :class:`Cell` objects."""

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
        expected = torch.name if VERSION_PATTERN.match(torch.name) else None
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
        if any("{torch}" in v for v in values) and not VERSION_PATTERN.match(torch):
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
