"""The operator sweep's parts, in process: comparison, sample transfer, torch's metadata, folding,
figures, a profile's tolerances and claims, the census."""

from __future__ import annotations

import itertools
import math
import unittest
from types import SimpleNamespace

import pytest
import torch

from accel_harness.ops import outcomes as oc
from accel_harness.ops.compare import Tolerance, compare, default_tolerance
from accel_harness.ops.fold import fold_task
from accel_harness.ops.plan import QUICK, Row, SampleResult, Selection, Task
from accel_harness.ops.profile_rules import apply_tolerances, check_claims
from accel_harness.ops.summary import census_counts, pass_rates, support_list
from accel_harness.ops.transfer import mirror_tensor

TIGHT = Tolerance(atol=1e-5, rtol=1.3e-6)


def test_compare_measures_the_largest_errors_and_fails_beyond_the_tolerance():
    expected = torch.tensor([1.0, 2.0, 4.0])
    ok = compare(expected + 1e-7, expected, TIGHT)  # float32 rounds the step to its grid
    assert ok.ok and 0 < ok.max_abs < 5e-7
    bad = compare(torch.tensor([1.0, 2.5, 4.0]), expected, TIGHT)
    assert not bad.ok and bad.max_abs == pytest.approx(0.5) and bad.max_rel == pytest.approx(0.25)
    assert "1 of 3 elements differ" in bad.message


def test_compare_treats_equal_nans_and_infinities_as_equal_and_a_lone_nan_as_a_difference():
    expected = torch.tensor([math.nan, math.inf, -math.inf, 1.0])
    assert compare(expected.clone(), expected, TIGHT).ok
    lone = compare(torch.tensor([1.0, math.inf, -math.inf, 1.0]), expected, TIGHT)
    assert not lone.ok and lone.max_abs == math.inf


def test_compare_names_shape_dtype_count_and_exact_integer_differences():
    assert "shape (2,)" in compare(torch.zeros(2), torch.zeros(3), TIGHT).message
    assert "dtype torch.float64" in compare(torch.zeros(2, dtype=torch.float64), torch.zeros(2), TIGHT).message
    assert "2 outputs" in compare((torch.zeros(1),), (torch.zeros(1), torch.zeros(1)), TIGHT).message
    ints = compare(torch.tensor([1, 2, 3]), torch.tensor([1, 2, 4]), default_tolerance(torch.int64))
    assert not ints.ok and "exact comparison" in ints.message
    assert compare([1, (2.0, None)], [1, (2.0, None)], TIGHT).ok
    assert not compare(3, 4, TIGHT).ok


def test_compare_reads_sparse_and_complex_results():
    dense = torch.tensor([[0.0, 1.0], [2.0, 0.0]])
    assert compare(dense.to_sparse(), dense.to_sparse(), TIGHT).ok
    z = torch.tensor([1 + 1j, 2 - 1j])
    assert compare(z.conj(), z.conj().resolve_conj(), TIGHT).ok
    assert not compare(z, z.conj().resolve_conj(), TIGHT).ok


def test_a_view_into_a_larger_storage_keeps_its_offset_and_strides_when_copied():
    base = torch.arange(12.0)
    view = base.as_strided((2, 2), (3, 1), 2)
    copy = mirror_tensor(view, "cpu")
    assert copy.storage_offset() == 2 and copy.stride() == (3, 1)
    assert torch.equal(copy.as_strided((3,), (1,), 0), base[:3])  # the storage around the view came along
    assert copy.untyped_storage().data_ptr() != base.untyped_storage().data_ptr()
    expanded = torch.tensor([1.0, 2.0]).expand(3, 2)
    assert mirror_tensor(expanded, "cpu").stride() == (0, 1)
    leaf = mirror_tensor(torch.ones(2, requires_grad=True), "cpu")
    assert leaf.is_leaf and leaf.requires_grad
    assert not mirror_tensor(torch.ones(2, dtype=torch.int64), "cpu", requires_grad=True).requires_grad


def _task(pairs, xfail=False):
    return Task(tid=0, kind="op", index=0, name="demo", dtype="float32", variants=tuple(v for v, _ in pairs),
                directions=tuple(d for _, d in pairs), limit=3, pairs=tuple(pairs), xfail=xfail)


def test_a_row_takes_its_worst_sample_and_expected_failures_become_xfailed_or_xpassed():
    pairs = [("function", "forward"), ("function", "backward")]
    results = [SampleResult("function", "forward", 0, oc.PASSED, max_abs=0.0),
               SampleResult("function", "forward", 1, oc.MISMATCH, max_abs=0.5, message="off"),
               SampleResult("function", "backward", 0, oc.NO_REFERENCE, message="host raised"),
               SampleResult("function", "backward", 1, oc.PASSED, max_abs=1e-7)]
    forward, backward = fold_task(_task(pairs), results)
    assert (forward.outcome, forward.reason_code, forward.samples) == ("failed", oc.MISMATCH, 2)
    assert forward.max_abs_err == 0.5 and forward.message == "sample 1: off"
    assert (backward.outcome, backward.reason_code) == ("passed", oc.PASSED)  # a sample without reference never outranks
    expected_failure = fold_task(_task(pairs, xfail=True), results)
    assert [r.outcome for r in expected_failure] == ["xfailed", "xpassed"]
    assert oc.worst([]) == oc.NO_SAMPLES and oc.worst([oc.CRASH, oc.TIMEOUT, oc.ERROR]) == oc.CRASH


