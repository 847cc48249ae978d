"""The wheel ships the library, the harness, the suites and the report templates, and nothing else.

Development benchmark scripts (``python suites/benchmarks/NAME.py``), the synthetic-results generator
and the project's own tests stay in the repository. The wheel is built from a copy of the sources.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("accel", "accel_harness", "accel_reports", "suites", "setup.py", "pyproject.toml", "README.md")


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory) -> list[str]:
    pytest.importorskip("setuptools")
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    source.mkdir()
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(path, source / name)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "--disable-pip-version-check", "-q", "-w", str(work / "dist"), str(source)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (wheel,) = (work / "dist").glob("accel-*.whl")
    return zipfile.ZipFile(wheel).namelist()


def test_the_wheel_ships_library_harness_suites_and_templates(wheel_names):
    names = set(wheel_names)
    for expected in ("accel/accelerator.py", "accel/facts/environment.py", "accel_harness/plugin.py",
                     "accel_harness/upstream_skips.yaml", "accel_harness/suites/test_training.py",
                     "accel_harness/suites/benchmarks/test_bench_matmul.py",
                     "accel_harness/suites/benchmarks/timing.py", "accel_reports/render/report.py"):
        assert expected in names, expected
    for module in (REPO / "suites" / "benchmarks").glob("timing*.py"):  # the timing library's parts
        assert f"accel_harness/suites/benchmarks/{module.name}" in names, module.name
    assert any(n.startswith("accel_reports/render/templates/") for n in names)


def test_development_benchmarks_generators_and_tests_stay_in_the_repository(wheel_names):
    benchmarks = sorted(Path(n).name for n in wheel_names if n.startswith("accel_harness/suites/benchmarks/"))
    scripts = sorted(p.name for p in (REPO / "suites" / "benchmarks").glob("*.py")
                     if not p.name.startswith(("test_bench_", "timing")) and p.stem not in {"__init__", "conftest", "host_reference", "census"})
    assert scripts, "the repository has development benchmark scripts to leave out"
    assert not set(scripts) & set(benchmarks), set(scripts) & set(benchmarks)
    assert not [n for n in wheel_names if "synthetic" in n or n.startswith("tests/")]
