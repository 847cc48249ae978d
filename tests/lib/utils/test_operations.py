"""accel.utils.operations: structure helpers on one process, collectives on real gloo ranks.

Distributed checks are grouped into one rank function per world size (each run_distributed costs
a fork and a rendezvous). Rank inputs are pure functions of the rank, so every rank can compute
the single-process answer (e.g. ``torch.cat`` of everyone's inputs) and compare against it.
"""

from __future__ import annotations

import inspect
import os
import pickle
from collections import OrderedDict, defaultdict, namedtuple

import pytest
import torch

import accel.utils
from accel.state import AcceleratorState, GradientState, PartialState
from accel.utils import operations as ops
from accel.utils.operations import (
    DistributedOperationException,
    TensorInformation,
    broadcast,
    broadcast_object_list,
    chained_operation,
    concatenate,
    convert_outputs_to_fp32,
    convert_to_fp32,
    copy_tensor_to_devices,
    find_batch_size,
    find_device,
    gather,
    gather_object,
    get_data_structure,
    honor_type,
    ignorant_find_batch_size,
    initialize_tensors,
    is_torch_tensor,
    listify,
    pad_across_processes,
    recursively_apply,
    reduce,
    send_to_device,
    slice_tensors,
    verify_operation,
)
from dist_utils import run_distributed

