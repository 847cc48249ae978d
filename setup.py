"""Package layout that pyproject.toml cannot say: the conformance suites ship inside the wheel.

The repository keeps them in ``suites/`` (run as ``pytest suites -m cpu``); the wheel installs them
as ``accel_harness/suites`` so ``accel qualify`` and ``accel bench`` work without a checkout. The
development benchmark scripts beside the benchmark suites (``python suites/benchmarks/NAME.py``) stay
in the repository. Every other setting lives in pyproject.toml.
"""

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

SHIPPED_SUITES = {
    "accel_harness.suites": "suites",
    "accel_harness.suites.benchmarks": "suites/benchmarks",
}
#: what ``accel bench`` runs from the benchmarks folder: its suites and the modules they import
BENCHMARK_RUNTIME = {"__init__", "conftest", "timing", "timing_info", "timing_measure", "timing_pinning", "timing_ranks",
                     "timing_record", "timing_settings", "host_reference", "census"}


def is_shipped_benchmark_module(module: str) -> bool:
    """Whether a module of ``suites/benchmarks`` belongs in the wheel (a benchmark suite or its runtime)."""
    return module.startswith("test_bench_") or module in BENCHMARK_RUNTIME


class BuildWithoutDevelopmentBenchmarks(build_py):
    """``build_py`` that leaves the development benchmark scripts out of the benchmarks package."""

    def find_package_modules(self, package, package_dir):
        """The package's modules, less the development scripts when it is the benchmarks package."""
        modules = super().find_package_modules(package, package_dir)
        if package == "accel_harness.suites.benchmarks":
            modules = [entry for entry in modules if is_shipped_benchmark_module(entry[1])]
        return modules


setup(
    packages=find_packages(include=["accel", "accel.*", "accel_harness", "accel_harness.*",
                                    "accel_reports", "accel_reports.*"]) + list(SHIPPED_SUITES),
    package_dir=SHIPPED_SUITES,
    cmdclass={"build_py": BuildWithoutDevelopmentBenchmarks},
)
