"""Package layout that pyproject.toml cannot say: the conformance suites ship inside the wheel.

The repository keeps them in ``suites/`` (run as ``pytest suites -m cpu``); the wheel installs them
as ``accel_harness/suites`` so ``accel qualify`` and ``accel bench`` work without a checkout. Every
other setting lives in pyproject.toml.
"""

from setuptools import find_packages, setup

SHIPPED_SUITES = {
    "accel_harness.suites": "suites",
    "accel_harness.suites.benchmarks": "suites/benchmarks",
}

setup(
    packages=find_packages(include=["accel", "accel.*", "accel_harness", "accel_harness.*",
                                    "accel_reports", "accel_reports.*"]) + list(SHIPPED_SUITES),
    package_dir=SHIPPED_SUITES,
)