Pair = namedtuple("Pair", "first second")


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    for var in ("ACCEL_DEBUG_MODE", "ACCELERATE_DEBUG_MODE", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


# ------------------------------------------------------------------------------ API surface
OPERATION_NAMES = [
    "send_to_device", "recursively_apply", "is_torch_tensor", "honor_type", "gather", "gather_object",
    "broadcast", "broadcast_object_list", "reduce", "pad_across_processes", "concatenate",
    "copy_tensor_to_devices", "find_batch_size", "ignorant_find_batch_size", "listify", "get_data_structure",
    "initialize_tensors", "convert_outputs_to_fp32", "convert_to_fp32", "find_device", "slice_tensors",
    "is_namedtuple", "is_tensor_information", "get_shape", "verify_operation", "chained_operation",
]


def test_exports_resolve_lazily_to_operations():
    for name in OPERATION_NAMES + ["DistributedOperationException", "TensorInformation", "ConvertOutputsToFp32"]:
        assert getattr(accel.utils, name) is getattr(ops, name), name


def test_signatures_match_accelerate():
    reference = pytest.importorskip("accelerate.utils.operations")

    def params(fn):  # a function default (test_type=is_torch_tensor) compares by name
        return [(p.name, p.kind, getattr(p.default, "__name__", p.default)) for p in inspect.signature(fn).parameters.values()]

    for name in OPERATION_NAMES:
        assert params(getattr(ops, name)) == params(getattr(reference, name)), name


# ------------------------------------------------------------------------------ structure helpers
def test_recursively_apply_keeps_structure_and_types():
    data = {"a": [torch.ones(2), (torch.zeros(1), "text")], "b": Pair(torch.ones(1), 3), "c": OrderedDict(x=torch.ones(1))}
    out = recursively_apply(lambda t, k, scale=1: t * k * scale, data, 2, scale=3)
    assert torch.equal(out["a"][0], torch.full((2,), 6.0)) and out["a"][1][1] == "text"
    assert type(out["a"][1]) is tuple and type(out["b"]) is Pair and out["b"].second == 3
    assert type(out["c"]) is OrderedDict and torch.equal(out["c"]["x"], torch.tensor([6.0]))
    with pytest.raises(TypeError, match=r"Unsupported types \(<class 'str'>\)"):
        recursively_apply(lambda t: t, ["x"], error_on_other_type=True)
    ints = recursively_apply(lambda v: v + 1, [1, (2, "s")], test_type=lambda v: isinstance(v, int))
    assert ints == [2, (3, "s")]
    dd = recursively_apply(lambda t: t + 1, defaultdict(list, k=torch.zeros(1)))
    assert isinstance(dd, defaultdict) and dd.default_factory is list and torch.equal(dd["k"], torch.ones(1))
    assert honor_type(Pair(1, 2), iter([3, 4])) == Pair(3, 4) and honor_type([1], iter((5,))) == [5]
    assert is_torch_tensor(torch.ones(1)) and not is_torch_tensor([1])


def test_send_to_device_moves_tensors_and_objects():
    class Movable:
        def __init__(self):
            self.where = None

        def to(self, device):  # no non_blocking parameter: the TypeError fallback must handle it
            self.where = device
            return self

    movable = Movable()
    data = {"x": torch.ones(2), "keep": torch.ones(1), "nested": [Pair(torch.zeros(1), "label"), movable], "n": None}
    out = send_to_device(data, "meta", skip_keys="keep")
    assert out["x"].is_meta and not out["keep"].is_meta and out["nested"][0].first.is_meta
    assert type(out["nested"][0]) is Pair and out["nested"][0].second == "label" and out["n"] is None
    assert movable.where == "meta"
    out = send_to_device({"a": torch.ones(1), "b": torch.ones(1)}, torch.device("meta"), non_blocking=True, skip_keys=["a", "b"])
    assert not out["a"].is_meta and not out["b"].is_meta


def test_send_to_device_plain_batches_keep_their_type_and_leaves():
    class Batch(list):
        pass

    weight = torch.nn.Parameter(torch.ones(1))
    out = send_to_device((torch.ones(2), [weight, "tag", 3], Batch([torch.zeros(1)])), "meta")
    assert type(out) is tuple and out[0].is_meta
    assert type(out[1]) is list and out[1][0].is_meta and out[1][1:] == ["tag", 3]
    assert type(out[2]) is Batch and out[2][0].is_meta
    # a non_blocking that Tensor.to refuses takes the generic path, whose fallback drops it
    moved = send_to_device([torch.ones(1)], "meta", non_blocking=None)
    assert type(moved) is list and moved[0].is_meta


def test_batch_size_listify_and_structure_round_trip():
    batch = {"ids": torch.zeros(5, 3, dtype=torch.int64), "mask": [torch.ones(5)]}
    assert find_batch_size(batch) == 5 and find_batch_size([Pair(torch.ones(4), 1)]) == 4
    with pytest.raises(ValueError, match="empty"):
        find_batch_size([])
    with pytest.raises(TypeError, match="int"):
        find_batch_size({"a": 1})
    assert ignorant_find_batch_size("text") is None and ignorant_find_batch_size([torch.ones(2)]) == 2
    assert listify({"a": torch.tensor([1.5, 2.0], dtype=torch.bfloat16), "b": torch.tensor(3)}) == {"a": [1.5, 2.0], "b": 3}
    info = get_data_structure(batch)
    assert info["ids"] == TensorInformation(torch.Size([5, 3]), torch.int64)
    rebuilt = initialize_tensors(info)
    assert rebuilt["ids"].shape == (5, 3) and rebuilt["ids"].dtype == torch.int64 and rebuilt["mask"][0].shape == (5,)
    assert find_device(["x", {"t": torch.ones(1)}]) == torch.device("cpu") and find_device(["x"]) is None
    sliced = slice_tensors(batch, slice(1, 3))
    assert sliced["ids"].shape == (2, 3) and sliced["mask"][0].shape == (2,)


def test_concatenate_nested_batches():
    batches = [{"a": torch.zeros(2, 3), "b": (torch.ones(1),)}, {"a": torch.ones(1, 3), "b": (torch.zeros(2),)}]
    out = concatenate(batches)
    assert out["a"].shape == (3, 3) and torch.equal(out["b"][0], torch.tensor([1.0, 0.0, 0.0]))
    assert torch.equal(concatenate([torch.ones(2, 1), torch.zeros(2, 1)], dim=1), torch.tensor([[1.0, 0.0], [1.0, 0.0]]))
    assert concatenate(["only"]) == "only"
    with pytest.raises(TypeError, match="str"):
        concatenate(["a", "b"])


def test_convert_to_fp32_and_forward_wrapper():
    data = {"h": torch.ones(2, dtype=torch.float16), "b": [torch.ones(1, dtype=torch.bfloat16)], "i": torch.ones(1, dtype=torch.int64)}
    out = convert_to_fp32(data)
    assert out["h"].dtype == out["b"][0].dtype == torch.float32 and out["i"].dtype == torch.int64

    def forward(x):
        return {"logits": x.half()}

    wrapped = convert_outputs_to_fp32(forward)
    assert wrapped(torch.ones(2))["logits"].dtype == torch.float32
    assert wrapped.__wrapped__.model_forward is forward
    with pytest.raises(pickle.PicklingError, match="unwrap"):
        pickle.dumps(wrapped.__wrapped__)


# ------------------------------------------------------------------------------ one process
def test_single_process_collectives_are_trivial():
    state = PartialState()
    assert not state.use_distributed
    x = {"a": torch.arange(3.0), "b": [torch.tensor(2)]}
    assert gather(x) is x
    assert gather_object([1, 2]) == [1, 2]
    assert broadcast(x) is x
    objects = [1, "two"]
    assert broadcast_object_list(objects) is objects and objects == [1, "two"]
    mean = reduce(x)
    assert torch.equal(mean["a"], x["a"]) and mean["a"] is not x["a"]
    assert torch.equal(reduce(x, "sum", scale=2.0)["a"], x["a"] * 2)
    assert torch.equal(reduce(x, "none")["b"][0], torch.tensor(2))
    padded = pad_across_processes(x, dim=0, pad_index=-1, pad_first=True)
    assert torch.equal(padded["a"], x["a"])
    copy = copy_tensor_to_devices(x["a"])
    assert torch.equal(copy, x["a"]) and copy is not x["a"]
    with pytest.raises(ValueError, match="every process passed None"):
        copy_tensor_to_devices(None)
    with pytest.raises(ValueError, match="reduction must be one of"):
        reduce(x, "average")
    with pytest.raises(ValueError, match="from_process"):
        broadcast(x, from_process=1)
    with pytest.raises(TypeError, match="Unsupported type"):
        pad_across_processes([torch.ones(1), "text"])


# ------------------------------------------------------------------------------ N processes
def _rank_input(rank: int) -> dict:
    """What rank ``rank`` contributes to gather: a nested structure of several dtypes."""
    return {
        "f32": torch.arange(6, dtype=torch.float32).view(2, 3) + 10 * rank,
        "pair": Pair(torch.tensor(float(rank)), [torch.full((2,), rank, dtype=torch.int64)]),
        "f16": torch.tensor([rank, 0.5], dtype=torch.float16),
        "bf16": torch.tensor([[rank * 1.5]], dtype=torch.bfloat16),
        "bool": torch.tensor([rank % 2 == 0, True]),
    }


def _assert_same(got, want, what):
    flat_got, flat_want = [], []
    recursively_apply(flat_got.append, got)
    recursively_apply(flat_want.append, want)
    assert len(flat_got) == len(flat_want), what
    for g, w in zip(flat_got, flat_want):
        assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w), f"{what}: {g} != {w}"


