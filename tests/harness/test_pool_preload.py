"""The modules a rank pool's fork server imports before it forks ranks (accel_harness.pool_preload)."""

import pickle
import sys

from accel_harness.pool_preload import ALWAYS, WHEN_IMPORTED, fork_server_modules


def test_the_server_imports_the_base_modules_and_the_libraries_this_process_has_imported(monkeypatch):
    for name in WHEN_IMPORTED:
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert fork_server_modules() == list(ALWAYS)
    imported = WHEN_IMPORTED[-1]
    monkeypatch.setitem(sys.modules, imported, sys)  # any module object: only the name is looked up
    assert fork_server_modules() == [*ALWAYS, imported]


def test_the_base_modules_name_no_device_package():
    """The server must stay fit to fork a spawn-only device's ranks: nothing it imports may load a device."""
    devices = ("accel_emu", "torch_npu", "habana_frameworks", "intel_extension_for_pytorch", "torch_xla", "torch_mlu")
    assert not [name for name in (*ALWAYS, *WHEN_IMPORTED) if name.split(".")[0] in devices]


def _rank_reports_preloaded(rank, names):
    missing = [name for name in names if name not in sys.modules]
    assert not missing, f"the rank imported these itself: {missing}"


def test_a_rank_forked_from_the_server_starts_with_what_every_rank_imports():
    """torch._dynamo (what every torch optimizer imports) is in a rank before its first test without the rank
    having imported it: a spawned rank, which imports only what it starts with, does not have it."""
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
