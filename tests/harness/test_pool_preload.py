"""The modules a rank pool's fork server imports before it forks ranks (accel_harness.pool_preload)."""

import pickle
import sys

import pytest

from accel_harness.pool_preload import ALWAYS, FREEZE, WHEN_IMPORTED, fork_server_modules


def test_the_server_imports_the_base_modules_and_the_libraries_this_process_has_imported(monkeypatch):
    for name in WHEN_IMPORTED:
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert fork_server_modules() == [*ALWAYS, FREEZE]
    imported = WHEN_IMPORTED[-1]
    monkeypatch.setitem(sys.modules, imported, sys)  # any module object: only the name is looked up
    assert fork_server_modules() == [*ALWAYS, imported, FREEZE]
    assert fork_server_modules("a.b") == [*ALWAYS, imported, "a.b", FREEZE], "the freeze comes after every import"


def test_the_base_modules_name_no_device_package():
    """The server must stay fit to fork a spawn-only device's ranks: nothing it imports may load a device."""
    devices = ("accel_emu", "torch_npu", "habana_frameworks", "intel_extension_for_pytorch", "torch_xla", "torch_mlu")
    assert not [name for name in (*ALWAYS, *WHEN_IMPORTED) if name.split(".")[0] in devices]


def _rank_reports_preloaded(rank, names):
    import gc

    missing = [name for name in names if name not in sys.modules]
    assert not missing, f"the rank imported these itself: {missing}"
    # the server's imports (torch alone makes more than a hundred thousand objects) are frozen
    assert gc.get_freeze_count() > 100_000, f"only {gc.get_freeze_count()} objects are frozen in the rank"


def test_a_rank_forked_from_the_server_starts_with_what_every_rank_imports():
    """torch._dynamo (what every torch optimizer imports) is in a rank before its first test without the rank
    having imported it: a spawned rank, which imports only what it starts with, does not have it. What the
    server imported is frozen out of the rank's garbage collections."""
    from accel_harness.distributed import RankPool, Task

    task = Task(__name__, __file__, _rank_reports_preloaded.__qualname__,
                pickle.dumps({"rank": None, "names": ["torch._dynamo", "pytest", "accel.accelerator"]}))
    pool = RankPool("cpu", 1, "forkserver", timeout=120)
    pool.start()
    try:
        result = pool.run(task)
    finally:
        pool.close()
    assert result.status == "passed", result.message


# ---------------------------------------------------------------- starting the server as the session's tests begin
class _Backend:
    def __init__(self, start_method, fork_server_ranks=True, available=True, initialized=False):
        self.start_method, self.fork_server_ranks, self.available, self.is_host = \
            start_method, fork_server_ranks, available, start_method == "fork"
        self.initialized = initialized

    def is_available(self):
        return self.available

    def runtime_initialized(self):
        if isinstance(self.initialized, Exception):
            raise self.initialized
        return self.initialized


class _Context:
    def __init__(self, **backends):
        self.backends, self.selected = backends, list(backends)

    def backend(self, name):
        return self.backends[name]


class _Item:
    def __init__(self, backend, world, marked=True, imports=()):
        from accel_harness.params import BACKEND_PARAM, WORLD_SIZE_PARAM

        self.callspec = type("CallSpec", (), {"params": {BACKEND_PARAM: backend, WORLD_SIZE_PARAM: world}})()
        self.marked, self.imports = marked, imports

    def get_closest_marker(self, name):
        return object() if name == "world_size" and self.marked else None

    def iter_markers(self, name):
        return [pytest.mark.fork_server_imports(*self.imports).mark] if name == "fork_server_imports" and self.imports else []


def _prestart(monkeypatch, ctx, items, forks=None):
    """(what prestart_fork_server returned, how many servers it started); ``forks``: whether the server it
    started must be a fork of this process (True) or a fresh interpreter (False)."""
    import accel_harness.pool_preload as preload
    from accel_harness.rank_runs import prestart_fork_server

    started, forked = [], []
    monkeypatch.setattr(preload, "start_fork_server",
                        lambda *extra, fork_this_process=False: started.append(extra) or forked.append(fork_this_process))
    returned = prestart_fork_server(ctx, items)
    assert started in ([], [returned]), "the server imports what the call reports"
    if forks is not None:
        assert forked == [forks], f"the server was {'a fork' if forked[0] else 'a fresh interpreter'}"
    return returned, len(started)


