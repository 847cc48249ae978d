"""Checkpointing reads a CheckpointContext of values, never the Accelerator."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import torch

import accel.checkpointing
from accel import Accelerator
from accel.checkpointing import load_state, save_state
from accel.checkpointing.context import CheckpointContext
from accel.state import AcceleratorState, GradientState
from accel.utils.dataclasses import ProjectConfiguration

PACKAGE = Path(accel.checkpointing.__file__).parent


@pytest.fixture(autouse=True)
def fresh_state():
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def test_no_checkpointing_function_takes_or_imports_the_accelerator():
    for path in sorted(PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names = [a.arg for a in node.args.args + node.args.kwonlyargs]
                assert "accelerator" not in names, f"{path.name}:{node.lineno} {node.name} takes the Accelerator"
            if isinstance(node, ast.ImportFrom):
                assert "Accelerator" not in [a.name for a in node.names], f"{path.name}:{node.lineno} imports Accelerator"


def test_the_context_is_frozen():
    fields = {f.name for f in dataclasses.fields(CheckpointContext)}
    assert {"process_index", "num_processes", "step", "wait_for_everyone", "get_state_dict"} <= fields
    ctx = CheckpointContext(**dict.fromkeys(fields))
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.step = 3  # type: ignore[misc]


def test_a_context_built_by_hand_saves_and_loads(tmp_path):
    """Only the values in the context are used: its barrier, its step, its state-dict operation."""
    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(3, 2))
    barriers = []
    config = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True)

    def context(step: int) -> CheckpointContext:
        return CheckpointContext(
            project_configuration=config, strategy=accelerator.strategy, backend=accelerator.backend,
            device=torch.device("cpu"), process_index=0, num_processes=1, is_main_process=True,
            is_local_main_process=True, use_distributed=False, step=step,
            wait_for_everyone=lambda: barriers.append(1), get_state_dict=lambda m: {k: v.clone() for k, v in m.state_dict().items()},
            unwrap_model=lambda m: m,
        )

    saved = save_state(context(step=11), accelerator.prepared_objects())
    assert saved.iteration == 1 and barriers, "save_state met the other processes through the context's barrier"
    assert accelerator.step == 0 and config.iteration == 0  # nothing written into the caller's objects
    weight = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.zero_()
    loaded = load_state(context(step=0), accelerator.prepared_objects())
    assert loaded.step == 11 and loaded.iteration == 1
    assert torch.equal(model.weight, weight)
