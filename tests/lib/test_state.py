"""PartialState / AcceleratorState / GradientState, single process and real gloo groups."""

import pytest
import torch

from accel.state import AcceleratorState, GradientState, PartialState, ProcessLayout
from accel.utils.dataclasses import DistributedType, GradientAccumulationPlugin
from dist_utils import run_distributed


def test_single_process_defaults():
    state = PartialState()
    assert state.num_processes == 1 and state.process_index == 0
    assert state.distributed_type == DistributedType.NO
    assert state.device == torch.device("cpu")
    assert state.is_main_process and state.is_local_main_process and state.is_last_process
    assert not state.use_distributed
    assert PartialState() .__dict__ is state.__dict__  # shared state
    with state.split_between_processes([1, 2, 3]) as part:
        assert part == [1, 2, 3]


def test_reset_forgets_state():
    PartialState()
    assert PartialState().initialized
    PartialState._reset_state()
    assert not PartialState._shared_state


def test_unknown_process_group_argument_is_named():
    with pytest.raises(TypeError, match="bogus"):
        PartialState(bogus=1)


@pytest.mark.parametrize(
    "env, expected",
    [
        ({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, (1, 4, 1, 2, "torchrun")),
        ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}, (3, 4, 1, 4, "Open MPI")),
        ({"PMI_RANK": "0", "PMI_SIZE": "2"}, (0, 2, 0, 2, "MPICH/Intel MPI")),
        ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "4(x2)"}, (5, 8, 1, 4, "SLURM")),
        ({}, (0, 1, 0, 1, "single process")),
    ],
)
def test_layout_from_launcher_environment(env, expected):
    layout = ProcessLayout.from_environment(env)
    assert (layout.rank, layout.world_size, layout.local_rank, layout.local_world_size, layout.source) == expected


def test_layout_rejects_inconsistent_environment():
    with pytest.raises(ValueError, match="RANK=4 with WORLD_SIZE=2"):
        ProcessLayout.from_environment({"RANK": "4", "WORLD_SIZE": "2"})
    with pytest.raises(ValueError, match="non-integer"):
        ProcessLayout.from_environment({"RANK": "x", "WORLD_SIZE": "2"})


def test_accelerator_state_precision_validation(monkeypatch):
    with pytest.raises(ValueError, match="mixed_precision must be one of"):
        AcceleratorState(mixed_precision="fp32")
    monkeypatch.setenv("ACCEL_MIXED_PRECISION", "bf16")
    state = AcceleratorState()
    assert state.mixed_precision == "bf16"
    assert state.device == torch.device("cpu") and state.num_processes == 1
    with pytest.raises(ValueError, match="already initialised"):
        AcceleratorState(mixed_precision="fp16", _from_accelerator=True)


def test_gradient_state_tracks_dataloaders():
    gs = GradientState(GradientAccumulationPlugin(num_steps=4))
    assert gs.num_steps == 4 and gs.sync_gradients and not gs.in_dataloader

    class Loader:
        end_of_dataloader = True
        remainder = 3

    loader = Loader()
    gs._add_dataloader(loader)
    assert GradientState().active_dataloader is loader
    assert gs.end_of_dataloader and gs.remainder == 3
    gs._remove_dataloader(loader)
    assert not gs.in_dataloader and gs.remainder == -1


def _rank_view():
    state = PartialState()
    calls = []
    state.on_main_process(lambda: calls.append("main"))()
    state.on_last_process(lambda: calls.append("last"))()
    state.on_process(lambda: calls.append("p1"), process_index=1)()
    with state.split_between_processes(list(range(7)), apply_padding=True) as padded:
        pass
    with state.split_between_processes({"a": torch.arange(7), "b": list("abcdefg")}) as split_dict:
        pass
    order = []
    with state.main_process_first():
        order.append(state.process_index)
    state.wait_for_everyone()
    return {
        "rank": state.process_index,
        "world": state.num_processes,
        "type": str(state.distributed_type),
        "backend": state.backend,
        "calls": calls,
        "padded": padded,
        "a": split_dict["a"].tolist(),
        "b": split_dict["b"],
    }