def _row(op, dtype, outcome, reason="passed", kind="op"):
    return Row(kind=kind, op=op, variant="function", dtype=dtype, direction="forward", outcome=outcome, reason_code=reason)


def test_pass_rates_count_an_operator_once_per_dtype_and_only_when_every_row_passed():
    rows = [_row("add", "float32", "passed"), _row("add", "float32", "failed", oc.MISMATCH),
            _row("mul", "float32", "passed"), _row("mul", "bfloat16", "xpassed"),
            _row("div", "float32", "skipped", oc.TORCH_SKIP), _row("sub", "float32", "known", oc.CRASH)]
    assert pass_rates(rows) == {"float32": {"compared": 3, "passed": 1}, "bfloat16": {"compared": 1, "passed": 1}}
    listing = {entry["op"]: entry for entry in support_list(rows)}
    assert listing["mul"]["supported_dtypes"] == ["bfloat16", "float32"]
    assert listing["add"]["limitations"] == ["float32: mismatch (function, forward)"]
    assert "div" not in listing


def test_census_counts_share_kernels_among_overloads_that_need_one():
    census = [{"operator": "a", "kind": "device-kernel", "host_kernel": True},
              {"operator": "b", "kind": "fallback", "host_kernel": True},
              {"operator": "c", "kind": "missing", "host_kernel": False},
              {"operator": "d", "kind": "composite-implicit", "host_kernel": False}]
    counts = census_counts(census)
    assert counts["need_backend_kernel"] == 3
    assert counts["device_kernel_share"] == pytest.approx(1 / 3) and counts["host_kernel_share"] == pytest.approx(2 / 3)


def test_the_census_of_the_host_finds_kernels_composites_and_what_a_training_step_reaches():
    from accel_harness.ops.census import census, trace_training_step

    rows = {r["operator"]: r["kind"] for r in census("cpu")}
    assert rows["aten::add.Tensor"] == "device-kernel"
    assert rows["aten::linear"] == "composite-implicit"
    trace = trace_training_step(torch.device("cpu"), "cpu")
    reached = {t["operator"] for t in trace}
    assert {"aten::addmm", "aten::native_layer_norm"} <= reached and all(t["calls"] > 0 for t in trace)


def test_a_profile_loosens_every_operator_of_a_dtype_and_replaces_named_operators():
    rules = {"ops": {"bf16": {"atol": 0.05, "rtol": 0.02}}, "op_tolerances": {"nn.functional.layer_norm": {"bf16": {"atol": 0.5, "rtol": 0.1}}}}
    tasks = [Task(0, "op", 0, "add", "bfloat16", ("function",), ("forward",), 3),
             Task(1, "op", 1, "nn.functional.layer_norm", "bfloat16", ("function",), ("forward",), 3),
             Task(2, "op", 2, "add", "float32", ("function",), ("forward",), 3),
             Task(3, "op", 3, "mul", "bfloat16", ("function",), ("forward",), 3, atol=0.1, rtol=0.001)]
    assert apply_tolerances(tasks, rules) == 3
    assert (tasks[0].atol, tasks[0].rtol) == (0.05, 0.02)
    assert (tasks[1].atol, tasks[1].rtol) == (0.5, 0.1)
    assert (tasks[2].atol, tasks[2].rtol) == (None, None)
    assert (tasks[3].atol, tasks[3].rtol) == (0.1, 0.02)  # a floor: torch's looser atol stays


def test_a_claimed_dtype_that_most_operators_fail_is_contradicted():
    profile = SimpleNamespace(capabilities={"dtypes": ["fp32", "bf16", "fp16"]})
    rows = [_row("a", "float32", "passed"), _row("b", "float32", "passed"),
            _row("a", "bfloat16", "failed", oc.MISMATCH), _row("b", "bfloat16", "failed", oc.MISMATCH)]
    verdicts = check_claims(rows, profile)
    assert verdicts["float32"]["verdict"] == "supported"
    assert verdicts["bfloat16"]["verdict"] == "claim-contradicted"
    assert verdicts["float16"]["verdict"] == "not-swept"