def _all_operations():
    state = PartialState()
    rank, world = state.process_index, state.num_processes
    assert state.use_distributed and world > 1
    checks = 0

    # gather: nested structure, 0-d -> 1-d, float32/float16/bfloat16/int64/bool, new tensors
    mine = _rank_input(rank)
    got = gather(mine)
    everyone = [_rank_input(r) for r in range(world)]
    want = concatenate([recursively_apply(lambda t: t.reshape(1) if t.ndim == 0 else t, e) for e in everyone])
    _assert_same(got, want, "gather")
    assert type(got["pair"]) is Pair and got["f32"].data_ptr() != mine["f32"].data_ptr()
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool):  # one tensor: the fast path
        single = (torch.arange(4).view(2, 2) + rank).to(dtype)
        _assert_same(gather(single), torch.cat([(torch.arange(4).view(2, 2) + r).to(dtype) for r in range(world)]), f"gather {dtype}")
    _assert_same(gather(torch.tensor(rank * 2)), torch.arange(world) * 2, "gather 0-d")
    transposed = (torch.arange(6.0).view(2, 3) + rank).t()  # non-contiguous input
    _assert_same(gather(transposed), torch.cat([(torch.arange(6.0).view(2, 3) + r).t() for r in range(world)]), "gather .t()")
    try:
        gather([torch.ones(1), "text"])
        raise AssertionError("gather accepted a string leaf")
    except TypeError as exc:
        assert "Unsupported types (<class 'str'>)" in str(exc)
    checks += 3

    # the fallbacks taken where a backend refuses the fused all-gather (patched where gather looks it up)
    from accel.utils.operations import _collectives as collectives

    real = collectives.FUSED_ALL_GATHER

    def refuse_all(output, tensor):
        raise RuntimeError("ProcessGroupGloo does not support allgather_into_tensor")

    def refuse_non_bytes(output, tensor):
        if tensor.dtype != torch.uint8:
            raise RuntimeError("Invalid scalar type")
        return real(output, tensor)

    for fake, mode in ((refuse_all, 2), (refuse_non_bytes, 1)):
        collectives.FUSED_ALL_GATHER = fake
        collectives._GATHER_MODE.clear()
        try:
            _assert_same(gather(torch.tensor([rank, 7])), torch.tensor([[r, 7] for r in range(world)]).view(-1), f"fallback {mode}")
            _assert_same(gather(mine), want, f"gather with fallback mode {mode}")
            assert set(collectives._GATHER_MODE.values()) == {mode}, collectives._GATHER_MODE
        finally:
            collectives.FUSED_ALL_GATHER = real
            collectives._GATHER_MODE.clear()
    checks += 1

    # gather_object: unequal list lengths are concatenated in rank order
    objects = gather_object([f"r{rank}-{i}" for i in range(rank + 1)])
    assert objects == [f"r{r}-{i}" for r in range(world) for i in range(r + 1)]
    assert gather_object({"rank": rank}) == [{"rank": r} for r in range(world)]
    checks += 1

    # broadcast from the last (non-zero) rank, in place, including a non-contiguous tensor
    src = world - 1
    data = {"x": torch.full((2, 3), float(rank)), "y": [torch.arange(4) * rank], "t": torch.full((3, 2), float(rank)).t()}
    out = broadcast(data, from_process=src)
    assert out["x"] is data["x"] and torch.equal(data["x"], torch.full((2, 3), float(src)))
    assert torch.equal(out["y"][0], torch.arange(4) * src) and torch.equal(out["t"], torch.full((2, 3), float(src)))
    listed = broadcast_object_list([rank, {"from": rank}], from_process=1)
    assert listed == [1, {"from": 1}]
    try:
        broadcast(torch.ones(1), from_process=world)
        raise AssertionError("broadcast accepted an out-of-range process")
    except ValueError as exc:
        assert "from_process" in str(exc)
    checks += 1

    # reduce: sum / mean / none / max / min, scale, integer mean, nested, input untouched
    base = {"v": torch.tensor([1.0, 2.0]) * (rank + 1), "i": [torch.tensor([rank, 1])]}
    total = sum(range(1, world + 1))
    summed = reduce(base, "sum")
    assert torch.equal(summed["v"], torch.tensor([1.0, 2.0]) * total)
    assert torch.equal(summed["i"][0], torch.tensor([sum(range(world)), world]))
    assert torch.equal(base["v"], torch.tensor([1.0, 2.0]) * (rank + 1)), "reduce changed its input"
    assert torch.allclose(reduce(base["v"], "mean"), torch.tensor([1.0, 2.0]) * total / world)
    assert torch.allclose(reduce(base["v"], "mean", scale=0.5), torch.tensor([1.0, 2.0]) * total / world / 2)
    assert torch.equal(reduce(base["v"], "none"), summed["v"])
    assert torch.equal(reduce(base["v"], "max"), torch.tensor([1.0, 2.0]) * world)
    assert torch.equal(reduce(base["v"], "min"), torch.tensor([1.0, 2.0]))
    int_mean = reduce(torch.tensor([rank]), "mean")
    assert int_mean.is_floating_point() and int_mean.item() == pytest.approx(sum(range(world)) / world)
    assert torch.equal(reduce(torch.tensor(float(rank)), "sum", scale=2.0), torch.tensor(float(sum(range(world)) * 2)))
    checks += 1

    # pad_across_processes: uneven sizes along dim 0 and dim 1, pad_first, negative dim, nesting
    def ragged(r):  # rank r has r + 1 rows and r + 2 columns
        return torch.arange((r + 1) * (r + 2), dtype=torch.float32).view(r + 1, r + 2) + 1

    rows, cols = world, world + 1
    t = ragged(rank)
    p0 = pad_across_processes(t, dim=0)
    assert p0.shape == (rows, rank + 2) and torch.equal(p0[: rank + 1], t) and (p0[rank + 1:] == 0).all()
    p1 = pad_across_processes({"t": t, "keep": [torch.ones(2)]}, dim=1, pad_index=-1, pad_first=True)
    assert p1["t"].shape == (rank + 1, cols) and torch.equal(p1["t"][:, cols - (rank + 2):], t)
    assert (p1["t"][:, : cols - (rank + 2)] == -1).all()
    assert torch.equal(p1["keep"][0], torch.ones(2))  # 1-d: dim 1 does not exist, left alone
    pneg = pad_across_processes(t, dim=-1)
    assert pneg.shape == (rank + 1, cols) and torch.equal(pneg[:, : rank + 2], t)
    # pad, then gather: every rank's rows, each padded to the longest
    g = gather(pad_across_processes(torch.full((rank + 1,), rank + 1, dtype=torch.int64), pad_index=0))
    want_g = torch.cat([torch.cat([torch.full((r + 1,), r + 1), torch.zeros(world - r - 1, dtype=torch.int64)]) for r in range(world)])
    assert torch.equal(g, want_g)
    checks += 1

    # copy_tensor_to_devices: one holder (not rank 0), zeros elsewhere, 0-d, nobody
    holder = world - 1
    shared = torch.arange(6, dtype=torch.int64).view(3, 2)
    got_copy = copy_tensor_to_devices(shared.clone() if rank == holder else None)
    assert got_copy.dtype == torch.int64 and torch.equal(got_copy, shared)
    got_copy = copy_tensor_to_devices(torch.arange(4.0) if rank == 0 else torch.zeros(4))
    assert torch.equal(got_copy, torch.arange(4.0))
    assert copy_tensor_to_devices(torch.tensor(True) if rank == 0 else None).item() is True
    try:
        copy_tensor_to_devices(None)
        raise AssertionError("copy_tensor_to_devices accepted None everywhere")
    except ValueError as exc:
        assert "every process passed None" in str(exc)
    checks += 1
    return checks


