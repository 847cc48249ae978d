"""Shared fixtures of the project's own tests."""

import os
import signal
import sys

import pytest

#: signals whose handlers a test may change in this process (torch's elastic agent sets the first four)
HANDLED_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
                        if hasattr(signal, name))


def pytest_configure(config):
    """Take Ctrl-C as a terminal run does. A run started in the background of a non-interactive shell
    (``nohup pytest ... &``) ignores SIGINT, and every process the tests start inherits that: the tests
    that interrupt a command would wait for an interrupt it never takes."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``slow`` run only with ``RUN_SLOW=1`` (as ``accel.test_utils.slow``; the nightly
    workflow sets it): each is an end-to-end case whose behaviour a faster test also covers, named
    beside its mark."""
    from accel.test_utils.testing import parse_flag_from_env

    if parse_flag_from_env("RUN_SLOW"):
        return
    skip = pytest.mark.skip(reason="[opt-in] test is slow: set RUN_SLOW=1 to run it (the nightly workflow does)")
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(skip)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    """What the session collected is frozen out of garbage collection (:mod:`accel_harness.session_freeze`):
    many tests collect garbage (``free_memory``, ``release_memory``, ``find_executable_batch_size``), and
    each full collection would traverse every imported module again."""
    from accel_harness.session_freeze import freeze_collected_session

    freeze_collected_session()


@pytest.fixture(autouse=True)
def fresh_state():
    """Every test starts and ends without accel's process-wide state (it is a shared singleton), and
    leaves the environment and the signal handlers as it found them: a variable one test sets
    (``MASTER_PORT`` from a process group, a cloud SDK's credentials) would otherwise reach every later
    test of the same worker and the subprocesses they start, and a handler torch's elastic agent
    installs (``notebook_launcher``) would turn a later test's Ctrl-C into its exception. A test that
    leaves a default process group behind fails here: every rank a later test forks would inherit it."""
    from accel.state import AcceleratorState, GradientState

    saved = dict(os.environ)
    handlers = {sig: signal.getsignal(sig) for sig in HANDLED_SIGNALS}
    group_before = default_group_initialized()
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    restore_environment(saved)
    restore_signal_handlers(handlers)
    if default_group_initialized() and not group_before:
        import torch.distributed as dist

        dist.destroy_process_group()
        pytest.fail("the test left torch.distributed's default process group initialized (destroyed now): the ranks "
                    "later tests of this worker fork would inherit it ('initialize the default process group twice')")


def default_group_initialized() -> bool:
    """Whether this process has a default torch.distributed process group (without importing torch)."""
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()


def restore_environment(saved: dict[str, str]) -> None:
    """Put ``os.environ`` back to ``saved`` (pytest's own ``PYTEST_CURRENT_TEST`` left to pytest)."""
    for name in set(os.environ) - set(saved) - {"PYTEST_CURRENT_TEST"}:
        del os.environ[name]
    for name, value in saved.items():
        if name != "PYTEST_CURRENT_TEST" and os.environ.get(name) != value:
            os.environ[name] = value


def restore_signal_handlers(saved: dict) -> None:
    """Put back the handlers in ``saved`` (signal -> what ``signal.getsignal`` gave; None: not set from Python)."""
    for sig, handler in saved.items():
        if handler is not None and signal.getsignal(sig) is not handler:
            signal.signal(sig, handler)


@pytest.fixture
def clean_environment(monkeypatch, tmp_path):
    """No user override leaks in, the default config path points into tmp, and probes start fresh."""
    from accel.backends import reset_registry

    for name in ("ACCEL_DEVICE", "ACCEL_CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    reset_registry()
    yield
    reset_registry()


@pytest.fixture
def timer_clock(monkeypatch):
    """A fake clock (``_fake_clock.FakeClock``) in place of the ``time`` module that accel's host timers read."""
    from accel.backends import base
    from _fake_clock import FakeClock

    fake = FakeClock()
    monkeypatch.setattr(base, "time", fake)
    return fake


@pytest.fixture
def fake_lomo(monkeypatch):
    """A stand-in ``lomo_optim`` (the real one needs transformers): its fused backward records its learning rates."""
    import types

    import torch

    calls = []

    class Lomo(torch.optim.SGD):
        def fused_backward(self, loss, lr):
            calls.append(lr)
            loss.backward()

    module = types.ModuleType("lomo_optim")
    module.Lomo, module.AdaLomo = Lomo, type("AdaLomo", (Lomo,), {})
    monkeypatch.setitem(sys.modules, "lomo_optim", module)
    import accel.utils.imports as imports

    monkeypatch.setattr(imports, "is_lomo_available", lambda: True)
    return module, calls
