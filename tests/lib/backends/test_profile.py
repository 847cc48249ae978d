"""Device profiles: loading and validation, the backend made from one, claims checked against skips,
known issues that expire, and ``pytest --profile`` end to end on a cpu device under another name."""

from __future__ import annotations

import datetime
import json
import textwrap
from pathlib import Path

import pytest
import torch

from accel.backends.profile import (HOOKS, ProfileBackend, ProfileError, canonical_dtype, load_profile, resolve_callable,
                                    spec_no_op)
from accel_harness import markers
from accel_harness.known_issues import KnownIssues, KnownIssuesError
from accel_harness.profile import CLAIM_CONTRADICTED, ProfileSession, item_areas, lacks_area

pytest_plugins = ["pytester"]

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "profiles"

PROFILE = textwrap.dedent(
    """\
    version: "2.1"
    device:
      name: mycpu
      device_type: cpu
    hooks:
      seed: "profile_hooks:seed"
      get_rng_state: "torch:get_rng_state"
      set_rng_state: "torch.set_rng_state"
      device_count: "profile_hooks:device_count"
      comm_backend: gloo
    capabilities:
      dtypes: [fp32, bfloat16]
      autocast: [bf16]
      collectives: true
      device_count: 2
    tolerances:
      bf16: {training: 0.05}
      fp16: {training: {rtol: 0.001, atol: 0.002}}
    """
)

HOOK_MODULE = textwrap.dedent(
    """\
    import torch
    CALLS = []

    def seed(value):
        CALLS.append(("seed", value))
        torch.manual_seed(value)

    def device_count():
        CALLS.append(("device_count",))
        return 1
    """
)