@pytest.mark.parametrize("world_size", [2, 4])
def test_operations_across_processes(world_size):
    assert run_distributed(_all_operations, world_size) == [9] * world_size


def _debug_mode(env_var: str, odd_ranks: list[int]):
    os.environ[env_var] = "1"
    state = PartialState()
    assert state.debug
    rank = state.process_index
    shape = (3, 2) if rank in odd_ranks else (2, 2)
    messages = {}
    for name, call in (
        ("gather", lambda: gather({"x": torch.ones(shape)})),
        ("reduce", lambda: reduce(torch.ones(shape))),
        ("broadcast", lambda: broadcast(torch.ones(shape), from_process=0)),
        ("pad_across_processes", lambda: pad_across_processes(torch.ones(shape) if rank not in odd_ranks else torch.ones(3))),
    ):
        try:
            call()
            messages[name] = None
        except DistributedOperationException as exc:
            messages[name] = str(exc)
    # the public decorators do the same for user functions
    @chained_operation
    def outer(tensor):
        return inner(tensor)

    @verify_operation
    def inner(tensor):
        return tensor.sum()

    try:
        outer(torch.ones(shape))
        messages["decorators"] = None
    except DistributedOperationException as exc:
        messages["decorators"] = f"{exc} <- {exc.__cause__}"
    assert outer(torch.ones(2)).item() == 2.0
    # what is legal must still work in debug mode: equal shapes, and pad with unequal sizes
    assert torch.equal(gather(torch.ones(2)), torch.ones(2 * state.num_processes))
    assert pad_across_processes(torch.ones(shape), dim=0).shape == (3, 2)
    return messages