def test_torchs_metadata_is_read_from_the_marks_its_decorators_leave():
    from torch.testing._internal.common_device_type import toleranceOverride, tol
    from torch.testing._internal.opinfo.core import DecorateInfo

    from accel_harness.ops.metadata import declaration

    entry = SimpleNamespace(get_decorators=lambda cls, name, device, dtype, kw: [
        d for info in decorations for d in info.decorators if info.is_active(cls, name, device, dtype, kw)])
    decorations = [DecorateInfo(unittest.skip("nondeterministic"), "TestCommon", "test_compare_cpu", dtypes=(torch.float16,)),
                   DecorateInfo(unittest.expectedFailure, "TestCommon", "test_compare_cpu", device_type="emu"),
                   DecorateInfo(toleranceOverride({torch.float32: tol(atol=1e-3, rtol=2e-3)}), "TestCommon", "test_compare_cpu"),
                   DecorateInfo(unittest.skip("other test"), "TestCommon", "test_out")]
    assert declaration(entry, "op", "cuda", torch.float16).skip == "nondeterministic"
    on_emu = declaration(entry, "op", "emu", torch.float32)
    assert on_emu.xfail and not on_emu.skip and (on_emu.atol, on_emu.rtol) == (1e-3, 2e-3)
    assert declaration(entry, "op", "cuda", torch.float32).xfail is False


def test_the_pattern_matches_globs_exact_names_and_alternatives():
    selection = Selection(pattern="fft.*,*layer_norm,add")
    assert selection.wants("fft.ifft") and selection.wants("nn.functional.layer_norm") and selection.wants("add")
    assert not selection.wants("addr") and not selection.wants("mul")
    assert QUICK.dtypes == ("float32", "bfloat16") and QUICK.directions == ("forward",)


def test_op_samples_are_the_samples_torch_gives_outside_a_test():
    """The sweep's own sample iteration yields what ``OpInfo.sample_inputs`` yields, value for value."""
    pytest.importorskip("expecttest")
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    from accel_harness.ops.execute import op_samples
    from accel_harness.ops.seeding import use_backend

    entries = {op.name: op for op in op_db if op.name in ("add", "sum", "nn.functional.conv2d", "index_put", "randn_like")}
    assert len(entries) >= 4
    for entry, backend in itertools.product(entries.values(), (None, SimpleNamespace(device_type="cpu", is_host=True))):
        use_backend(backend)  # None: torch.manual_seed; the cpu backend: the host generator alone
        try:
            mine = op_samples(entry, torch.device("cpu"), torch.float32, False, 3)
        finally:
            use_backend(None)
        theirs = list(itertools.islice(entry.sample_inputs("cpu", torch.float32), 3))
        assert len(mine) == len(theirs) > 0, entry.name
        for a, b in zip(mine, theirs):
            torch.testing.assert_close(a.input, b.input, rtol=0, atol=0)
            flat_a = [x for x in a.args if isinstance(x, torch.Tensor)]
            flat_b = [x for x in b.args if isinstance(x, torch.Tensor)]
            assert len(flat_a) == len(flat_b)
            for x, y in zip(flat_a, flat_b):
                torch.testing.assert_close(x, y, rtol=0, atol=0)
            assert a.kwargs.keys() == b.kwargs.keys()
    everything = op_samples(entries["add"], torch.device("cpu"), torch.float32, False, None)
    assert len(everything) == len(list(entries["add"].sample_inputs("cpu", torch.float32)))


def test_optimizers_run_the_implementation_the_device_would_pick_on_both_sides():
    """foreach on the devices torch defaults to it (cuda here, by type alone), the for-loop on the host; a choice already made stays."""
    from accel_harness.ops.nn_entries import same_implementation

    assert same_implementation(torch.optim.Adam, {"lr": 0.1}, torch.device("cuda")) == {"lr": 0.1, "foreach": True}
    assert same_implementation(torch.optim.Adam, {"lr": 0.1}, torch.device("cpu")) == {"lr": 0.1, "foreach": False}
    for kept in ({"foreach": False}, {"fused": True}, {"differentiable": True}):
        assert same_implementation(torch.optim.Adam, kept, torch.device("cuda")) == kept
    assert same_implementation(torch.optim.LBFGS, {}, torch.device("cuda")) == {}  # no foreach implementation


def test_a_floating_output_of_an_integer_sample_gets_its_own_dtypes_tolerance():
    """fft of integers gives floats: the exact tolerance of the integer input does not apply to them."""
    expected = torch.tensor([1.0, 2.0, 3.0])
    assert compare(expected + 1e-7, expected, Tolerance(atol=0.0, rtol=0.0)).ok
    assert not compare(expected + 1e-2, expected, Tolerance(atol=0.0, rtol=0.0)).ok
    assert not compare(torch.tensor([1, 2]), torch.tensor([1, 3]), Tolerance(atol=0.0, rtol=0.0)).ok


def test_a_sweeps_records_carry_the_suites_torch_version_and_build(tmp_path):
    """One machine's sweep and suites fall into one report cell: the same version and build fields."""
    from accel.commands.env import collect_environment
    from accel_harness.ops.output import write_outputs
    from accel_harness.ops.runner import SweepResult
    from accel_harness.records import read_records

    result = SweepResult(backend="cpu", device="cpu", device_type="cpu", torch=torch.__version__)
    paths = write_outputs(result, tmp_path)
    header, _, _ = read_records(paths["records"])
    suites_torch = collect_environment(include_deepspeed=False)["torch"]
    assert header["torch_version"] == suites_torch["version"] == torch.__version__
    assert header["torch_build"] == suites_torch["build"]
