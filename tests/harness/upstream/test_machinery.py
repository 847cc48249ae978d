"""accel_harness.upstream: spec parsing, the skip table, requirements, pinned installs, the import rewrite,
sdist unpacking and how a harness-recorded session of an upstream suite is completed."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from accel_harness import upstream as up
from accel_harness.records import RecordWriter, RunHeader, make_record, read_records
from _waits import SAFETY_NET_S

pytest_plugins = ["pytester"]


# ---------------------------------------------------------------------------- specs
def test_parse_spec_index_and_path(tmp_path):
    spec = up.parse_spec("accelerate==1.15.0")
    assert (spec.kind, spec.name, spec.version, spec.label) == ("index", "accelerate", "1.15.0", "accelerate==1.15.0")
    folder = tmp_path / "tests"
    folder.mkdir()
    spec = up.parse_spec(str(folder))
    assert spec.kind == "path" and spec.path == folder.resolve()


@pytest.mark.parametrize("text, needle", [
    ("accelerate", "NAME==VERSION"),
    ("accelerate>=1.0", "NAME==VERSION"),
    ("", "NAME==VERSION"),
    ("./no/such/folder", "no such folder"),
])
def test_parse_spec_rejects_what_it_cannot_run(text, needle):
    with pytest.raises(up.UpstreamError, match=needle):
        up.parse_spec(text)


# ---------------------------------------------------------------------------- the skip table
@pytest.mark.parametrize("message, code", [
    ("test requires a GPU", "not-on-backend"),
    ("test requires a XPU", "not-on-backend"),
    ("test requires a CUDA GPU or XPU", "not-on-backend"),
    ("test requires a `mps` backend support in `torch`", "not-on-backend"),
    ("test requires a non-XPU", "not-on-backend"),
    ("test requires only a CPU", "not-on-backend"),
    ("test requires multiple XPUs", "needs-devices"),
    ("test requires multiple GPUs", "needs-devices"),
    ("test requires multiple hardware accelerators", "needs-devices"),
    ("test requires FP8 support", "unsupported-dtype"),
    ("test requires FP16 support", "unsupported-dtype"),
    ("test requires torch version >= 2.4.0", "torch-version"),
    ("test requires FSDP2 (torch >= 2.5.0)", "torch-version"),
    ("test requires the timm library", "needs-package"),
    ("test requires wandb", "needs-package"),
    ("test requires DeepSpeed", "needs-package"),
    ("could not import 'peft': No module named 'peft'", "needs-package"),
    ("Skipped: test is slow", "opt-in"),
    ("Will soon deprecate pippy", "known-limitation"),
    ("Test requires numpy version < 2.0", "needs-package"),
    ("TB doesn't support numpy 2.0", "needs-package"),
    ("something nobody wrote a rule for", "unspecified"),
])
def test_default_table_maps_unittest_style_messages(message, code):
    assert up.classify_skip(message) == code


def test_default_table_is_valid_and_every_code_is_a_harness_code():
    from accel_harness.markers import SKIP_CODES

    rules = up.load_skip_table()
    assert len(rules) >= 5 and all(rule.code in SKIP_CODES for rule in rules)


@pytest.mark.parametrize("body, needle", [
    ("rules:\n  - match: 'x'\n    code: needs-a-pony\n", "unknown reason code 'needs-a-pony'"),
    ("rules:\n  - match: '(unclosed'\n    code: opt-in\n", "bad regular expression"),
    ("rules:\n  - match: 'x'\n", "exactly the keys"),
    ("other: 1\n", "non-empty 'rules' list"),
])
def test_bad_skip_table_is_refused_with_the_rule_named(tmp_path, body, needle):
    table = tmp_path / "table.yaml"
    table.write_text(body)
    with pytest.raises(up.UpstreamError, match=needle):
        up.load_skip_table(table)


def test_first_matching_rule_wins(tmp_path):
    table = tmp_path / "t.yaml"
    table.write_text("rules:\n  - match: 'GPU'\n    code: needs-devices\n  - match: 'requires'\n    code: opt-in\n")
    rules = up.load_skip_table(table)
    assert up.classify_skip("test requires a GPU", rules) == "needs-devices"
    assert up.classify_skip("test requires tea", rules) == "opt-in"


# ---------------------------------------------------------------------------- requirements
PKG_INFO = """\
Metadata-Version: 2.1
Name: fakeproj
Version: 2.0
Requires-Dist: numpy
Provides-Extra: quality
Requires-Dist: ruff; extra == "quality"
Provides-Extra: testing
Requires-Dist: pytest>=7; extra == "testing"
Requires-Dist: parameterized; extra == "testing"
Provides-Extra: test-trackers
Requires-Dist: wandb; extra == "test-trackers"
"""


def test_test_requirements_come_from_the_testing_extra(tmp_path):
    (tmp_path / "PKG-INFO").write_text(PKG_INFO)
    assert up.test_requirements(tmp_path / "tests") == (["pytest>=7", "parameterized"], ["testing"])  # the tree's tests/
    reqs, extras = up.test_requirements(tmp_path)
    assert extras == ["testing"] and reqs == ["pytest>=7", "parameterized"]
    reqs, extras = up.test_requirements(tmp_path, ["testing", "test_trackers"])
    assert reqs == ["pytest>=7", "parameterized", "wandb"]
    with pytest.raises(up.UpstreamError, match="no extra docs"):
        up.test_requirements(tmp_path, ["docs"])
    bare = tmp_path / "a" / "b"
    bare.mkdir(parents=True)
    assert up.test_requirements(bare) == ([], [])


def _dist(name, version):
    return SimpleNamespace(metadata={"Name": name}, version=version)


def test_pinned_constraints_pin_torch_and_its_vendor_companions_only():
    dists = [_dist("torch", "2.13.0+xpu"), _dist("pytorch_triton_xpu", "3.4.0"), _dist("numpy", "2.0"),
             _dist("intel-extension-for-pytorch", "2.8.10"), _dist("torchvision", "0.28.0")]
    assert up.pinned_constraints(dists) == [
        "intel-extension-for-pytorch==2.8.10", "pytorch-triton-xpu==3.4.0", "torch==2.13.0+xpu", "torchvision==0.28.0"]


class FakePip:
    """Records pip command lines; fails the group call, and single calls for names in ``broken``."""

    def __init__(self, broken=(), import_errors=None):
        self.calls = []
        self.broken = set(broken)
        self.import_errors = import_errors or {}

    def __call__(self, cmd, **kwargs):
        self.calls.append(list(cmd))
        if cmd[1] == "-c":  # the import check after installing
            return subprocess.CompletedProcess(cmd, 0, json.dumps(self.import_errors), "")
        if "uninstall" in cmd:
            return subprocess.CompletedProcess(cmd, 0, "", "")
        reqs = [c for c in cmd[cmd.index("-c") + 2:] if not c.startswith("-")]
        bad = len(reqs) > 1 and self.broken or any(r in self.broken for r in reqs)
        return subprocess.CompletedProcess(cmd, 1 if bad else 0, "", "ERROR: Could not find a version\nresolution impossible" if bad else "")


def test_install_pins_torch_skips_what_is_there_and_isolates_a_broken_package(tmp_path):
    pip = FakePip(broken={"needs-other-torch"})
    result = up.install_requirements(["pytest", "fresh-package", "needs-other-torch"], tmp_path, runner=pip,
                                     constraints=["torch==2.13.0+cpu"])
    assert result.already == ["pytest"]  # installed here: not handed to pip, so never upgraded
    assert result.installed == ["fresh-package"]
    assert list(result.failed) == ["needs-other-torch"] and "resolution impossible" in result.failed["needs-other-torch"]
    first = pip.calls[0]
    assert first[first.index("-c") + 1] == str(tmp_path / "constraints.txt")
    assert (tmp_path / "constraints.txt").read_text() == "torch==2.13.0+cpu\n"
    assert first[-2:] == ["fresh-package", "needs-other-torch"] and "pytest" not in first
    installs = [c for c in pip.calls if "install" in c]
    assert [c[-1] for c in installs[1:]] == ["fresh-package", "needs-other-torch"]
    assert all("-c" in c for c in installs)
    check = pip.calls[-1]
    assert check[1] == "-c" and check[-1] == "fresh-package"  # what was installed is imported once


def test_a_package_that_installs_but_does_not_import_is_uninstalled_and_reported(tmp_path):
    pip = FakePip(import_errors={"accel-test-not-installed": "import accel_test_not_installed: ModuleNotFoundError: Could not import module 'BloomPreTrainedModel'"})
    result = up.install_requirements(["accel-test-not-installed", "fresh-package"], tmp_path, runner=pip, constraints=[])
    assert result.installed == ["fresh-package"]
    assert result.failed == {"accel-test-not-installed": "installed, but import accel_test_not_installed: ModuleNotFoundError: Could not import module "
                                      "'BloomPreTrainedModel'; uninstalled again"}
    assert pip.calls[-1][-4:] == ["pip", "uninstall", "-y", "accel-test-not-installed"]


def test_the_import_check_runs_for_real(tmp_path):
    (tmp_path / "brokenpkg").mkdir()
    (tmp_path / "brokenpkg" / "__init__.py").write_text("raise ImportError('needs a newer neighbour')\n")
    info = tmp_path / "broken_pkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-pkg\nVersion: 1.0\n")
    (info / "top_level.txt").write_text("brokenpkg\n")
    env = {**__import__("os").environ, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", up._IMPORT_CHECK, "pyyaml", "packaging", "broken-pkg"],
                          capture_output=True, text=True, timeout=SAFETY_NET_S, env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"broken-pkg": "import brokenpkg: ImportError: needs a newer neighbour"}


def test_install_with_everything_present_runs_no_pip(tmp_path):
    pip = FakePip()
    result = up.install_requirements(["pytest>=7"], tmp_path, runner=pip, constraints=[])
    assert pip.calls == [] and result.already == ["pytest>=7"]


# ---------------------------------------------------------------------------- rewrite
def test_rewrite_imports_replaces_the_word_only_in_code_and_config_files(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "test_a.py").write_text(
        "from accelerate import Accelerator\nimport accelerate.utils\nfrom accelerate.utils import purge_accelerate_environment\n"
        "os.environ['ACCELERATE_USE_CPU'] = '1'\ncmd = ['accelerate', 'launch']\n")
    (tmp_path / "sub" / "c.yaml").write_text("module: accelerate.test_utils\n")
    (tmp_path / "sub" / "d.json").write_text('{"x": "accelerate"}')
    (tmp_path / "notes.txt").write_text("accelerate")
    assert up.rewrite_imports(tmp_path, "accelerate", "accel") == 3
    text = (tmp_path / "test_a.py").read_text()
    assert "from accel import Accelerator" in text and "import accel.utils" in text
    assert "purge_accelerate_environment" in text and "ACCELERATE_USE_CPU" in text and "['accel', 'launch']" in text
    assert (tmp_path / "sub" / "c.yaml").read_text() == "module: accel.test_utils\n"
    assert (tmp_path / "notes.txt").read_text() == "accelerate"


# ---------------------------------------------------------------------------- sdists
def _sdist(path: Path, members: dict[str, str], top="fakeproj-2.0") -> Path:
    with tarfile.open(path, "w:gz") as tf:
        for name, text in members.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{name}" if top else name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def test_fetch_sdist_unpacks_what_pip_downloaded(tmp_path):
    source = _sdist(tmp_path / "fakeproj-2.0.tar.gz", {"PKG-INFO": PKG_INFO, "tests/test_x.py": "def test_x(): pass\n"})
    seen = []

    def runner(cmd, **kwargs):
        seen.append(cmd)
        dest = Path(cmd[cmd.index("-d") + 1])
        (dest / source.name).write_bytes(source.read_bytes())
        return subprocess.CompletedProcess(cmd, 0, "Saved", "")

    archive, root = up.fetch_sdist("fakeproj", "2.0", tmp_path / "dl", pip_args=["--index-url", "http://mirror/simple"], runner=runner)
    cmd = seen[0]
    assert cmd[3:7] == ["download", "--no-deps", "--no-binary", ":all:"] and "fakeproj==2.0" in cmd
    assert cmd[-2:] == ["--index-url", "http://mirror/simple"]
    assert root.name == "fakeproj-2.0" and up.locate_tests(root) == root / "tests"
    assert up.test_requirements(root)[0] == ["pytest>=7", "parameterized"]


def test_an_sdist_file_at_hand_is_a_suite(tmp_path):
    source = _sdist(tmp_path / "fakeproj-2.0.tar.gz", {"PKG-INFO": PKG_INFO, "tests/test_x.py": "def test_x(): pass\n"})
    spec = up.parse_spec(str(source))
    assert spec.kind == "archive" and spec.path == source.resolve()
    suite = up.prepare_suite(spec, tmp_path / "work")
    assert (suite.project, suite.version, suite.requirements) == ("fakeproj", "2.0", ["pytest>=7", "parameterized"])
    assert suite.tests_dir == tmp_path / "work" / "sdist" / "src" / "fakeproj-2.0" / "tests" and suite.source == str(source.resolve())


def test_fetch_sdist_failure_and_hostile_archive_are_clear_errors(tmp_path):
    def failing(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found for fakeproj==9.9")

    calls = []
    with pytest.raises(up.UpstreamError, match="No matching distribution found"):
        up.fetch_sdist("fakeproj", "9.9", tmp_path / "a", runner=lambda cmd, **kw: calls.append(cmd) or failing(cmd))
    assert "--no-build-isolation" in calls[0] and "--no-build-isolation" not in calls[1]  # tried both ways
    evil = _sdist(tmp_path / "evil-1.0.tar.gz", {"../../escape.py": "x = 1\n"}, top="")

    def hostile(cmd, **kwargs):
        (Path(cmd[cmd.index("-d") + 1]) / evil.name).write_bytes(evil.read_bytes())
        return subprocess.CompletedProcess(cmd, 0, "", "")

    with pytest.raises(up.UpstreamError, match="cannot unpack"):
        up.fetch_sdist("evil", "1.0", tmp_path / "b", runner=hostile)
    assert not (tmp_path / "escape.py").exists()


def test_fetch_sdist_through_pip_from_a_local_index(tmp_path):
    """The real pip path, offline: ``--no-index --find-links`` at a folder holding a tiny sdist."""
    setup = "from setuptools import setup\nsetup(name='fakeproj', version='2.0', py_modules=[])\n"
    links = tmp_path / "links"
    links.mkdir()
    _sdist(links / "fakeproj-2.0.tar.gz", {"PKG-INFO": PKG_INFO, "setup.py": setup, "tests/test_x.py": "def test_x(): pass\n"})
    archive, root = up.fetch_sdist("fakeproj", "2.0", tmp_path / "dl", pip_args=["--no-index", "--find-links", str(links)])
    assert archive.name == "fakeproj-2.0.tar.gz" and (root / "tests" / "test_x.py").is_file()


# ---------------------------------------------------------------------------- completing records
def _raw(tmp_path, records, backend="cpu", close=True):
    header = RunHeader(run_id="r1", start_time="2026-01-01T00:00:00+00:00", torch_version="2.13.0", accel_version="0.1.0",
                       backends=[backend], device_models={backend: [], "cuda": ["H100"]})
    path = tmp_path / "raw.jsonl"
    writer = RecordWriter(path, header)
    for rec in records:
        writer.write(rec)
    if close:
        writer.close()
    else:
        writer._fh.close()
    return path


UPSTREAM = {"project": "fakeproj", "version": "2.0", "against": "accel", "against_version": "0.1.0"}


def test_complete_records_sets_backend_reason_codes_and_module_errors(tmp_path):
    raw = _raw(tmp_path, [
        make_record(run_id="r1", nodeid="tests/test_a.py::T::test_ok", backend=None, outcome="passed"),
        make_record(run_id="r1", nodeid="tests/test_a.py::T::test_gpu", backend=None, outcome="skipped",
                    text=("x.py", 3, "Skipped: test requires a GPU")),
        make_record(run_id="r1", nodeid="tests/test_a.py::T::test_own", backend=None, outcome="skipped",
                    text="Skipped: [needs-package] deepspeed is not installed"),
    ])
    collection = [{"nodeid": "tests/test_b.py", "outcome": "error",
                   "text": "ImportError while importing test module\nE   ImportError: cannot import name 'X' from 'accel.utils'"}]
    block = up.complete_records(raw, tmp_path / "out.jsonl", backend="xpu", upstream=UPSTREAM, exit_code=1, collection=collection)
    assert block["status"] == "completed" and block["collection_errors"] == 1 and block["against"] == "accel"
    header, records, problems = read_records(tmp_path / "out.jsonl")
    assert not problems and not header.get("interrupted")
    assert header["backends"] == ["xpu"] and header["extra"]["upstream"]["project"] == "fakeproj"
    assert header["device_models"] == {}  # the cuda device of the raw header is not this run's
    by_id = {r["nodeid"]: r for r in records}
    assert {r["backend"] for r in records} == {"xpu"}
    assert by_id["tests/test_a.py::T::test_gpu"]["reason_code"] == "not-on-backend"
    assert by_id["tests/test_a.py::T::test_own"]["reason_code"] == "needs-package"  # a harness code is kept
    module = by_id["tests/test_b.py"]
    assert module["outcome"] == "error" and module["extra"] == {"phase": "collection"}
    assert module["signature"] == "ImportError: cannot import name 'X' from 'accel.utils'"


def test_a_suite_that_fails_at_collection_is_its_own_outcome(tmp_path):
    collection = [{"nodeid": "tests/test_a.py", "outcome": "error", "text": "E   ModuleNotFoundError: No module named 'torch.xpu.memory'"}]
    raw = _raw(tmp_path, [])
    block = up.complete_records(raw, tmp_path / "o1.jsonl", backend="cpu", upstream=UPSTREAM, exit_code=1, collection=collection)
    assert block["status"] == "collection-failed"
    # pytest stopped before the session (a broken conftest): no harness file at all
    block = up.complete_records(None, tmp_path / "o2.jsonl", backend="cpu", upstream=UPSTREAM, exit_code=4,
                                header_defaults={"torch_version": "2.13.0"})
    assert block["status"] == "collection-failed"
    header, records, _ = read_records(tmp_path / "o2.jsonl")
    assert records == [] and header["extra"]["upstream"]["status"] == "collection-failed" and header["backends"] == ["cpu"]
    block = up.complete_records(_raw(tmp_path, []), tmp_path / "o3.jsonl", backend="cpu", upstream=UPSTREAM, exit_code=5)
    assert block["status"] == "no-tests"


def test_a_killed_run_stays_marked_interrupted(tmp_path):
    raw = _raw(tmp_path, [make_record(run_id="r1", nodeid="t.py::test_a", backend=None, outcome="passed")], close=False)
    block = up.complete_records(raw, tmp_path / "out.jsonl", backend="cpu", upstream=UPSTREAM, exit_code=None)
    assert block["status"] == "interrupted"
    header, records, _ = read_records(tmp_path / "out.jsonl")
    assert header["interrupted"] and len(records) == 1


def test_junit_collection_errors(tmp_path):
    junit = tmp_path / "j.xml"
    junit.write_text(textwrap.dedent("""\
        <?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
        <testcase classname="tests" name="test_b" time="0"><error message="collection failure">E   ImportError: nope</error></testcase>
        <testcase classname="tests.test_c" name="" time="0"><skipped message="collection skipped" type="pytest.skip">could not import 'peft'</skipped></testcase>
        <testcase classname="tests.test_a.T" name="test_ok" time="0.1"/>
        <testcase classname="tests.test_a.T" name="test_bad" time="0.1"><error message="failed on setup with &quot;x&quot;">boom</error></testcase>
        </testsuite></testsuites>"""))
    assert up.junit_collection_errors(junit) == [
        {"nodeid": "tests/test_b.py", "outcome": "error", "text": "E   ImportError: nope"},
        {"nodeid": "tests/test_c.py", "outcome": "skipped", "text": "could not import 'peft'"},
    ]
    assert up.junit_collection_errors(tmp_path / "missing.xml") == []


def test_harness_records_a_unittest_suite_and_completion_maps_its_skips(pytester, tmp_path):
    """An upstream-style suite (unittest decorators, a module that does not import) through the
    harness plugin's own records, then completed."""
    pytester.makepyfile(
        test_core=textwrap.dedent("""\
            import unittest

            class T(unittest.TestCase):
                def test_ok(self):
                    self.assertEqual(1 + 1, 2)

                @unittest.skipUnless(False, "test requires multiple XPUs")
                def test_multi(self):
                    pass

                @unittest.skip("test requires the bitsandbytes library")
                def test_bnb(self):
                    pass
            """),
        test_broken="from no_such_project_xyz import thing\n\ndef test_never():\n    pass\n",
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--continue-on-collection-errors",
                                           up.harness_option("accel_results_dir", "--results-dir"), "raw",
                                           "--junitxml", "junit.xml", timeout=SAFETY_NET_S)
    assert result.ret == 1
    raws = list((pytester.path / "raw").glob("*.jsonl"))
    assert len(raws) == 1
    block = up.complete_records(raws[0], tmp_path / "out.jsonl", backend="cpu", upstream=UPSTREAM, exit_code=result.ret,
                                collection=up.junit_collection_errors(pytester.path / "junit.xml"))
    assert block["status"] == "completed" and block["collection_errors"] == 1
    _, records, _ = read_records(tmp_path / "out.jsonl")
    got = {r["nodeid"]: (r["outcome"], r["reason_code"]) for r in records}
    assert got == {
        "test_core.py::T::test_ok": ("passed", None),
        "test_core.py::T::test_multi": ("skipped", "needs-devices"),
        "test_core.py::T::test_bnb": ("skipped", "needs-package"),
        "test_broken.py": ("error", None),
    }


def test_backend_env_hides_the_other_available_backends():
    env = up.backend_env("cpu", {"cpu": None, "cuda": "CUDA_VISIBLE_DEVICES", "xpu": "ZE_AFFINITY_MASK"})
    assert env == {"ACCEL_DEVICE": "cpu", "CUDA_VISIBLE_DEVICES": "", "ZE_AFFINITY_MASK": ""}
    assert up.backend_env("cuda", {"cuda": "CUDA_VISIBLE_DEVICES"}) == {"ACCEL_DEVICE": "cuda"}


def test_harness_option_follows_the_plugin():
    assert up.harness_option("accel_results_dir", "--fallback").startswith("--")
    assert up.harness_option("accel_results_dir", "--fallback") != "--fallback"
    assert up.harness_option("no_such_dest", "--fallback") == "--fallback"