@pytest.mark.parametrize("world_size, env_var, odd_ranks", [(2, "ACCEL_DEBUG_MODE", [1]), (4, "ACCELERATE_DEBUG_MODE", [1, 3])])
def test_debug_mode_names_mismatching_ranks(world_size, env_var, odd_ranks):
    results = run_distributed(_debug_mode, world_size, env_var, odd_ranks)
    assert all(r == results[0] for r in results), "ranks disagreed about the error"
    messages = results[0]
    odd = ", ".join(map(str, odd_ranks))
    for name in ("gather", "reduce", "broadcast"):
        text = messages[name]
        assert text is not None, f"{name} did not raise"
        assert f"accel.utils.operations.{name}" in text and f"process(es) {odd} differ from process 0" in text
        assert "Process 0: " in text and f"Process {odd_ranks[-1]}: " in text and "[3, 2] float32" in text
    pad = messages["pad_across_processes"]
    assert pad is not None and "pad_across_processes" in pad and "number of dimensions" in pad and f"process(es) {odd}" in pad
    decorated = messages["decorators"]
    assert decorated is not None and "_debug_mode.<locals>.outer" in decorated and "inner" in decorated


def test_integer_mean_is_floating_point_on_one_process_too():
    from accel.state import AcceleratorState, PartialState
    from accel.utils.operations import reduce

    AcceleratorState._reset_state(reset_partial_state=True)
    PartialState()
    result = reduce(torch.tensor([3, 1]), reduction="mean")
    assert result.dtype.is_floating_point and result.tolist() == [3.0, 1.0]
    AcceleratorState._reset_state(reset_partial_state=True)


