"""The modules a rank pool's fork server imports before it forks ranks (accel_harness.pool_preload)."""

import pickle
import sys

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
