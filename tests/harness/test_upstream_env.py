"""The suite environment's path: accel's packages reach an upstream suite, the checkout's other folders do not."""

from __future__ import annotations

import importlib.metadata

import pytest

from accel_harness import upstream_env


def test_an_installed_accel_adds_no_checkout_to_the_path():
    """An editable install imports through its own finder: appending the checkout would put its `tests` package
    (a regular one) ahead of an upstream suite's namespace `tests` folder."""
    if not any(d.locate_file("") for d in importlib.metadata.distributions(name="accel", path=upstream_env._active_site_dirs())):
        pytest.skip("accel runs from a checkout on PYTHONPATH here, not installed")
    assert upstream_env._running_accel_root() is None


def test_a_checkout_is_reached_through_links_to_its_packages_only(tmp_path):
    checkout = tmp_path / "checkout"
    for name in ("accel", "accel_harness", "accel_reports", "tests", "ci"):
        (checkout / name).mkdir(parents=True)
    venv_root = tmp_path / "venv"
    venv_root.mkdir()
    folder = upstream_env._package_links(venv_root, str(checkout))
    assert sorted(p.name for p in folder.iterdir()) == ["accel", "accel_harness", "accel_reports"]
    assert (folder / "accel").resolve() == (checkout / "accel").resolve()


def test_a_changed_environment_layout_changes_the_key(monkeypatch):
    before = upstream_env.environment_key("accelerate==1.15.0", ["accelerate==1.15.0"], [])
    monkeypatch.setattr(upstream_env, "ENVIRONMENT_LAYOUT", "another")
    assert upstream_env.environment_key("accelerate==1.15.0", ["accelerate==1.15.0"], []) != before