# ---------------------------------------------------------------------------- grad-requiring tensors, pad_input_tensors
def _gather_requires_grad():
    from accel.accelerator import Accelerator
    from accel.utils import gather

    accelerator = Accelerator()
    rank = accelerator.process_index
    weight = torch.nn.Parameter(torch.tensor([1.0, 2.0]) * (rank + 1))
    loss = (weight * 2).sum()
    gathered_loss = gather(loss)
    metrics = accelerator.gather_for_metrics(loss[None])
    gathered_weight = gather({"w": weight})["w"]
    # the fast path (a plain contiguous tensor) and the structured path both detach
    return gathered_loss.tolist(), metrics.tolist(), gathered_weight.tolist(), gathered_loss.requires_grad


def test_gather_of_tensors_that_require_grad_on_two_ranks():
    results = run_distributed(_gather_requires_grad, 2)
    for loss, metrics, weight, requires_grad in results:
        assert loss == [6.0, 12.0] and metrics == [6.0, 12.0]
        assert weight == [1.0, 2.0, 2.0, 4.0]
        assert requires_grad is False  # gather is not differentiable, as in Accelerate


@pytest.mark.parametrize("batch, processes, expected", [(1, 2, 2), (3, 2, 4), (4, 3, 6), (3, 4, 4), (4, 6, 6),
                                                        (61, 6, 66), (8, 4, 8), (0, 3, 0)])
def test_pad_input_tensors_pads_to_a_multiple_of_the_processes(batch, processes, expected):
    from accel.utils import pad_input_tensors

    data = torch.arange(batch * 2, dtype=torch.float32).reshape(batch, 2) + 1
    padded = pad_input_tensors({"x": data, "y": [data[:, 0]]}, batch, processes)
    assert padded["x"].shape == (expected, 2) and padded["y"][0].shape == (expected,)
    assert torch.equal(padded["x"][:batch], data) and not padded["x"][batch:].any()


def test_pad_input_tensors_rejects_bad_counts():
    from accel.utils import pad_input_tensors

    with pytest.raises(ValueError, match="num_processes"):
        pad_input_tensors(torch.ones(2), 2, 0)
    with pytest.raises(TypeError, match="Unsupported types"):
        pad_input_tensors("text", 2, 2)