def test_the_server_starts_early_only_for_a_multi_process_test_of_a_fork_server_backend(monkeypatch):
    spawn_only = _Backend("spawn")
    assert _prestart(monkeypatch, _Context(dev=spawn_only), [_Item("dev", 1), _Item("dev", 2)]) == ((), 1)
    assert _prestart(monkeypatch, _Context(dev=spawn_only), [_Item("dev", 1)]) == (None, 0), "single-process tests only"
    assert _prestart(monkeypatch, _Context(dev=spawn_only), [_Item("dev", 2, marked=False)]) == (None, 0)
    assert _prestart(monkeypatch, _Context(dev=_Backend("spawn", fork_server_ranks=False)), [_Item("dev", 2)]) == (None, 0)
    assert _prestart(monkeypatch, _Context(dev=_Backend("spawn", available=False)), [_Item("dev", 2)]) == (None, 0)
    assert _prestart(monkeypatch, _Context(cpu=_Backend("fork")), [_Item("cpu", 2)]) == (None, 0), "cpu forks its ranks"
    unselected = _Context(dev=spawn_only)
    unselected.selected = []
    assert _prestart(monkeypatch, unselected, [_Item("dev", 2)]) == (None, 0)


def test_the_server_is_a_fork_of_the_session_only_while_no_selected_device_runtime_started(monkeypatch):
    items = [_Item("dev", 2)]
    assert _prestart(monkeypatch, _Context(dev=_Backend("spawn")), items, forks=True) == ((), 1)
    assert _prestart(monkeypatch, _Context(dev=_Backend("spawn", initialized=True)), items, forks=False) == ((), 1)
    broken = _Backend("spawn", initialized=RuntimeError("driver gone"))
    assert _prestart(monkeypatch, _Context(dev=broken), items, forks=False) == ((), 1), "cannot tell: not a fork"
    # any selected backend counts, not only the one whose ranks start first
    both = _Context(dev=_Backend("spawn"), other=_Backend("spawn", initialized=True))
    assert _prestart(monkeypatch, both, items, forks=False) == ((), 1)


def test_a_started_server_has_imported_torch_before_it_forks(tmp_path):
    """start_fork_server returns at once; the first process forked from the server finds torch imported."""
    import subprocess
    import textwrap

    from _waits import SAFETY_NET_S

    code = textwrap.dedent("""
        import multiprocessing, sys

        def report(queue):
            queue.put("torch" in sys.modules)

        if __name__ == "__main__":
            from accel_harness.pool_preload import start_fork_server
            start_fork_server()
            assert "torch" not in sys.modules, "the caller must not import what the server imports"
            ctx = multiprocessing.get_context("forkserver")
            queue = ctx.Queue()
            proc = ctx.Process(target=report, args=(queue,))
            proc.start()
            print("preloaded", queue.get(timeout=300))
            proc.join()
    """)
    script = tmp_path / "server.py"
    script.write_text(code)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=SAFETY_NET_S)
    assert proc.returncode == 0, proc.stderr
    assert "preloaded True" in proc.stdout


def test_a_test_that_names_the_servers_imports_starts_it_with_them(monkeypatch):
    # the operator sweep forks its workers from the session's server: its databases are imported there once
    sweep = _Item("cpu", 1, marked=False, imports=("json", "email.message"))
    assert _prestart(monkeypatch, _Context(cpu=_Backend("fork")), [_Item("cpu", 1), sweep]) == (("json", "email.message"), 1)
    other = _Item("dev", 1, marked=False, imports=("json", "csv"))
    assert _prestart(monkeypatch, _Context(dev=_Backend("spawn")), [sweep, other, _Item("dev", 2)]) == \
        (("json", "email.message", "csv"), 1), "each module once, in the order the tests name them"


def test_a_sweep_has_its_server_import_the_databases_it_reads():
    from accel_harness.ops.plan import QUICK, Selection
    from accel_harness.ops.runner import sweep_fork_server_modules

    quick = sweep_fork_server_modules(QUICK)
    assert "torch.testing._internal.common_methods_invocations" in quick and "accel.backends" in quick
    modules = sweep_fork_server_modules(Selection(kinds=("module",), extra_opinfos=("my_vendor.opinfos:op_db",)))
    assert "torch.testing._internal.common_modules" in modules and "my_vendor.opinfos" in modules
    assert "torch.testing._internal.common_methods_invocations" not in modules