@pytest.mark.parametrize("world_size", [2, 4])
def test_real_process_group(world_size):
    results = run_distributed(_rank_view, world_size)
    assert [r["rank"] for r in results] == list(range(world_size))
    assert {r["world"] for r in results} == {world_size}
    assert {r["type"] for r in results} == {"MULTI_CPU"}
    assert {r["backend"] for r in results} == {"gloo"}
    assert results[0]["calls"][0] == "main" and "last" in results[-1]["calls"] and "p1" in results[1]["calls"]
    # contiguous shares, first ranks get the extra items, padding repeats the last item
    flat = [x for r in results for x in r["a"]]
    assert flat == list(range(7))
    assert [len(r["padded"]) for r in results] == [len(results[0]["padded"])] * world_size
    assert results[-1]["padded"][-1] == 6
    assert "".join(x for r in results for x in r["b"]) == "abcdefg"


def test_state_remembers_whether_the_cpu_was_asked_for():
    PartialState()
    assert PartialState._shared_state["_cpu"] is False
    PartialState._reset_state()
    PartialState(cpu=True)
    assert PartialState._shared_state["_cpu"] is True
    PartialState()  # cpu=False keeps the state as it is, as in Accelerate
    assert PartialState._shared_state["_cpu"] is True


def test_cpu_cannot_be_asked_for_once_the_state_runs_on_a_device(monkeypatch):
    # Accelerate's override of the device stands in for an accelerator here (the meta device is no CPU)
    monkeypatch.setenv("ACCEL_TORCH_DEVICE", "meta")
    state = PartialState()
    assert state.device.type == "meta" and PartialState._shared_state["_cpu"] is False
    with pytest.raises(ValueError, match=r"already been initialized and cannot be changed.*`cpu=True`.*meta"):
        PartialState(cpu=True)
    PartialState(cpu=False)  # the same request again is fine
    AcceleratorState()
    with pytest.raises(ValueError, match="pass `cpu=True` to `Accelerator\\(\\)`"):
        AcceleratorState(cpu=True)
    assert AcceleratorState().device.type == "meta"


def test_a_megatron_lm_plugin_is_refused_with_what_is_missing():
    with pytest.raises(NotImplementedError, match=r"megatron_lm_plugin drives Megatron-LM training.*missing: .*engine in accel"):
        AcceleratorState(megatron_lm_plugin=object())
    assert not AcceleratorState._shared_state.get("_initialized", False)
    with pytest.raises(ValueError, match="tp_size must be a positive integer"):
        AcceleratorState(torch_tp_plugin=object())


def test_accelerator_state_reads_ranks_and_device_from_the_partial_state_and_names_a_reset():
    state = AcceleratorState(cpu=True)
    partial = PartialState()
    assert (state.device, state.num_processes, state.process_index, state.local_process_index) == (
        partial.device, partial.num_processes, partial.process_index, partial.local_process_index)
    assert state.distributed_type == state.run_plan.distributed_type  # its own value wins over the partial one
    AcceleratorState._reset_state(reset_partial_state=True)
    with pytest.raises(AttributeError, match="`AcceleratorState` object has no attribute `device`.*_reset_state"):
        _ = state.device
    with pytest.raises(AttributeError, match="no attribute 'not_a_field'"):
        _ = AcceleratorState().not_a_field


def _kept_across_a_reset():
    import torch.distributed as dist

    state = AcceleratorState(cpu=True)
    AcceleratorState._reset_state(reset_partial_state=True)
    # as in Accelerate, the kept object's process methods go through a fresh process state
    main = state.is_main_process
    state.wait_for_everyone()
    state.destroy_process_group()
    return main, dist.is_initialized()


def test_an_accelerator_state_kept_across_a_reset_still_ends_the_process_group():
    """Accelerate's distributed test scripts reset the state and then call ``destroy_process_group`` on the
    object they kept (it raised ``AttributeError: _partial``)."""
    results = run_distributed(_kept_across_a_reset, 2)
    assert results == [(True, False), (False, False)]
