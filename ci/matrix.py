"""The nightly matrix file (``ci/matrix.yaml``): load, check, expand into cells.

:func:`load_matrix` reads the file and checks every key; anything wrong raises :class:`MatrixError`
naming the file, the line and the key (``backends.cpu.world_sizes``), with a did-you-mean for a
mistyped key or name. :meth:`Matrix.cells` expands backend x torch x python minus the exclusions
into :class:`Cell` objects, the unit that one CI job (``python -m ci.run_cell``) runs.

The objects and their expansion live in :mod:`ci.matrix_model`, the line-numbered YAML document and
the value checks in :mod:`ci.matrix_yaml`; this module checks the file's keys and builds the objects,
and every name is importable from here.

Only PyYAML and the standard library are used: the file is read before any cell environment
(with torch and accel) exists.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Sequence

from ci.matrix_model import (PREINSTALLED, VERSION_PATTERN, Backend, Cell, Exclusion, InstallSpec, Matrix, TorchVersion,
                             cell_id, version_matches)
from ci.matrix_yaml import WORD_PATTERN, Checker, Document, KeyPath, MatrixError, kind, suggest

__all__ = [
    "BENCH_MODES",
    "DEFAULT_MATRIX",
    "OPS_MODES",
    "PREINSTALLED",
    "PROFILE_ENV",
    "REPO",
    "Backend",
    "Cell",
    "Exclusion",
    "InstallSpec",
    "Matrix",
    "MatrixError",
    "TorchVersion",
    "cell_id",
    "load_matrix",
    "suggest",
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

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_TORCH_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
_PYTHON = re.compile(r"^3\.\d+t?$")

#: the workflow checker's name for the line-numbered YAML document it shares with this reader
_Document = Document


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
    doc = Document(path, text)
    check = Checker(doc)
    data = doc.data
    if not isinstance(data, dict):
        raise MatrixError(f"expected a mapping with keys {', '.join(TOP_KEYS)}, got {kind(data)}", path, doc.lines.get(()))
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
        known_issues = check.text(data["known_issues"], ("known_issues",), WORD_PATTERN, "a file path")
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
        raise check.fail(("exclude",), f"expected a list of exclusions, got {kind(raw_rules)}")
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


def _backend(check: Checker, name: str, settings: Any, defaults: dict[str, Any]) -> Backend:
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
    comm = check.text(merged["comm"], at("comm"), WORD_PATTERN, "a collective backend name (gloo, nccl, ..., none)").lower()
    if not isinstance(merged["world_sizes"], list) or not merged["world_sizes"]:
        raise check.fail(at("world_sizes"), f"expected a non-empty list of whole numbers, got {kind(merged['world_sizes'])}")
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


def _mode(check: Checker, value: Any, path: KeyPath, modes: Sequence[str]) -> str:
    """One of ``modes``; YAML 1.1 reads an unquoted ``off`` as false, which counts as ``off``."""
    if value is False:
        value = "off"
    if value not in modes:
        raise check.fail(path, f"expected one of {', '.join(modes)}, got {value!r}{suggest(value, modes)}")
    return value


def _torch_version(check: Checker, name: str, settings: Any, backends: dict[str, Backend]) -> TorchVersion:
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


def _install_spec(check: Checker, value: Any, where: KeyPath, torch: str | None, allow_preinstalled: bool = True) -> InstallSpec:
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
        if not VERSION_PATTERN.match(torch):
            raise check.fail(where, f"torch {torch!r} is not a version number: give a `requirement` (e.g. torch)")
        requirement = f"torch=={torch}"
    index_url = settings.get("index_url")
    if index_url is not None:
        index_url = check.text(index_url, where + ("index_url",), WORD_PATTERN, "a URL")
    extra = settings.get("extra_index_url")
    extras = tuple(check.texts(extra, where + ("extra_index_url",), WORD_PATTERN, "URLs", single_ok=True)) if extra is not None else ()
    pip_args = tuple(check.texts(settings.get("pip_args") or [], where + ("pip_args",), WORD_PATTERN, "pip arguments", empty_ok=True))
    return InstallSpec(requirement=requirement, index_url=index_url, extra_index_urls=extras,
                       pre=check.flag(settings.get("pre", False), where + ("pre",)), pip_args=pip_args)


def _exclusion(check: Checker, index: int, rule: Any, matrix: Matrix) -> Exclusion:
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

    backends = names("backend", list(matrix.backends), WORD_PATTERN, "backends")
    torch = names("torch", list(matrix.torch), WORD_PATTERN, "torch versions")
    pythons = list(dict.fromkeys(p for b in matrix.backends.values() for p in b.python))
    python = names("python", pythons, _PYTHON, "python versions")
    sizes = None
    if "world_sizes" in rule:
        value = rule["world_sizes"]
        if not isinstance(value, list) or not value:
            raise check.fail(where + ("world_sizes",), f"expected a non-empty list of whole numbers, got {kind(value)}")
        sizes = tuple(check.whole(v, where + ("world_sizes", i), 1) for i, v in enumerate(value))
    reason = rule.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise check.fail(where + ("reason",), f"expected text, got {kind(reason)}")
    if backends is None and torch is None and python is None:
        raise check.fail(where, "matches every cell: name a backend, torch version or python version")
    exclusion = Exclusion(index=index, backends=backends, torch=torch, python=python, world_sizes=sizes, reason=reason)
    matched = [(b, t, p) for b, t, p in matrix._combinations() if exclusion.matches(b.name, t.name, p)]
    if not matched:
        raise check.fail(where, "matches no cell (a stale exclusion hides typos): " + exclusion.describe())
    if sizes is not None and not any(s in b.world_sizes for b, _, _ in matched for s in sizes):
        raise check.fail(where + ("world_sizes",), f"none of the matching cells runs world sizes {list(sizes)}")
    return exclusion
