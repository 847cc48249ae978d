"""What importing accel pulls in: a structural guard on import cost (it measures no time).

``from accel import Accelerator`` needs the state, the resolution and the Accelerator's own small
helpers; strategies, precision, checkpointing, trackers, data loading and the optional frameworks
load when a run uses them. Each check runs a fresh interpreter and lists the modules it imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: modules (and packages, with everything under them) that ``from accel import Accelerator`` must not import
HEAVY_FOR_ACCELERATOR = (
    "accel.strategies.base", "accel.strategies.ddp", "accel.strategies.fsdp", "accel.strategies.deepspeed",
    "accel.strategies.context", "accel.precision", "accel.logging", "accel.checkpointing", "accel.tracking",
    "accel.data_loader", "accel.big_modeling", "accel.utils.modeling", "accel.utils.operations",
    "accel.strategies.fsdp.plugin", "accel.utils.deepspeed", "accel.facade.model_wrappers", "accel.facade.uneven_inputs",
    "accel.facade.context_parallel", "accel.facts.env_table", "accel.facts.requirements", "accel.commands", "accel_harness",
    "deepspeed", "torchao", "transformers",
)


def imported_after(statement: str, before: str = "") -> list[str]:
    """The modules a fresh interpreter imports for ``statement`` (after running ``before``, not counted)."""
    code = (f"import sys\n{before}\nseen = set(sys.modules)\n{statement}\n"
            "import json\nprint(json.dumps(sorted(set(sys.modules) - seen)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def under(modules: list[str], prefixes: tuple[str, ...]) -> list[str]:
    """Those of ``modules`` that are one of ``prefixes`` or inside one of them."""
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes))


@pytest.fixture(scope="module")
def accelerator_import() -> list[str]:
    return imported_after("from accel import Accelerator", before="import torch")


def test_the_accelerator_import_leaves_strategies_and_optional_parts_for_later(accelerator_import):
    assert "accel.accelerator" in accelerator_import and "accel.state" in accelerator_import
    assert under(accelerator_import, HEAVY_FOR_ACCELERATOR) == []


def test_what_was_left_out_still_loads_when_an_accelerator_is_built():
    modules = imported_after("from accel import Accelerator\nAccelerator(cpu=True)", before="import torch")
    assert {"accel.strategies.context", "accel.strategies.base", "accel.precision"} <= set(modules)


def test_import_accel_imports_no_submodule_but_its_lazy_table():
    modules = imported_after("import accel")
    assert [m for m in modules if m.startswith("accel")] == ["accel", "accel._lazy"]
    assert "torch" not in modules


def test_the_facts_package_loads_only_the_table_asked_for():
    assert [m for m in imported_after("import accel.facts") if m.startswith("accel.facts.")] == []
    modules = imported_after("from accel.facts.environment import env_flag")
    assert under(modules, ("accel.facts",)) == ["accel.facts", "accel.facts.environment"]
    modules = imported_after("from accel.facts.environment import ENV_VARS")
    assert "accel.facts.env_table" in modules


def test_the_strategy_context_comes_without_the_strategies():
    modules = imported_after("import accel.strategies.context", before="import torch")
    assert under(modules, ("accel.strategies",)) == ["accel.strategies", "accel.strategies.context"]
