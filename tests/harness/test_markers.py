"""accel_harness.markers: the marker table, Accelerate aliases, skip texts and per-instance evaluation."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

from _fake_backend import NoDevice

from accel.backends.base import Availability, Backend, Capability
from accel.backends.cpu import CPUBackend
from accel_harness import marker_checks, markers
from accel_harness.markers import (
    ACCELERATE_ALIASES,
    MARKERS,
    SKIP_CODES,
    MarkerUsageError,
    SkipReason,
    as_decorator,
    evaluate,
    format_skip,
    parse_skip,
    validate,
)


class FakeBackend(NoDevice, Backend):
    """A backend whose every answer is set by the test; counts dtype probes."""

    device_type = "fake"

    def __init__(self, name="fake", *, count=1, comm="fakeccl", available=True, fp16=True, bf16=True,
                 fp8=False, amp=True, device_type=None, torch_version=None, comm_error=None):
        super().__init__(torch_version)
        self.name = name
        if device_type is not None:
            self.device_type = device_type
        self._count = count
        self._comm = comm
        self._available = available
        self._caps = {"fp16": fp16, "bf16": bf16, "fp8": fp8}
        self._amp = amp
        self._comm_error = comm_error
        self.probes: list[str] = []

    def _probe(self) -> Availability:
        return Availability(self._available, "fake driver loaded" if self._available else "fake driver missing")

    def device_count(self) -> int:
        return self._count

    @property
    def comm_backend(self):
        if self._comm_error is not None:
            raise self._comm_error
        return self._comm

    def comm_backend_reason(self) -> str:
        return f"{self.name} has no collectives in this build"

    def _cap(self, key: str) -> Capability:
        self.probes.append(key)
        ok = self._caps[key]
        return Capability(ok, f"{key} probe {'passed' if ok else 'failed: kernel not implemented'}")

    @property
    def supports_fp16(self) -> Capability:
        return self._cap("fp16")

    @property
    def supports_bf16(self) -> Capability:
        return self._cap("bf16")

    @property
    def supports_fp8(self) -> Capability:
        return self._cap("fp8")

    def amp_capability(self, dtype) -> Capability:
        self.probes.append(f"amp-{dtype}")
        return Capability(self._amp, "autocast ok" if self._amp else f"autocast to {dtype} runs in float32 here")


def mark(name, *args, **kwargs):
    return SimpleNamespace(name=name, args=args, kwargs=kwargs)


@pytest.fixture(scope="module")
def cpu():
    return CPUBackend()


@pytest.fixture(autouse=True, scope="module")
def _registered_markers(request):
    """Register the table the way the plugin does, so ``pytest.mark.<name>`` passes --strict-markers."""
    for name, description in MARKERS.items():
        request.config.addinivalue_line("markers", f"{name}: {description}")


# ---------------------------------------------------------------------------- tables
def test_marker_table_has_every_marker_with_a_one_line_description():
    required = {
        "require_non_xpu", "require_non_cpu", "require_non_hpu", "require_non_mps", "require_non_cuda",
        "require_devices", "require_multi_device", "require_fp16", "require_bf16", "require_fp8",
        "require_package", "require_torch", "require_deepspeed", "require_fsdp2", "slow", "world_size",
        "known_limitation", "require_backend",
    }
    assert required <= set(MARKERS)
    for name, description in MARKERS.items():
        assert name.isidentifier(), name
        assert description.strip() and "\n" not in description, name


def test_every_alias_points_at_a_registered_marker_with_valid_arguments():
    for alias, needs in ACCELERATE_ALIASES.items():
        assert needs, alias
        for need in needs:
            assert need.marker in MARKERS or markers.is_harness_mark(need.marker), alias
            validate([mark(need.marker, *need.args, **need.kwargs)], where=alias)  # raises on bad arguments


def test_every_accel_test_utils_decorator_has_a_harness_alias():
    """Both sets come from accel.facts.requirements: the same names, apart from the two that are no row."""
    from accel.facts.requirements import NOT_IN_TABLE
    from accel.test_utils.testing import REQUIREMENTS

    assert set(REQUIREMENTS) == set(ACCELERATE_ALIASES) | set(NOT_IN_TABLE)
    assert not set(NOT_IN_TABLE) & set(ACCELERATE_ALIASES)


def test_require_package_any_of_needs_only_one(cpu):
    present, absent = "packaging", "no_such_package_xyz"
    assert evaluate([mark("require_package", absent, present, any_of=True)], cpu) is None
    reason = evaluate([mark("require_package", absent, "no_such_other_xyz", any_of=True)], cpu)
    assert reason is not None and reason.code == "needs-package" and "one of" in reason.message
    assert evaluate([mark("require_package", absent, present)], cpu) is not None
    with pytest.raises(MarkerUsageError, match="any_of"):
        validate([mark("require_package", present, any_of="yes")], where="t")


@pytest.mark.parametrize("alias, marker, args", [
    ("require_cuda", "require_backend", ("cuda",)),
    ("require_xpu", "require_backend", ("xpu",)),
    ("require_mps", "require_backend", ("mps",)),
    ("require_hpu", "require_backend", ("hpu",)),
    ("require_cpu", "require_backend", ("cpu",)),
    ("require_multi_device", "require_devices", (2,)),
    ("require_multi_gpu", "require_devices", (2,)),
    ("require_multi_xpu", "require_devices", (2,)),
    ("require_non_cpu", "require_non_cpu", ()),
    ("require_deepspeed", "require_deepspeed", ()),
    ("require_bnb", "require_package", ("bitsandbytes",)),
])
def test_as_decorator_builds_the_canonical_mark(alias, marker, args):
    decorator = as_decorator(alias)
    assert decorator.mark.name == marker
    assert decorator.mark.args == args

    @decorator
    def test_something():
        pass

    applied = test_something.pytestmark
    assert [(m.name, m.args) for m in applied] == [(marker, args)]


def test_an_alias_of_several_marks_applies_them_all_in_table_order():
    decorator = as_decorator("require_single_device")
    assert [(m.mark.name, m.mark.args, m.mark.kwargs) for m in decorator.marks] == [
        ("require_non_cpu", (), {}), ("require_devices", (1,), {"exact": True})]

    @decorator
    class TestOnOneAccelerator:
        def test_x(self):
            pass

    assert [m.name for m in TestOnOneAccelerator.pytestmark] == ["require_non_cpu", "require_devices"]
    one_cuda = FakeBackend("cuda", count=1)
    assert evaluate(TestOnOneAccelerator.pytestmark, one_cuda) is None
    assert evaluate(TestOnOneAccelerator.pytestmark, FakeBackend("cuda", count=2)).code == "needs-devices"
    assert evaluate(TestOnOneAccelerator.pytestmark, CPUBackend()).code == "not-on-backend"


def test_aliases_import_like_accelerate_test_utils():
    from accel_harness.markers import require_cuda, require_devices, require_multi_gpu

    assert (require_cuda.mark.name, require_cuda.mark.args) == ("require_backend", ("cuda",))
    assert (require_multi_gpu.mark.name, require_multi_gpu.mark.args) == ("require_devices", (2,))
    # a canonical marker comes back unbound, ready to take its argument
    assert require_devices(4).mark.args == (4,)


def test_unknown_decorator_name_suggests_the_close_one():
    with pytest.raises(AttributeError, match="require_cuda"):
        as_decorator("require_cudaa")
    with pytest.raises(AttributeError):
        markers.require_nothing_like_this  # noqa: B018


def test_require_torch_min_version_matches_accelerate_usage():
    decorator = markers.require_torch_min_version(version="2.5")
    assert (decorator.mark.name, decorator.mark.args) == ("require_torch", (">=2.5",))
    with pytest.raises(ValueError, match="version"):
        markers.require_torch_min_version()


def test_is_harness_mark():
    assert markers.is_harness_mark("require_devices")
    assert markers.is_harness_mark("require_non_npu")  # plug-in backends get the same treatment
    assert not markers.is_harness_mark("parametrize")
    assert not markers.is_harness_mark("require_non_")


# ---------------------------------------------------------------------------- skip texts
@pytest.mark.parametrize("code", SKIP_CODES)
def test_skip_text_round_trip(code):
    reason = SkipReason(code, f"something about {code}: 2 of 3")
    text = format_skip(reason)
    assert text == f"[{code}] something about {code}: 2 of 3"
    assert parse_skip(text) == reason
    assert parse_skip("Skipped: " + text) == reason  # pytest's skip longrepr message
    assert parse_skip(("/x/test_a.py", 12, "Skipped: " + text)) == reason  # the longrepr tuple
    assert str(reason) == text


def test_parse_skip_of_text_without_a_known_code():
    assert parse_skip("Skipped: unconditional skip") == SkipReason("unspecified", "unconditional skip")
    assert parse_skip("[made-up] reason") == SkipReason("unspecified", "[made-up] reason")
    assert parse_skip("") == SkipReason("unspecified", "")
    assert parse_skip(None).code == "unspecified"


def test_multi_line_skip_message_survives():
    reason = SkipReason("needs-package", "line one\nline two")
    assert parse_skip(format_skip(reason)) == reason


def test_skip_reason_rejects_unknown_codes():
    with pytest.raises(ValueError, match="needs-devices"):
        SkipReason("needs-device", "typo in the code")


# ---------------------------------------------------------------------------- evaluation
def test_no_marks_no_skip(cpu):
    assert evaluate([], cpu) is None
    assert evaluate([mark("parametrize", "x", [1, 2]), mark("usefixtures", "tmp_path"), mark("cpu")], cpu) is None


def test_unavailable_backend_is_the_first_reason():
    backend = FakeBackend("xpu", available=False)
    reason = evaluate([mark("require_devices", 8)], backend)
    assert reason == SkipReason("backend-unavailable", "xpu: fake driver missing")


@pytest.mark.parametrize("excluded", ["cpu", "cuda", "xpu", "mps", "hpu"])
def test_require_non_backend(excluded):
    on = FakeBackend(excluded)
    off = FakeBackend("other")
    reason = evaluate([mark(f"require_non_{excluded}")], on)
    assert reason.code == "not-on-backend"
    assert excluded in reason.message
    assert evaluate([mark(f"require_non_{excluded}")], off) is None


def test_require_non_cpu_on_the_real_cpu_backend(cpu):
    assert evaluate([pytest.mark.require_non_cpu.mark], cpu).code == "not-on-backend"


def test_require_backend_runs_only_the_named_instances(cpu):
    marks = [pytest.mark.require_backend("cuda", "xpu").mark]
    reason = evaluate(marks, cpu)
    assert reason == SkipReason("not-on-backend", "test runs only on cuda, xpu; this instance runs on cpu")
    assert evaluate(marks, FakeBackend("xpu")) is None


def test_require_devices_message_names_backend_and_counts():
    backend = FakeBackend("cuda", count=1)
    reason = evaluate([pytest.mark.require_devices(2).mark], backend)
    assert format_skip(reason) == "[needs-devices] test needs 2 cuda devices, 1 visible"
    assert evaluate([mark("require_devices", 2)], FakeBackend("cuda", count=2)) is None
    assert evaluate([mark("require_devices", n=3)], FakeBackend("cuda", count=2)).code == "needs-devices"


def test_require_devices_counts_physical_devices_so_cpu_has_one(cpu):
    assert evaluate([mark("require_devices", 1)], cpu) is None
    assert evaluate([mark("require_devices", 2)], cpu).message == "test needs 2 cpu devices, 1 visible"
    assert evaluate([mark("require_multi_device")], cpu).code == "needs-devices"
    assert evaluate([mark("require_multi_device")], FakeBackend("xpu", count=4)) is None


@pytest.mark.parametrize("marker, key", [("require_fp16", "fp16"), ("require_bf16", "bf16"), ("require_fp8", "fp8")])
def test_dtype_markers_use_backend_capabilities(marker, key):
    unsupported = FakeBackend("hpu", **{key: False})
    reason = evaluate([mark(marker)], unsupported)
    assert reason.code == "unsupported-dtype"
    assert f"test needs {key}, which hpu does not support" in reason.message
    assert f"{key} probe failed: kernel not implemented" in reason.message  # the capability's reason
    supported = FakeBackend("hpu", **{key: True})
    assert evaluate([mark(marker)], supported) is None
    assert supported.probes == [key]


def test_dtype_amp_variant_asks_for_autocast():
    backend = FakeBackend("mps", amp=False)
    reason = evaluate([mark("require_fp16", amp=True)], backend)
    assert reason.code == "unsupported-dtype"
    assert "fp16 autocast" in reason.message and "runs in float32" in reason.message
    assert backend.probes == ["amp-torch.float16"]
    assert evaluate([mark("require_bf16", amp=True)], FakeBackend("mps", amp=True)) is None


def test_dtype_markers_on_the_real_cpu_backend(cpu):
    assert evaluate([mark("require_bf16")], cpu) is None  # bf16 matmul runs on any CPU torch
    fp8 = cpu.supports_fp8
    reason = evaluate([mark("require_fp8")], cpu)
    if fp8.supported:
        assert reason is None
    else:
        assert reason.code == "unsupported-dtype" and fp8.reason in reason.message


def test_capability_probe_that_raises_becomes_an_unsupported_dtype_skip():
    class Broken(FakeBackend):
        @property
        def supports_bf16(self):
            raise RuntimeError("driver exploded")

    reason = evaluate([mark("require_bf16")], Broken("xpu"))
    assert reason.code == "unsupported-dtype"
    assert "RuntimeError: driver exploded" in reason.message


def test_require_package_present_and_missing(cpu):
    assert evaluate([mark("require_package", "yaml", "json")], cpu) is None
    reason = evaluate([mark("require_package", "yaml", "surely_not_installed_pkg_q7")], cpu)
    assert reason == SkipReason("needs-package", "test needs the surely_not_installed_pkg_q7 package, which is not installed")


def test_require_package_never_imports(tmp_path, monkeypatch, cpu):
    package = tmp_path / "harness_probe_pkg_x1"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('imported!')\n")
    (package / "present.py").write_text("raise RuntimeError('imported!')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert evaluate([mark("require_package", "harness_probe_pkg_x1")], cpu) is None
    assert evaluate([mark("require_package", "harness_probe_pkg_x1.present")], cpu) is None
    assert evaluate([mark("require_package", "harness_probe_pkg_x1.absent")], cpu).code == "needs-package"
    assert "harness_probe_pkg_x1" not in sys.modules


def test_require_package_with_a_version_specifier(cpu):
    import packaging

    installed = packaging.__version__
    assert evaluate([mark("require_package", "packaging>=1")], cpu) is None
    reason = evaluate([mark("require_package", "packaging<1")], cpu)
    assert reason == SkipReason("needs-package", f"test needs packaging<1; installed {installed}")
    reason = evaluate([mark("require_package", "surely-not-installed-dist-q7>=1.0")], cpu)
    assert reason.message == "test needs surely-not-installed-dist-q7>=1.0, which is not installed"


def test_require_deepspeed(monkeypatch, cpu):
    missing = "test needs the deepspeed package, which is not installed"
    monkeypatch.setattr(marker_checks, "package_problem", lambda text: missing if text == "deepspeed" else None)
    reason = evaluate([mark("require_deepspeed")], cpu)
    assert reason == SkipReason("needs-package", missing)
    monkeypatch.setattr(marker_checks, "package_problem", lambda text: None)
    monkeypatch.setattr(marker_checks, "_deepspeed_accelerators", lambda: ("cuda", "cpu"))
    assert evaluate([mark("require_deepspeed")], cpu) is None
    assert evaluate([mark("require_deepspeed")], FakeBackend("mps", device_type="mps")).code == "not-on-backend"


def test_require_torch_compares_the_base_version():
    backend = FakeBackend("cuda")
    reason = evaluate([mark("require_torch", ">=2.5")], backend, torch_version="2.4.1")
    assert reason.code == "torch-version"
    assert ">=2.5" in reason.message and "2.4.1" in reason.message
    assert evaluate([mark("require_torch", ">=2.5")], backend, torch_version="2.6.0+cu124") is None
    assert evaluate([mark("require_torch", "<2.9")], backend, torch_version="2.9.0.dev20250101") is not None
    assert evaluate([mark("require_torch", ">=2.5,<2.8")], backend, torch_version="2.7.1") is None


def test_require_torch_defaults_to_the_backend_torch_version():
    old = CPUBackend(torch_version="2.4.0")
    assert evaluate([mark("require_torch", ">=2.5")], old).code == "torch-version"
    installed = torch.__version__.split("+")[0]
    assert evaluate([mark("require_torch", f"=={installed}")], CPUBackend()) is None


def test_require_fsdp2():
    with_comm = FakeBackend("cuda", comm="nccl")
    assert evaluate([mark("require_fsdp2")], with_comm, torch_version="2.6.0") is None
    reason = evaluate([mark("require_fsdp2")], with_comm, torch_version="2.5.1")
    assert reason.code == "torch-version" and "2.6" in reason.message
    reason = evaluate([mark("require_fsdp2")], FakeBackend("mps", comm=None), torch_version="2.8.0")
    assert reason.code == "needs-multiprocess"
    assert "mps has no collectives in this build" in reason.message


def test_world_size_without_collectives_needs_multiprocess():
    mps = FakeBackend("mps", comm=None)
    reason = evaluate([mark("world_size", [1, 2])], mps, world_size=2)
    assert reason.code == "needs-multiprocess"
    assert "world size 2" in reason.message and "mps has no collectives in this build" in reason.message
    assert evaluate([mark("world_size", [1, 2])], mps, world_size=1) is None
    # a single-size mark gives the world size when the caller does not
    assert evaluate([mark("world_size", 2)], mps).code == "needs-multiprocess"


def test_world_size_comm_probe_error_is_reported():
    backend = FakeBackend("cpu", device_type="cpu", comm_error=ValueError("ACCEL_CPU_COMM_BACKEND must be gloo"))
    reason = evaluate([mark("world_size", 2)], backend, world_size=2)
    assert reason.code == "needs-multiprocess" and "ACCEL_CPU_COMM_BACKEND" in reason.message


def test_world_size_on_cpu_shares_the_host_device(cpu):
    assert evaluate([mark("world_size", 4)], cpu, world_size=4) is None


def test_world_size_on_accelerators_needs_one_device_per_rank():
    two_gpus = FakeBackend("cuda", count=2, comm="nccl")
    assert evaluate([mark("world_size", [2, 4])], two_gpus, world_size=2) is None
    reason = evaluate([mark("world_size", [2, 4])], two_gpus, world_size=4)
    assert reason == SkipReason("needs-devices", "world size 4 needs 4 cuda devices (one per rank), 2 visible")
    sharing = FakeBackend("cuda", count=2, comm="nccl")
    sharing.ranks_share_device = True
    assert evaluate([mark("world_size", 4)], sharing, world_size=4) is None


def test_known_limitation():
    marks = [mark("known_limitation", "mps", "hpu", reason="no float64 on this device")]
    reason = evaluate(marks, FakeBackend("mps"))
    assert reason == SkipReason("known-limitation", "known limitation on mps: no float64 on this device")
    assert evaluate(marks, FakeBackend("cuda")) is None
    ranged = [mark("known_limitation", "mps", reason="fp16 autocast", torch="<2.8", url="https://example.org/1")]
    assert evaluate(ranged, FakeBackend("mps"), torch_version="2.8.0") is None
    reason = evaluate(ranged, FakeBackend("mps"), torch_version="2.7.0")
    assert reason.code == "known-limitation" and "<2.8" in reason.message and "https://example.org/1" in reason.message


def test_slow_alone_never_skips(cpu):
    assert evaluate([mark("slow")], cpu) is None


def test_checks_run_in_a_fixed_order_and_dtype_probes_last():
    backend = FakeBackend("cuda", count=1, fp16=False)
    marks = [mark("require_fp16"), mark("require_devices", 2), mark("require_torch", ">=9"), mark("require_non_cuda")]
    assert evaluate(marks, backend).code == "not-on-backend"
    assert evaluate(marks[:3], backend).code == "torch-version"
    assert evaluate(marks[:2], backend).code == "needs-devices"
    assert backend.probes == []  # the device probe never ran while a cheaper reason existed
    assert evaluate(marks[:1], backend).code == "unsupported-dtype"
    assert backend.probes == ["fp16"]


def test_several_marks_of_one_kind_all_count():
    backend = FakeBackend("cuda", count=2)
    # e.g. a class-level require_devices(2) and a function-level require_devices(4)
    assert evaluate([mark("require_devices", 4), mark("require_devices", 2)], backend).message == \
        "test needs 4 cuda devices, 2 visible"


# ---------------------------------------------------------------------------- bad usage
@pytest.mark.parametrize("bad, fragment", [
    (mark("require_devices", "two"), "'two'"),
    (mark("require_devices", 0), "0"),
    (mark("require_devices", True), "True"),
    (mark("require_devices"), "(none)"),
    (mark("require_devices", 2, 3), "2, 3"),
    (mark("require_torch", "banana"), "'banana'"),
    (mark("require_torch"), "(none)"),
    (mark("require_torch", 2.5), "2.5"),
    (mark("require_package"), "(none)"),
    (mark("require_package", 3), "3"),
    (mark("require_package", "pkg[extra]"), "'pkg[extra]'"),
    (mark("require_package", "not a name!"), "'not a name!'"),
    (mark("require_non_cpu", "x"), "'x'"),
    (mark("require_backend"), "(none)"),
    (mark("require_backend", ""), "''"),
    (mark("require_fp16", amp="yes"), "amp='yes'"),
    (mark("require_fp8", amp=True), "amp=True"),
    (mark("require_bf16", "x"), "'x'"),
    (mark("world_size", "a"), "'a'"),
    (mark("world_size", []), "(none)"),
    (mark("world_size", [2, -1]), "-1"),
    (mark("known_limitation", "mps"), "reason"),
    (mark("known_limitation", reason="why"), "(none)"),
    (mark("known_limitation", "mps", reason="why", torch="soon"), "'soon'"),
    (mark("require_devices", count=2), "count=2"),
    (mark("fork_server_imports"), "(none)"),
    (mark("fork_server_imports", "json", "not a module"), "'not a module'"),
    (mark("fork_server_imports", "json", eager=True), "eager=True"),
])
def test_bad_marker_usage_raises_a_clear_value_error(bad, fragment):
    with pytest.raises(MarkerUsageError) as info:
        evaluate([bad], FakeBackend("cuda", count=8), where="suites/test_a.py::test_x[cuda-ws1]")
    error = info.value
    assert isinstance(error, ValueError)
    text = str(error)
    assert text.startswith("suites/test_a.py::test_x[cuda-ws1]: bad @pytest.mark." + bad.name)
    assert fragment in text
    assert error.marker == bad.name


def test_bad_usage_is_raised_on_every_backend_even_one_that_would_skip():
    unavailable = FakeBackend("xpu", available=False)
    with pytest.raises(MarkerUsageError, match="require_torch"):
        evaluate([mark("require_non_xpu"), mark("require_torch", "banana")], unavailable)
    with pytest.raises(MarkerUsageError):
        validate([pytest.mark.require_devices("two").mark])
    validate([pytest.mark.require_devices(2).mark, pytest.mark.parametrize("x", [1]).mark])


def test_what_the_fork_server_imports_is_no_condition():
    assert evaluate([mark("fork_server_imports", "json", "email.message")], FakeBackend("cuda", count=1)) is None


def test_bad_world_size_argument_to_evaluate(cpu):
    with pytest.raises(ValueError, match="world_size"):
        evaluate([], cpu, world_size=0)


def test_codes_agree_with_accel_test_utils():
    testing = pytest.importorskip("accel.test_utils.testing")
    assert set(testing.REASON_CODES) <= set(SKIP_CODES)
    text = "[backend-unavailable] test requires a cuda device (backend cuda unavailable: no driver)"
    assert parse_skip("Skipped: " + text) == SkipReason(
        "backend-unavailable", "test requires a cuda device (backend cuda unavailable: no driver)")
