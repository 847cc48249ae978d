"""accel.data_loader: real gloo runs at world sizes 2 and 4 (sharding, dispatch, shuffling), resuming
with skip_first_batches, dispatcher steps, base_dataloader, and stateful loading on one and two ranks."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader

from accel import data_loader as A
from accel.state import GradientState, PartialState
from dist_utils import run_distributed
from _data_loader_helpers import MapData, StreamData, _idx, ref  # noqa: F401 (ref: a fixture)


# ----------------------------------------------------------------------------- (b) real process groups
def _iterate(dl) -> dict:
    gs = GradientState()
    batches, flags = [], []
    for batch in dl:
        batches.append(_idx(batch))
        flags.append((dl.end_of_dataloader, gs.end_of_dataloader))
        assert gs.active_dataloader is dl
    return {"batches": batches, "flags": flags, "remainder": dl.remainder, "after": gs.in_dataloader}


def _rank_loaders(cases: list[dict]) -> list[dict]:
    """Each rank prepares every case, runs it fully, then resumes it with skip_first_batches."""
    out = []
    for case in cases:
        data = MapData(case["n"]) if case["kind"] == "map" else StreamData(case["n"], case.get("sized", True))
        loader = DataLoader(data, batch_size=case["bs"], drop_last=case.get("drop_last", False))
        dl = A.prepare_data_loader(
            loader, device=PartialState().device, put_on_device=True, split_batches=case.get("split", False),
            dispatch_batches=case["dispatch"], even_batches=case.get("even", True),
        )
        assert isinstance(dl, A.DataLoaderDispatcher if case["dispatch"] else A.DataLoaderShard)
        run = _iterate(dl)
        run["len"] = len(dl) if case.get("sized", True) else None
        run["total_batch_size"] = dl.total_batch_size
        k = case.get("skip", 1)
        run["resumed"] = _iterate(A.skip_first_batches(dl, k))
        run["skip"] = k
        out.append(run)
    return out


def _union(runs: list[dict], truncate_to: int | None) -> list[int]:
    """What gather_for_metrics sees: per step, rank 0's batch, then rank 1's, ...; the last step cut."""
    steps = max(len(r["batches"]) for r in runs)
    flat = []
    for step in range(steps):
        gathered = [i for r in runs if step < len(r["batches"]) for i in r["batches"][step]]
        if step == steps - 1 and truncate_to:
            gathered = gathered[:truncate_to]
        flat.extend(gathered)
    return flat


def _check_cases(cases: list[dict], world: int, ref) -> None:
    results = run_distributed(_rank_loaders, world, cases)
    for c, case in enumerate(cases):
        runs = [results[r][c] for r in range(world)]
        n, bs = case["n"], case["bs"]
        total = bs if case.get("split") else bs * world
        assert {r["total_batch_size"] for r in runs} == {total}, case
        for r in runs:
            assert r["after"] is False, case
            if r["batches"]:
                assert r["flags"] == [(False, False)] * (len(r["batches"]) - 1) + [(True, True)], case
            assert r["resumed"]["batches"] == r["batches"][r["skip"]:], case
            if r["resumed"]["batches"]:
                assert r["resumed"]["flags"][-1] == (True, True), case
            if r["len"] is not None:
                assert r["len"] == len(r["batches"]), case
        if case.get("drop_last"):
            assert _union(runs, None) == list(range(n // total * total)), case
        elif not case.get("even", True):
            assert _union(runs, None) == list(range(n)), case
        else:
            remainders = {r["remainder"] for r in runs}
            assert len(remainders) == 1 and next(iter(remainders)) > 0 if n % total else True, case
            assert _union(runs, runs[0]["remainder"]) == list(range(n)), case
            assert len({len(r["batches"]) for r in runs}) == 1, case  # every rank ran the same number of steps
            assert len({len(b) for r in runs for b in r["batches"]}) == 1 or case.get("dispatch"), case
        if not case["dispatch"] and ref is not None:
            # the reference gives each rank the same indices (shard mode can be run with explicit ranks)
            for rank in range(world):
                data = MapData(n) if case["kind"] == "map" else StreamData(n)
                theirs = ref.prepare_data_loader(
                    DataLoader(data, batch_size=bs, drop_last=case.get("drop_last", False)), num_processes=world,
                    process_index=rank, split_batches=case.get("split", False), even_batches=case.get("even", True),
                )
                assert runs[rank]["batches"] == [_idx(b) for b in theirs], (case, rank)


def test_two_processes_shard_and_dispatch(ref):
    cases = [
        {"kind": "map", "n": 13, "bs": 3, "dispatch": False},
        {"kind": "map", "n": 13, "bs": 4, "dispatch": False, "split": True, "skip": 2},
        {"kind": "map", "n": 13, "bs": 3, "dispatch": False, "even": False},
        {"kind": "map", "n": 13, "bs": 3, "dispatch": False, "drop_last": True},
        {"kind": "map", "n": 4, "bs": 3, "dispatch": False, "skip": 0},
        {"kind": "map", "n": 13, "bs": 3, "dispatch": True},
        {"kind": "map", "n": 13, "bs": 4, "dispatch": True, "split": True, "skip": 3},
        {"kind": "iter", "n": 13, "bs": 3, "dispatch": False},
        {"kind": "iter", "n": 11, "bs": 4, "dispatch": False, "split": True},
        {"kind": "iter", "n": 13, "bs": 3, "dispatch": True},
        {"kind": "iter", "n": 11, "bs": 4, "dispatch": True, "split": True, "sized": False},
        {"kind": "iter", "n": 13, "bs": 3, "dispatch": True, "drop_last": True},
        {"kind": "iter", "n": 12, "bs": 3, "dispatch": True, "skip": 2},
    ]
    _check_cases(cases, 2, ref)


def test_four_processes_shard_and_dispatch(ref):
    cases = [
        {"kind": "map", "n": 13, "bs": 2, "dispatch": False},
        {"kind": "map", "n": 13, "bs": 8, "dispatch": False, "split": True},
        {"kind": "map", "n": 13, "bs": 2, "dispatch": False, "even": False},
        {"kind": "map", "n": 13, "bs": 2, "dispatch": True, "skip": 1},
        {"kind": "iter", "n": 13, "bs": 2, "dispatch": False},
        {"kind": "iter", "n": 13, "bs": 2, "dispatch": True},
        {"kind": "iter", "n": 13, "bs": 4, "dispatch": True, "split": True},
        {"kind": "iter", "n": 19, "bs": 3, "dispatch": True, "drop_last": True},
    ]
    _check_cases(cases, 4, ref)


def _rank_shuffling() -> dict:
    rank = PartialState().process_index
    out = {}
    # seedable sampler: same permutation everywhere without communication, new one per epoch
    dl = A.prepare_data_loader(DataLoader(MapData(12), batch_size=3, shuffle=True), use_seedable_sampler=True, data_seed=7)
    out["seedable"] = [[_idx(b) for b in dl] for _ in range(2)]
    sampler = A.SeedableRandomSampler(range(12), data_seed=7)
    sampler.set_epoch(1)
    out["sampler_epoch1"] = list(sampler)
    out["epoch2"] = [_idx(b) for b in dl]  # iteration 2 (third epoch)
    dl.set_epoch(2)  # rewind as load_state does, then resume that epoch from batch 1
    out["resumed"] = [_idx(b) for b in A.skip_first_batches(dl, 1)]
    # plain shuffle: each rank seeds differently; the sampler generator is copied from rank 0 each epoch
    torch.manual_seed(100 + rank)
    dl = A.prepare_data_loader(DataLoader(MapData(12), batch_size=3, shuffle=True), rng_types=["generator"])
    out["synced"] = [[_idx(b) for b in dl] for _ in range(2)]
    torch.manual_seed(100 + rank)
    dl = A.prepare_data_loader(DataLoader(MapData(12), batch_size=3, shuffle=True))
    out["unsynced"] = [_idx(b) for b in dl]
    # rng_types=["torch"]: the global torch RNG is copied from rank 0 when an iteration starts
    torch.manual_seed(rank)
    dl = A.prepare_data_loader(DataLoader(MapData(4), batch_size=2), rng_types=["torch"])
    iter_draws = []
    for _ in dl:
        iter_draws.append(torch.rand(1).item())
    out["torch_draws"] = iter_draws
    return out


def test_shuffling_is_consistent_across_processes(ref):
    results = run_distributed(_rank_shuffling, 2)
    for epoch in range(2):
        union = _union([{"batches": r["seedable"][epoch]} for r in results], None)
        assert sorted(union) == list(range(12)), f"epoch {epoch}: ranks shuffled differently"
        expected = ref.SeedableRandomSampler(range(12), data_seed=7)
        expected.set_epoch(epoch)
        assert union == list(expected)  # the same permutation as Accelerate's sampler
    assert results[0]["seedable"][0] != results[0]["seedable"][1]
    assert results[0]["sampler_epoch1"] == results[1]["sampler_epoch1"]
    for r in results:
        assert r["resumed"] == r["epoch2"][1:]
    for epoch in range(2):
        assert sorted(_union([{"batches": r["synced"][epoch]} for r in results], None)) == list(range(12))
    assert results[0]["synced"][0] != results[0]["synced"][1]
    # without synchronisation differently seeded ranks overlap: the check above can fail
    assert sorted(_union([{"batches": r["unsynced"]} for r in results], None)) != list(range(12))
    assert results[0]["torch_draws"] == results[1]["torch_draws"]


def test_dispatch_default_pickling_and_edge_cases():
    cpu = torch.device("cpu")
    # Accelerate's default: dispatch iterable datasets when batches are put on the device
    assert isinstance(A.prepare_data_loader(DataLoader(StreamData(7), batch_size=3), device=cpu, put_on_device=True), A.DataLoaderDispatcher)
    assert isinstance(A.prepare_data_loader(DataLoader(StreamData(7), batch_size=3)), A.DataLoaderShard)
    assert isinstance(A.prepare_data_loader(DataLoader(MapData(7), batch_size=3), device=cpu, put_on_device=True), A.DataLoaderShard)
    dl = A.prepare_data_loader(DataLoader(StreamData(7), batch_size=3), device=cpu, put_on_device=True)
    assert [_idx(b) for b in dl] == [[0, 1, 2], [3, 4, 5], [6]] and dl.remainder == 1 and dl.end_of_dataloader
    assert [_idx(b) for b in A.skip_first_batches(dl, 2)] == [[6]]
    # an empty dispatched loader ends cleanly (Accelerate raises "Batch does not contain any data")
    empty = A.prepare_data_loader(DataLoader(MapData(0), batch_size=3), device=cpu, put_on_device=True, dispatch_batches=True)
    assert list(empty) == [] and not GradientState().in_dataloader
    # pickling keeps the loader attached to the shared GradientState
    import pickle

    shard = A.prepare_data_loader(DataLoader(MapData(10), batch_size=3), num_processes=2, process_index=1)
    clone = pickle.loads(pickle.dumps(shard))
    assert [_idx(b) for b in clone] == [_idx(b) for b in shard] == [[3, 4, 5], [9, 0, 1]]
    assert clone.gradient_state.__dict__ is GradientState().__dict__
    # the caller's rng_types list is not edited (Accelerate removes "generator" from it in place)
    rng_types = ["generator"]
    A.prepare_data_loader(DataLoader(MapData(4), batch_size=2), rng_types=rng_types)
    assert rng_types == ["generator"]

    class Mesh:
        mesh_dim_names = ("dp", "tp")

    with pytest.raises(ValueError, match="tensor parallelism"):
        A.DataLoaderDispatcher(MapData(4), batch_size=2, torch_device_mesh=Mesh())
    with pytest.raises(ValueError, match="round multiple"):
        A.BatchSamplerShard(BatchSampler(range(20), batch_size=3, drop_last=False), 2, 0, split_batches=True)
    with pytest.raises(ValueError, match="round multiple"):
        A.prepare_data_loader(DataLoader(MapData(6), batch_size=3), num_processes=2, process_index=0, split_batches=True)
    with pytest.raises(ValueError, match="requires `put_on_device=True`"):
        A.prepare_data_loader(DataLoader(MapData(4), batch_size=2), dispatch_batches=True)


def test_skip_loader_advances_the_original_epoch_for_the_usual_resume_loop():
    """Resume mid-epoch through skip_first_batches, then keep iterating the original loader:
    the next epoch must reshuffle, not replay the resumed epoch's order."""
    from accel import Accelerator
    from accel.state import AcceleratorState, GradientState
    from accel.utils import DataLoaderConfiguration

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    acc = Accelerator(dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    reference_loader = acc.prepare(DataLoader(list(range(12)), batch_size=2, shuffle=True))
    reference = [[b.tolist() for b in reference_loader] for _ in range(3)]
    resumed = acc.prepare(DataLoader(list(range(12)), batch_size=2, shuffle=True))
    resumed.set_epoch(1)  # as load_state restores it
    rest_of_epoch_1 = [b.tolist() for b in acc.skip_first_batches(resumed, 2)]
    epoch_2 = [b.tolist() for b in resumed]
    assert rest_of_epoch_1 == reference[1][2:]
    assert epoch_2 == reference[2] and reference[2] != reference[1]
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def test_a_resumed_copy_keeps_the_settings_and_counts_epochs_in_the_first_loader():
    """skip_first_batches of a skip_first_batches copy: the wrapper's own settings (device, drop_last,
    non_blocking, epoch) carry over, and a finished epoch is counted in the loader the user prepared."""
    cpu = torch.device("cpu")
    shard = A.prepare_data_loader(DataLoader(MapData(10), batch_size=3, drop_last=True), device=cpu,
                                  put_on_device=True, non_blocking=True)
    shard.set_epoch(4)
    once = A.skip_first_batches(shard, 1)
    twice = A.skip_first_batches(once, 1)
    assert isinstance(twice, A.DataLoaderShard)
    assert twice.wrapper_kwargs() == shard.wrapper_kwargs()
    assert twice.wrapper_kwargs()["_drop_last"] is True and twice.wrapper_kwargs()["_non_blocking"] is True
    assert once.epoch_owner is shard and twice.epoch_owner is shard
    assert [_idx(b) for b in twice] == [[6, 7, 8]]
    assert shard.iteration == 5 and once.iteration == 4
    dispatcher = A.prepare_data_loader(DataLoader(StreamData(7), batch_size=3), device=cpu, put_on_device=True)
    copy = A.skip_first_batches(dispatcher, 1)
    assert isinstance(copy, A.DataLoaderDispatcher) and copy.wrapper_kwargs() == dispatcher.wrapper_kwargs()
    assert [_idx(b) for b in copy] == [[3, 4, 5], [6]] and dispatcher.iteration == 1


def _rank_dispatch_steps() -> dict:
    """A dispatcher that slices (one batch per process and step) and one under tensor parallelism alone."""

    class TpOnly:
        mesh_dim_names = ("tp",)

    out = {}
    for name, mesh in (("sliced", None), ("replicated", TpOnly())):
        dl = A.DataLoaderDispatcher(MapData(8), batch_size=2, torch_device_mesh=mesh)
        out[name] = {"per_step": dl.batches_per_step, "len": len(dl), "total": dl.total_batch_size,
                     "full": [_idx(b) for b in dl], "resumed": [_idx(b) for b in A.skip_first_batches(dl, 1)]}
    return out


def test_dispatcher_steps_read_one_batch_per_process_unless_every_rank_gets_the_whole_batch():
    """batches_per_step decides the length, the global batch size and how far skip_first_batches skips."""
    for rank, result in enumerate(run_distributed(_rank_dispatch_steps, 2)):
        sliced, replicated = result["sliced"], result["replicated"]
        assert (sliced["per_step"], sliced["len"], sliced["total"]) == (2, 2, 4)
        assert sliced["full"] == [[2 * rank, 2 * rank + 1], [4 + 2 * rank, 5 + 2 * rank]]
        assert sliced["resumed"] == sliced["full"][1:]
        assert (replicated["per_step"], replicated["len"], replicated["total"]) == (1, 4, 2)
        assert replicated["full"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
        assert replicated["resumed"] == replicated["full"][1:]


# ------------------------------------------------------------------------------------------- base_dataloader, stateful loading
def test_base_dataloader_is_the_loader_on_instances_only():
    PartialState()
    for loader in (A.DataLoaderShard(MapData(4), batch_size=2), A.DataLoaderDispatcher(MapData(4), batch_size=2),
                   A.SkipDataLoader(MapData(4), batch_size=2, skip_batches=1)):
        assert loader.base_dataloader is loader
        assert not hasattr(loader, "state_dict")  # only stateful loaders can checkpoint their position
    with pytest.raises(AttributeError):
        _ = A.DataLoaderShard.base_dataloader


def _stateful():
    return pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is not installed").StatefulDataLoader


@pytest.mark.parametrize("kind", ["shard", "dispatcher", "skip"])
def test_stateful_loaders_resume_after_the_batches_handed_out(kind):
    StatefulDataLoader = _stateful()
    PartialState()
    make = {"shard": A.DataLoaderShard, "dispatcher": A.DataLoaderDispatcher, "skip": A.SkipDataLoader}[kind]
    loader = make(list(range(20)), batch_size=2, use_stateful_dataloader=True)
    assert isinstance(loader, StatefulDataLoader) and isinstance(loader, make) and loader.use_stateful_dataloader
    seen = []
    for index, batch in enumerate(loader):
        seen.append(batch.tolist())
        if index == 3:
            state = loader.state_dict()
            break
    # the loader read one batch ahead; the state still resumes right after the 4th batch
    assert state["_num_yielded"] == 4
    again = make(list(range(20)), batch_size=2, use_stateful_dataloader=True)
    again.load_state_dict(state)
    rest = [b.tolist() for b in again]
    assert seen + rest == [[2 * i, 2 * i + 1] for i in range(10)]
    # a full pass marks the iterator finished
    list(loader)
    assert loader.state_dict()["_iterator_finished"] is True


def test_stateful_loader_pickles_and_survives_skip_first_batches():
    import pickle

    _stateful()
    PartialState()
    loader = A.DataLoaderShard(list(range(8)), batch_size=2, use_stateful_dataloader=True)
    clone = pickle.loads(pickle.dumps(loader))
    assert type(clone) is type(loader) and [b.tolist() for b in clone] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    skipped = A.skip_first_batches(loader, 2)
    assert skipped.use_stateful_dataloader and [b.tolist() for b in skipped] == [[4, 5], [6, 7]]
    assert hasattr(skipped, "state_dict")


def test_stateful_prepare_needs_torchdata(monkeypatch):
    from accel.utils import imports

    monkeypatch.setattr(imports, "is_torchdata_stateful_dataloader_available", lambda: False)
    with pytest.raises(ImportError, match="torchdata"):
        A.prepare_data_loader(DataLoader(MapData(4), batch_size=2), use_stateful_dataloader=True)


def _rank_stateful(dispatch: bool):
    import torch.distributed as dist

    loader = A.prepare_data_loader(DataLoader(list(range(16)), batch_size=2), put_on_device=dispatch,
                                   dispatch_batches=dispatch, use_stateful_dataloader=True)
    first = []
    for index, batch in enumerate(loader):
        first.append(batch.tolist())
        if index == 1:
            state = loader.state_dict()
            break
    loader.end()
    # the main process's state goes to everyone, as a checkpoint written by rank 0 would
    states = [state]
    dist.broadcast_object_list(states, src=0)
    again = A.prepare_data_loader(DataLoader(list(range(16)), batch_size=2), put_on_device=dispatch,
                                  dispatch_batches=dispatch, use_stateful_dataloader=True)
    if not dispatch:
        again.load_state_dict(state)  # each shard restores its own position
    else:
        again.load_state_dict(states[0])
    return first, [b.tolist() for b in again]


@pytest.mark.parametrize("dispatch", [False, True])
def test_stateful_loaders_resume_on_two_ranks(dispatch):
    _stateful()
    results = run_distributed(_rank_stateful, 2, dispatch)
    for rank, (first, rest) in enumerate(results):
        # 8 batches of 2 over 2 ranks: rank r gets batches r, r+2, ... (sharded and dispatched alike)
        expected = [[4 * i + 2 * rank, 4 * i + 2 * rank + 1] for i in range(4)]
        assert first + rest == expected, (rank, first, rest)