@pytest.fixture
def hooks_module(tmp_path, monkeypatch):
    (tmp_path / "profile_hooks.py").write_text(HOOK_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib
    import sys

    sys.modules.pop("profile_hooks", None)
    return importlib.import_module("profile_hooks")


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


# ---------------------------------------------------------------------------- loading
def test_yaml_profile_loads_with_claims_tolerances_and_hash(tmp_path, hooks_module):
    profile = load_profile(write(tmp_path, "p.yaml", PROFILE))
    assert (profile.name, profile.device_type, profile.version, profile.format) == ("mycpu", "cpu", "2.1", "yaml")
    assert profile.comm_backend == "gloo" and profile.hooks["seed"] == "profile_hooks:seed"
    declared = profile.declared()
    assert declared["bf16"] and declared["bf16_autocast"] and not declared["fp16"] and not declared["fp16_autocast"]
    assert declared["collectives"] is True and declared["device_count"] == 2 and declared["compile"] is None
    assert profile.tolerance(torch.bfloat16, "training") == {"rtol": 0.05, "atol": 0.05}
    assert profile.tolerance("float16", "training") == {"rtol": 0.001, "atol": 0.002}
    assert profile.tolerance("bf16", "forward", {"rtol": 1.0, "atol": 2.0}) == {"rtol": 1.0, "atol": 2.0}
    with pytest.raises(KeyError, match="bf16/forward"):
        profile.tolerance("bf16", "forward")
    assert len(profile.sha256) == 64
    again = load_profile(write(tmp_path, "q.yaml", PROFILE + "\n# a comment changes the hash\n"))
    assert again.sha256 != profile.sha256


def test_toml_profile_gives_the_same_claims(tmp_path, hooks_module):
    path = write(tmp_path, "p.toml", """\
        [device]
        name = "mycpu"
        device_type = "cpu"
        [hooks]
        seed = "profile_hooks:seed"
        [capabilities]
        dtypes = ["fp32", "bf16"]
        autocast = ["bf16"]
        [tolerances.bf16]
        training = 0.05
        [[known_issues]]
        id = "x-1"
        tests = ["suites/test_a.py::test_b"]
        expires = 2020-01-02
        """)
    profile = load_profile(path)
    assert profile.format == "toml" and profile.declared()["bf16_autocast"] is True
    assert profile.tolerance("bf16", "training")["atol"] == 0.05
    assert profile.known_issues[0]["expires"] == datetime.date(2020, 1, 2)


@pytest.mark.parametrize("text, line, needle", [
    ("device:\n  name: mycpu\n  device_typ: cpu\n", 3, "device.device_typ: unknown key (did you mean 'device_type'?)"),
    ("device: {name: mycpu, device_type: cpu}\ncapabilites: {}\n", 2, "capabilites: unknown key (did you mean 'capabilities'?)"),
    ("device: {name: mycpu, device_type: cpu}\nhooks:\n  seed: torch:manual_sed\n", 3, "did you mean 'manual_seed'?"),
    ("device: {name: mycpu, device_type: cpu}\nhooks:\n  sed: torch:manual_seed\n", 3, "did you mean 'seed'?"),
    ("device: {name: mycpu, device_type: cpu}\ncapabilities:\n  dtypes: [fp32, bf61]\n", 3, "unknown dtype 'bf61'"),
    ("device: {name: mycpu, device_type: cpu}\ncapabilities:\n  collectives: yes please\n", 3, "expected true or false"),
    ("device: {name: mycpu, device_type: cpu}\ntolerances:\n  bf16: {training: -1}\n", 3, "non-negative number"),
    ("device: {name: MyCPU, device_type: cpu}\n", 1, "lower-case"),
    ("device:\n  name: mycpu\n", 1, "missing required key 'device_type'"),
    ("device: [\n", 2, "not valid YAML"),
])
def test_yaml_errors_name_file_line_key_and_a_suggestion(tmp_path, text, line, needle):
    path = write(tmp_path, "bad.yaml", text)
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    message = str(info.value)
    assert str(path) in message and f"line {line}" in message and needle in message, message
    assert info.value.line == line


def test_toml_errors_point_at_the_key_line(tmp_path):
    path = write(tmp_path, "bad.toml", '[device]\nname = "mycpu"\ndevice_type = "cpu"\n\n[capabilities]\nmemory_stat = true\n')
    with pytest.raises(ProfileError, match=r"line 6.*capabilities\.memory_stat: unknown key \(did you mean 'memory_stats'\?\)"):
        load_profile(path)


def test_unknown_format_and_missing_file_are_errors(tmp_path):
    with pytest.raises(ProfileError, match="unknown profile format '.json'"):
        load_profile(write(tmp_path, "p.json", "{}"))
    with pytest.raises(ProfileError, match="file not found"):
        load_profile(tmp_path / "nope.yaml")


def test_resolve_callable_accepts_both_spellings_and_names_the_problem():
    assert resolve_callable("torch:manual_seed") is torch.manual_seed
    assert resolve_callable("torch.manual_seed") is torch.manual_seed
    assert resolve_callable("torch.cpu:synchronize") is torch.cpu.synchronize
    with pytest.raises(ValueError, match="cannot import 'no_such_pkg_xyz'"):
        resolve_callable("no_such_pkg_xyz:f")
    with pytest.raises(ValueError, match="names no module"):
        resolve_callable("manual_seed")
    with pytest.raises(ValueError, match="not callable"):
        resolve_callable("torch:__version__".replace("__version__", "float32"))
    assert canonical_dtype(torch.bfloat16) == "bf16" and canonical_dtype("half") == "fp16"


# ---------------------------------------------------------------------------- the backend
def test_backend_from_a_profile_calls_its_hooks(tmp_path, hooks_module):
    backend = ProfileBackend(load_profile(write(tmp_path, "p.yaml", PROFILE)))
    assert backend.name == "mycpu" and backend.device_type == "cpu"
    assert backend.is_available() and backend.device_count() == 1
    assert ("device_count",) in hooks_module.CALLS
    backend.manual_seed(1234)
    assert ("seed", 1234) in hooks_module.CALLS
    state = backend.get_rng_state()
    first = torch.rand(3)
    backend.set_rng_state(state)
    assert torch.equal(torch.rand(3), first)
    assert backend.comm_backend == "gloo" and backend.supports_multiprocess()
    assert backend.amp_capability(torch.bfloat16), backend.amp_capability(torch.bfloat16).reason
    assert backend.device(0) == torch.device("cpu")
    sources = {h: backend.hook_source(h) for h in HOOKS}
    assert sources["seed"] == sources["device_count"] == sources["get_rng_state"] == "profile"
    assert sources["synchronize"] == "torch.cpu"  # filled from the device module
    described = backend.describe()
    assert described["profile"]["hooks"]["seed"] == "profile" and described["available"]


def test_a_hook_nothing_provides_is_an_unsupported_feature(tmp_path, monkeypatch):
    path = write(tmp_path, "p.yaml", "device: {name: mycpu, device_type: cpu}\n")
    backend = ProfileBackend(load_profile(path))
    monkeypatch.setattr(backend, "base", None)  # no built-in backend to fall back on
    from accel.backends import UnsupportedFeatureError

    with pytest.raises(UnsupportedFeatureError, match="names no hooks.get_rng_state"):
        backend.get_rng_state()
    assert not backend.memory_stats_capability
    backend.synchronize()  # torch.cpu provides it


def test_transformers_spec_file_is_a_profile(tmp_path):
    spec = write(tmp_path, "spec.py", """\
        import torch

        DEVICE_NAME = "cpu"
        MANUAL_SEED_FN = torch.manual_seed
        EMPTY_CACHE_FN = None
        DEVICE_COUNT_FN = lambda: 1
        SUPPORTS_TRAINING = True
        """)
    profile = load_profile(spec)
    assert (profile.name, profile.device_type, profile.format) == ("cpu", "cpu", "spec")
    assert profile.hooks["seed"] is torch.manual_seed and profile.hooks["empty_cache"] is spec_no_op
    backend = ProfileBackend(profile)
    assert backend.is_available() and backend.device_count() == 1
    backend.empty_cache()  # None in a spec: nothing to do
    backend.manual_seed(7)
    assert torch.equal(backend.get_rng_state(), torch.get_rng_state())  # missing hook filled in
    assert backend.hook_source("synchronize") == "torch.cpu"


def test_a_specs_none_means_what_it_means_in_transformers(tmp_path):
    """transformers' dispatch returns None instead of calling a None function: no count from the spec (torch's
    is used: the backend stays available), and nothing to do for a None action."""
    spec = write(tmp_path, "spec.py", """\
        DEVICE_NAME = "cpu"
        DEVICE_COUNT_FN = None
        MANUAL_SEED_FN = None
        SYNCHRONIZE_FN = None
        RESET_PEAK_MEMORY_STATS_FN = None
        """)
    profile = load_profile(spec)
    assert "device_count" not in profile.hooks
    backend = ProfileBackend(profile)
    assert backend.is_available() and backend.device_count() == 1  # it was unavailable: "device_count() is none"
    backend.manual_seed(3)  # no device generator to seed: nothing happens, nothing raises
    backend.synchronize()
    assert backend.hook_source("seed") == "profile"


def test_spec_file_errors(tmp_path):
    with pytest.raises(ProfileError, match="DEVICE_NAME"):
        load_profile(write(tmp_path, "a.py", "X = 1\n"))
    with pytest.raises(ProfileError, match="did you mean 'MANUAL_SEED_FN'"):
        load_profile(write(tmp_path, "b.py", "DEVICE_NAME = 'cpu'\nMANUAL_SEED_FM = print\n"))
    with pytest.raises(ProfileError, match="ZeroDivisionError"):
        load_profile(write(tmp_path, "c.py", "DEVICE_NAME = 'cpu'\n1/0\n"))


def test_accel_profile_environment_variable_registers_the_backend(tmp_path, monkeypatch, hooks_module):
    from accel.backends import get_registry, reset_registry

    monkeypatch.setenv("ACCEL_PROFILE", str(write(tmp_path, "p.yaml", PROFILE)))
    reset_registry()
    try:
        backend = get_registry().get("mycpu")
        assert isinstance(backend, ProfileBackend) and backend.is_available()
    finally:
        monkeypatch.delenv("ACCEL_PROFILE")
        reset_registry()


# ---------------------------------------------------------------------------- claims
class _Mark:
    def __init__(self, name, *args, **kwargs):
        self.name, self.args, self.kwargs = name, args, kwargs


def test_areas_and_contradictions(tmp_path, hooks_module):
    session = ProfileSession(load_profile(write(tmp_path, "p.yaml", PROFILE)))
    assert item_areas([_Mark("require_bf16", amp=True)], "suites/t.py::x", 1) == ["bf16_autocast"]
    assert item_areas([_Mark("require_fp16")], "suites/t.py::x", 2) == ["fp16", "collectives"]
    assert item_areas([], "suites/test_memory.py::x", 1) == ["memory_stats"]
    assert item_areas([], "suites/t.py::x", 1) == ["general"]
    assert lacks_area("bf16", markers.UNSUPPORTED_DTYPE, "") and not lacks_area("bf16", markers.NEEDS_PACKAGE, "")
    dtype_skip = markers.SkipReason(markers.UNSUPPORTED_DTYPE, "no bf16 autocast")
    message = session.contradiction(["bf16_autocast"], dtype_skip)
    assert message == f"[{CLAIM_CONTRADICTED}] profile 'mycpu' declared bf16_autocast; skipped: [unsupported-dtype] no bf16 autocast"
    assert session.contradiction(["fp16_autocast"], dtype_skip) is None  # fp16 is not claimed
    assert session.contradiction(["bf16_autocast"], markers.SkipReason(markers.NEEDS_PACKAGE, "no x")) is None
    devices = markers.SkipReason(markers.NEEDS_DEVICES, "test needs 2 mycpu devices, 1 visible")
    assert "declared 2 devices" in session.contradiction(["device_count"], devices, needed_devices=2)
    assert session.contradiction(["device_count"], devices, needed_devices=4) is None  # claims fewer than needed


# ---------------------------------------------------------------------------- known issues that expire
def test_known_issue_expiry_and_new_fields():
    issues = KnownIssues.from_data([
        {"id": "old", "tests": ["t.py::test_a"], "expires": datetime.date(2020, 1, 1), "reason": "known-limitation",
         "issue": "https://example.invalid/1"},
        {"id": "live", "tests": ["t.py::test_b"], "expires": "2999-12-31", "torch": ">=2.0"},
    ])
    old, live = issues.get("old"), issues.get("live")
    assert old.is_expired() and not live.is_expired()
    assert old.is_expired(datetime.date(2020, 1, 2)) and not old.is_expired(datetime.date(2020, 1, 1))
    assert [i.id for i in issues.expired()] == ["old"]
    assert issues.match_failure("t.py::test_a", None, "cpu", "2.13", "boom") is None
    assert issues.match_failure("t.py::test_a", None, "cpu", "2.13", "boom", include_expired=True) is old
    assert issues.match_failure("t.py::test_b", None, "cpu", "2.13", "boom") is live
    assert issues.match_test("t.py::test_a", None, "cpu", "2.13") == []
    assert old.as_dict()["expires"] == "2020-01-01" and old.as_dict()["reason"] == "known-limitation"
    with pytest.raises(KnownIssuesError, match="field 'expires': expected a date written YYYY-MM-DD"):
        KnownIssues.from_data([{"id": "x", "tests": ["a"], "expires": "soon"}])
    with pytest.raises(KnownIssuesError, match="field 'reason': expected a reason code"):
        KnownIssues.from_data([{"id": "x", "tests": ["a"], "reason": "Not A Code"}])
    with pytest.raises(KnownIssuesError, match="did you mean 'expires'"):
        KnownIssues.from_data([{"id": "x", "tests": ["a"], "expire": "2020-01-01"}])


# ---------------------------------------------------------------------------- pytest --profile end to end
SUITE = textwrap.dedent(
    """
    import pytest
    import torch
    import torch.distributed as dist

    @pytest.mark.require_bf16(amp=True)
    def test_bf16_autocast_runs(backend, device):
        with backend.autocast(torch.bfloat16):
            assert (torch.ones(2, 2, device=device) @ torch.ones(2, 2, device=device)).dtype == torch.bfloat16

    @pytest.mark.require_bf16(amp=True)
    def test_bf16_body_skip(backend):
        pytest.skip("[unsupported-dtype] no bf16 autocast")

    @pytest.mark.require_devices(2)
    def test_two_devices(backend):
        pass

    @pytest.mark.require_fp16(amp=True)
    def test_fp16_not_claimed(backend):
        pytest.skip("[unsupported-dtype] no fp16 autocast here")

    def test_tolerance(backend, tolerance):
        got = tolerance("bf16", "training", {"rtol": 1.0, "atol": 1.0})
        expected = 0.05 if backend.name == "mycpu" else 1.0
        assert got == {"rtol": expected, "atol": expected}

    def test_fails_under_expired_issue(backend):
        assert False, "expired cover"

    def test_fails_under_live_issue(backend):
        assert False, "live cover"

    @pytest.mark.world_size(2)
    def test_ranks_see_the_profile_backend(backend, world_size, rank):
        t = torch.ones(1, device=backend.device())
        dist.all_reduce(t)
        assert backend.name == "mycpu" and t.item() == 2

    def test_not_selected(backend):
        pass
    """
)

E2E_PROFILE = textwrap.dedent(
    """\
    device: {name: mycpu, device_type: cpu}
    hooks:
      seed: "torch:manual_seed"
      get_rng_state: "torch:get_rng_state"
      set_rng_state: "torch:set_rng_state"
      device_count: "torch.cpu:device_count"
      comm_backend: gloo
    capabilities:
      dtypes: [fp32, bf16]
      autocast: [bf16]
      collectives: true
      device_count: 2
    tolerances:
      bf16: {training: 0.05}
    known_issues:
      - id: gone-stale
        tests: ["*::test_fails_under_expired_issue"]
        reason: known-limitation
        issue: https://example.invalid/1
        expires: 2020-01-01
      - id: still-open
        tests: ["*::test_fails_under_live_issue"]
        expires: 2999-01-01
    """
)


def _records(results: Path):
    files = list(results.glob("*.jsonl"))
    assert len(files) == 1, files
    lines = [json.loads(line) for line in files[0].read_text().splitlines()]
    tests = {r["test_id"].split("::")[-1].removesuffix("[ws1]"): r for r in lines if r["type"] == "test" and r["backend"] == "mycpu"}
    return lines[0], tests, lines[-1]


def test_pytest_profile_end_to_end(pytester, tmp_path):
    """The option's prefixed name, ``--accel-profile`` (the short ``--profile`` is the one accel qualify passes,
    and the spec and bad-profile tests give); with a test deselected, for the run's fingerprints."""
    pytester.makepyfile(test_suite=SUITE)
    profile = write(tmp_path, "mycpu.yaml", E2E_PROFILE)
    results = tmp_path / "results"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs", "--accel-profile", str(profile),
                                           "--results-dir", str(results), "-k", "not test_not_selected", timeout=600)
    out = result.stdout.str()
    assert "gone-stale" in out and "expired" in out  # the console warning
    header, tests, end = _records(results)
    assert header["backends"] == ["mycpu"]
    meta = header["extra"]["profile"]
    assert meta["name"] == "mycpu" and len(meta["sha256"]) == 64 and meta["declared"]["bf16_autocast"] is True
    assert [e["id"] for e in meta["expired_known_issues"]] == ["gone-stale"]
    assert meta["probes"]["bf16_autocast"]["value"] is True and meta["probes"]["device_count"]["value"] == 1
    assert meta["disagreements"] == {"device_count": "declared 2 devices; the backend sees 1"}
    assert "claim not borne out by the backend's probe: device_count" in out

    assert tests["test_bf16_autocast_runs"]["outcome"] == "passed"
    assert tests["test_bf16_autocast_runs"]["extra"]["capability_areas"] == ["bf16_autocast"]
    body = tests["test_bf16_body_skip"]
    assert body["outcome"] == "failed" and body["reason_code"] == CLAIM_CONTRADICTED
    assert "declared bf16_autocast; skipped: [unsupported-dtype] no bf16 autocast" in body["message"]
    two = tests["test_two_devices"]  # the probe (1 device) contradicts the claim (2)
    assert two["outcome"] == "failed" and two["reason_code"] == CLAIM_CONTRADICTED and "declared 2 devices" in two["message"]
    assert tests["test_fp16_not_claimed"]["outcome"] == "skipped"
    assert tests["test_fp16_not_claimed"]["reason_code"] == "unsupported-dtype"
    assert tests["test_tolerance"]["outcome"] == "passed"
    stale = tests["test_fails_under_expired_issue"]
    assert stale["outcome"] == "failed" and stale["known_issue"] is None and stale["extra"]["expired_known_issue"] == "gone-stale"
    assert tests["test_fails_under_live_issue"]["known_issue"] == "still-open"
    assert tests["test_ranks_see_the_profile_backend[ws2]"]["outcome"] == "passed"

    coverage = end["profile_coverage"]["areas"]
    assert coverage["bf16_autocast"] == {"applicable": 2, "ran": 2, "passed": 1, "failed": 1, "skipped": 0,
                                         "contradicted": [n for n in [body["nodeid"]]]}
    assert coverage["device_count"]["contradicted"] == [two["nodeid"]]
    assert coverage["collectives"]["passed"] == 1
    assert end["profile_coverage"]["not_claimed"] == {"fp16_autocast": 1}
    assert "applicable coverage per area" in out
    _check_the_run_fingerprints(profile, results, header, end)


