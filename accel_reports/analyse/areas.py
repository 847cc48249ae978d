"""Which feature area a test belongs to, from the suite file it comes from: the one table of it.

The report's per-area summary (data-parallel, FSDP, DeepSpeed, ...) groups tests by this table;
a test from a file not listed here (an upstream suite, a project's own tests) is in ``other``.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["AREA_ORDER", "OTHER", "SUITE_AREAS", "area_of"]

#: suite file stem -> feature area
SUITE_AREAS = {
    "test_training": "data-parallel",
    "test_fsdp": "FSDP",
    "test_deepspeed": "DeepSpeed",
    "test_mixed_precision": "mixed precision",
    "test_fp8_training": "mixed precision",
    "test_checkpointing": "checkpointing",
    "test_data_loading": "data loading",
    "test_big_modeling": "big-model",
    "test_collectives": "collectives",
    "test_launch": "launch",
    "test_memory": "memory",
    "test_seeding": "seeding",
    "test_state_and_process": "state",
    "test_backend_contract": "backend contract",
    "test_quantization": "quantization",
    "test_peft": "PEFT",
    "test_sequence_parallel": "sequence parallel",
    "test_models": "models",
    "test_compile": "compile",
    "test_profiler": "profiler",
    "test_bench_checkpoint": "benchmarks",
    "test_bench_collectives": "benchmarks",
    "test_bench_data_loader": "benchmarks",
    "test_bench_matmul": "benchmarks",
    "test_bench_memory": "benchmarks",
    "test_bench_train_step": "benchmarks",
    # the rows of an operator sweep (accel ops), filed under this name though no such suite file exists
    "test_ops": "operators",
}
#: the area of every test from a file not in :data:`SUITE_AREAS`
OTHER = "other"
#: areas in the order the report lists them (the table's order, then ``other``)
AREA_ORDER = tuple(dict.fromkeys(SUITE_AREAS.values())) + (OTHER,)

_FILE = re.compile(r"([^/\\:]+?)\.py(?:::|\Z)")


def area_of(test_id: Any) -> str:
    """The area of a test, from its (device-neutral) id or nodeid: ``suites/test_fsdp.py::t`` -> ``FSDP``."""
    match = _FILE.search(str(test_id or ""))
    return SUITE_AREAS.get(match.group(1), OTHER) if match else OTHER
