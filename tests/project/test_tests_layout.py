"""The project's tests mirror the package layout, so the test of a module is found by its path.

``tests/lib/`` mirrors ``accel/``, ``tests/harness/`` mirrors ``accel_harness/`` and ``tests/reports/``
mirrors ``accel_reports/`` (``accel/backends/cpu.py`` -> ``tests/lib/backends/test_cpu.py``);
``tests/project/`` holds the checks that span the repository (import layering, wheel contents, CI
files ...). Helpers live in ``tests/support/`` (on pytest's path, imported by bare name) and the scripts
tests launch in ``tests/scripts/``. A test module lying flat in ``tests/`` again, or one in a folder
that matches no package folder, fails here.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
#: test folder -> the package folder it mirrors (None: any layout, the checks that span the repository)
MIRRORS = {"lib": "accel", "harness": "accel_harness", "reports": "accel_reports", "project": None}
#: folders of tests/ that hold no test modules
SUPPORT_FOLDERS = {"support", "scripts", "__pycache__"}


def layout_problems(tests: Path, repo: Path) -> list[str]:
    """One line per test module or folder of ``tests`` that breaks the mirrored layout."""
    problems = []
    for entry in sorted(tests.iterdir()):
        name = entry.relative_to(repo).as_posix()
        if entry.is_file() and entry.name.startswith("test_") and entry.suffix == ".py":
            problems.append(f"{name}: a test module lies flat in tests/; put it under {', '.join(MIRRORS)}")
        elif entry.is_dir() and entry.name not in MIRRORS and entry.name not in SUPPORT_FOLDERS:
            problems.append(f"{name}/: not a folder of the layout ({', '.join([*MIRRORS, *sorted(SUPPORT_FOLDERS)])})")
    for folder in SUPPORT_FOLDERS - {"__pycache__"}:
        problems += [f"{p.relative_to(repo).as_posix()}: a test module among the helpers; it belongs under "
                     f"{', '.join(MIRRORS)}" for p in sorted((tests / folder).rglob("test_*.py"))]
    for top, package in MIRRORS.items():
        for path in sorted((tests / top).rglob("test_*.py")):
            if "__pycache__" in path.parts:
                continue
            folder = path.parent.relative_to(tests / top)
            if package is not None and not (repo / package / folder).is_dir():
                problems.append(f"{path.relative_to(repo).as_posix()}: mirrors {(Path(package) / folder).as_posix()}/, "
                                "which is not a package folder")
            parts = path.parent.relative_to(tests).parts
            for here in (tests.joinpath(*parts[:depth]) for depth in range(1, len(parts) + 1)):
                if not (here / "__init__.py").is_file():
                    problems.append(f"{here.relative_to(repo).as_posix()}/: no __init__.py (test modules of two "
                                    "folders may share a name only as packages)")
    return sorted(set(problems))


def test_the_tests_mirror_the_packages():
    problems = layout_problems(REPO / "tests", REPO)
    assert not problems, "\n".join(problems)


def test_the_check_finds_a_flat_test_a_stray_folder_and_a_folder_without_a_package(tmp_path):
    (tmp_path / "accel" / "backends").mkdir(parents=True)
    tests = tmp_path / "tests"
    for folder in ("lib/backends", "lib/gone", "project/ci", "misc", "support"):
        (tests / folder).mkdir(parents=True)
    for init in ("lib", "lib/backends", "lib/gone", "project"):
        (tests / init / "__init__.py").write_text("")
    for module in ("test_flat.py", "lib/backends/test_cpu.py", "lib/gone/test_old.py", "project/ci/test_matrix.py",
                   "support/test_helper.py"):
        (tests / module).write_text("")
    assert layout_problems(tests, tmp_path) == [
        "tests/lib/gone/test_old.py: mirrors accel/gone/, which is not a package folder",
        "tests/misc/: not a folder of the layout (lib, harness, reports, project, __pycache__, scripts, support)",
        "tests/project/ci/: no __init__.py (test modules of two folders may share a name only as packages)",
        "tests/support/test_helper.py: a test module among the helpers; it belongs under lib, harness, reports, project",
        "tests/test_flat.py: a test module lies flat in tests/; put it under lib, harness, reports, project",
    ]


def test_no_folder_on_the_tests_path_shadows_a_package_of_the_checkout():
    """pytest puts its ``pythonpath`` entries first on ``sys.path``: a folder there named like a top-level package
    of the checkout (``accel``, ``ci`` ...) would be imported instead of it."""
    entries = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["pythonpath"]
    top_level = {p.name for p in REPO.iterdir() if p.is_dir() and not p.name.startswith(".")}
    assert "accel" in top_level and "ci" in top_level
    for entry in entries:
        folder = (REPO / entry).resolve()
        if folder == REPO:
            continue
        assert folder != REPO / "tests", "tests/ itself on the path would make lib/, harness/, ... top-level names"
        clashes = {p.name for p in folder.iterdir()} & top_level
        assert not clashes, f"{entry}/ holds {sorted(clashes)}, which would shadow the checkout's packages"