def test_pytest_profile_with_a_transformers_spec(pytester, tmp_path):
    pytester.makepyfile(test_suite="""
        import torch

        def test_runs(backend, device):
            backend.manual_seed(3)
            assert backend.name == "cpu" and type(backend).__name__ == "ProfileBackend"
            assert torch.ones(2, device=device).sum().item() == 2
    """)
    spec = write(tmp_path, "spec.py", """\
        import torch
        DEVICE_NAME = "cpu"
        MANUAL_SEED_FN = torch.manual_seed
        EMPTY_CACHE_FN = None
        DEVICE_COUNT_FN = lambda: 1
        """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--profile", str(spec), timeout=600)
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed") == 1 and "failed" not in outcomes and "errors" not in outcomes, outcomes


def test_a_bad_profile_stops_the_session_with_its_line(pytester, tmp_path):
    pytester.makepyfile(test_suite="def test_x(backend):\n    pass\n")
    bad = write(tmp_path, "bad.yaml", "device: {name: mycpu, device_type: cpu}\ncapabilities:\n  autocats: [bf16]\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--profile", str(bad), timeout=600)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--profile: device profile*bad.yaml, line 3: capabilities.autocats: unknown key (did you mean 'autocast'?)*"])


def test_example_profiles_load():
    # the files only: loading the .py spec imports it, and Python may keep its bytecode in __pycache__ there
    loaded = {path.name: load_profile(path) for path in sorted(EXAMPLE.iterdir()) if path.is_file()}
    assert {"mycpu.yaml", "mycpu.toml", "cpu_spec.py"} <= set(loaded)
    yaml_profile, toml_profile = loaded["mycpu.yaml"], loaded["mycpu.toml"]
    assert yaml_profile.declared() == toml_profile.declared() and yaml_profile.hooks == toml_profile.hooks
    assert yaml_profile.tolerances == toml_profile.tolerances
    assert loaded["cpu_spec.py"].format == "spec"


def test_accel_qualify_passes_the_profile_to_the_suites(tmp_path, monkeypatch, capsys):
    """Through main() in this process (the suites run as qualify's child either way); the profile reaches this
    process's registry, which starts afresh after each run."""
    from accel.backends import reset_registry
    from accel.commands.cli import main

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "q"
    try:
        code = main(["qualify", "--profile", str(EXAMPLE / "mycpu.yaml"), "-n", "0", "-k", "test_forward_really_runs", "--no-bench",
                     "--ops", "none", "-o", str(out)])
    finally:
        reset_registry()
    stdout, stderr = capsys.readouterr()
    assert code == 0, stdout + stderr
    assert "backends mycpu" in stdout
    header, tests, end = _records(out / "results")
    assert header["extra"]["profile"]["name"] == "mycpu" and header["backends"] == ["mycpu"]
    assert {t["outcome"] for t in tests.values()} == {"passed"} and len(tests) == 2
    bad = write(tmp_path, "bad.yaml", "device: {name: mycpu}\n")
    try:
        assert main(["qualify", "--profile", str(bad), "--no-bench", "--ops", "none", "-o", str(tmp_path / "q2")]) == 2
    finally:
        reset_registry()
    assert "missing required key 'device_type'" in capsys.readouterr().err


def _check_the_run_fingerprints(profile: Path, results: Path, header: dict, end: dict) -> None:
    """The environment's fingerprint in the header, the selected tests' in the run's end (of the end-to-end run)."""
    from accel_harness.fingerprint import environment_fingerprint, tests_fingerprint

    fp = header["extra"]["fingerprint"]
    assert fp["torch"] == torch.__version__ and fp["accel"] and fp["profile"]["sha256"] == header["extra"]["profile"]["sha256"]
    assert fp == environment_fingerprint(load_profile(profile))  # same inputs, same hash
    every = [json.loads(line) for line in next(results.glob("*.jsonl")).read_text().splitlines()]
    recorded = [r["nodeid"] for r in every if r["type"] == "test"]
    assert recorded and not any("test_not_selected" in n for n in recorded)  # deselected by -k
    assert end["fingerprint_tests"] == tests_fingerprint(recorded)
    assert tests_fingerprint(["b", "a"]) == tests_fingerprint(["a", "b"]) != tests_fingerprint(["a"])


FLAKY = textwrap.dedent(
    """
    import pathlib
    import pytest

    COUNT = pathlib.Path(__file__).with_name("runs.txt")
    SETUPS = pathlib.Path(__file__).with_name("setups.txt")

    @pytest.fixture
    def fresh():
        with SETUPS.open("a") as fh:
            fh.write("x")
        return object()

    def test_flaky(backend, fresh):
        n = int(COUNT.read_text()) if COUNT.exists() else 0
        COUNT.write_text(str(n + 1))
        assert n % 2 == 1, f"run {n} fails"

    def test_always(backend):
        assert False

    def test_fine(backend):
        pass
    """
)


def test_flake_runs_and_a_lapsed_known_issue_in_one_session(pytester, tmp_path):
    """Failing tests re-run (``--flake-runs``) with their flake rate recorded, and an expired entry of a
    known-issues file listed without a profile: one pytest session for both."""
    pytester.makepyfile(test_suite=FLAKY + "\n\ndef test_broken(backend):\n    assert False, 'broken'\n")
    known = write(tmp_path, "known.yaml", """\
        - id: lapsed
          tests: ["*::test_broken*"]
          expires: 2021-05-01
        """)
    results = tmp_path / "results"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--backend", "cpu", "--flake-runs", "2",
                                           "--known-issues", str(known), "--results-dir", str(results), "-W", "always",
                                           timeout=600)
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed") == 3 and outcomes.get("passed") == 1, outcomes  # reruns are not reported again
    lines = [json.loads(line) for line in next(results.glob("*.jsonl")).read_text().splitlines()]
    tests = {r["test_id"].split("::")[-1].removesuffix("[ws1]"): r for r in lines if r["type"] == "test" and r["backend"] == "cpu"}
    assert tests["test_flaky"]["outcome"] == "failed"
    assert tests["test_flaky"]["extra"]["flake"] == {"runs": 3, "failed": 2, "flake_rate": 0.6667,
                                                     "outcomes": ["failed", "passed", "failed"]}
    assert (pytester.path / "setups.txt").read_text() == "xxx"  # a fresh fixture for every run
    assert tests["test_always"]["extra"]["flake"]["flake_rate"] == 1.0
    assert "flake" not in tests["test_fine"]["extra"]
    # the expired entry: a console warning, listed in the header, and its test an untracked failure again
    assert "known issue 'lapsed' expired on 2021-05-01" in result.stdout.str() + result.stderr.str()
    assert [e["id"] for e in lines[0]["extra"]["expired_known_issues"]] == ["lapsed"]
    assert tests["test_broken"]["outcome"] == "failed" and tests["test_broken"]["known_issue"] is None
    bad = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--flake-runs", "-1", timeout=600)
    assert bad.ret == pytest.ExitCode.USAGE_ERROR and "--flake-runs takes a number of re-runs" in bad.stderr.str()
