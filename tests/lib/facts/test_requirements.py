"""The two decorator sets behave alike: for every row of accel.facts.requirements, accel.test_utils (the
active backend) and the harness's marks (a test instance on that backend) skip or run the same tests,
with the same reason code, on backends with different device counts, dtypes and collectives."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from _fake_backend import NoDevice

from accel.backends.base import Availability, Backend, Capability
from accel.facts import versions
from accel.facts.requirements import NOT_IN_TABLE, REQUIREMENT_TABLE, marker_code
from accel.test_utils import testing
from accel_harness import markers


class Fake(NoDevice, Backend):
    """A backend whose answers are set by the test."""

    def __init__(self, name, *, count=1, comm="fakeccl", fp16=True, bf16=True, fp8=False, torch_version=None):
        super().__init__(torch_version)
        self.name = self.device_type = name
        self._count, self._comm = count, comm
        self._caps = {"fp16": fp16, "bf16": bf16, "fp8": fp8}

    def _probe(self):
        return Availability(True, "fake driver loaded")

    def device_count(self):
        return self._count

    @property
    def comm_backend(self):
        return self._comm

    @property
    def supports_fp16(self):
        return Capability(self._caps["fp16"], "fake fp16")

    @property
    def supports_bf16(self):
        return Capability(self._caps["bf16"], "fake bf16")

    @property
    def supports_fp8(self):
        return Capability(self._caps["fp8"], "fake fp8")


BACKENDS = {
    "cpu": Fake("cpu", comm="gloo", fp8=True),
    "cuda x1": Fake("cuda", comm="nccl", fp8=True),
    "cuda x2": Fake("cuda", count=2, comm="nccl"),
    "xpu x2": Fake("xpu", count=2, comm="xccl", fp16=False),
    "xpu x1": Fake("xpu", comm="xccl", bf16=False),
    "mps": Fake("mps", comm=None, fp16=False),
    "hpu x4": Fake("hpu", count=4, comm="hccl"),
    "old torch": Fake("cuda", count=2, comm="nccl", torch_version="2.4.1"),
}


def _harness(row, backend):
    marks = [SimpleNamespace(name=n.marker, args=n.args, kwargs=dict(n.kwargs)) for n in row.needs]
    reason = markers.evaluate(marks, backend, world_size=1)
    return (True, None) if reason is None else (False, reason.code)


def _test_utils(row, backend):
    satisfied, _, code = testing.check_needs(row.needs, backend)
    return (True, None) if satisfied else (False, code)


@pytest.mark.parametrize("backend", list(BACKENDS), ids=list(BACKENDS))
@pytest.mark.parametrize("name", sorted(REQUIREMENT_TABLE))
def test_both_sets_skip_alike(name, backend, monkeypatch):
    monkeypatch.delenv("RUN_SLOW", raising=False)
    row, fake = REQUIREMENT_TABLE[name], BACKENDS[backend]
    assert _test_utils(row, fake) == _harness(row, fake)


@pytest.mark.parametrize("value, runs", [("yes", True), ("0", False), ("maybe", False)])
def test_slow_follows_run_slow_in_both(value, runs, monkeypatch):
    monkeypatch.setenv("RUN_SLOW", value)
    row = REQUIREMENT_TABLE["slow"]
    assert _test_utils(row, BACKENDS["cpu"]) == _harness(row, BACKENDS["cpu"]) == ((True, None) if runs else (False, "opt-in"))


def test_the_settled_meanings():
    """The disagreements found between the two sets, settled with Accelerate 1.15 as the reference."""
    def runs(name, backend):
        return _test_utils(REQUIREMENT_TABLE[name], BACKENDS[backend])[0]

    # require_single_device: an accelerator, and exactly one device (the harness alias skipped nothing on 2 GPUs)
    assert runs("require_single_device", "cuda x1") and not runs("require_single_device", "cuda x2")
    assert not runs("require_single_device", "cpu")
    # require_multi_gpu: two cuda devices (the harness alias took two devices of any backend)
    assert runs("require_multi_gpu", "cuda x2") and not runs("require_multi_gpu", "hpu x4")
    assert runs("require_multi_device", "hpu x4") and runs("require_multi_gpu_or_xpu", "xpu x2")
    # require_fsdp2: the library's own floor (test_utils said 2.5, the harness 2.6) and a collective backend
    assert versions.TORCH_FSDP2 == "2.6.0"
    assert not runs("require_fsdp2", "old torch") and not runs("require_fsdp2", "mps") and runs("require_fsdp2", "cuda x2")
    # require_tp: torch and transformers floors (the harness alias checked transformers only)
    needs = {n.marker for n in REQUIREMENT_TABLE["require_tp"].needs}
    assert needs == {"require_torch", "require_package"}


def test_every_row_starts_with_a_known_marker_and_the_needs_are_in_evaluation_order():
    for name, row in REQUIREMENT_TABLE.items():
        assert row.needs and row.message, name
        for need in row.needs:
            assert markers.is_harness_mark(need.marker), (name, need.marker)
            marker_code(need.marker)
        assert name not in NOT_IN_TABLE


def test_harness_decorators_apply_the_table_marks():
    decorator = markers.as_decorator("require_tp")

    @decorator
    def test_x():
        pass

    assert [(m.name, m.args) for m in test_x.pytestmark] == [
        ("require_torch", (f">={versions.TORCH_TP}",)), ("require_package", (f"transformers>={versions.TRANSFORMERS_TP}",))]
