"""accel_harness.records: device-neutral ids, failure signatures, the JSON Lines writer and reader."""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from accel_harness import records
from accel_harness.records import (
    SCHEMA,
    SCHEMA_VERSION,
    RecordWriter,
    RunHeader,
    SchemaVersionError,
    TestRecord,
    device_neutral_id,
    failure_signature,
    first_error_line,
    make_record,
    read_records,
    truncate,
)
from _waits import SAFETY_NET_S

REPO_ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------- device-neutral ids
@pytest.mark.parametrize("nodeid, backend, expected", [
    ("suites/test_a.py::test_x[cpu-ws2]", "cpu", "suites/test_a.py::test_x[ws2]"),
    ("t.py::test_y[cuda]", "cuda", "t.py::test_y"),
    ("t.py::test_z[fp16-xpu-ws4]", "xpu", "t.py::test_z[fp16-ws4]"),
    ("t.py::TestCls::test_m[hpu-ws1]", "hpu", "t.py::TestCls::test_m[ws1]"),
    ("t.py::test_plain", "cuda", "t.py::test_plain"),
    ("t.py::test_y[cuda-ws1]", "xpu", "t.py::test_y[cuda-ws1]"),  # not this backend's id
    ("t.py::test_y[cpu-cpu-ws1]", "cpu", "t.py::test_y[cpu-ws1]"),  # one occurrence only
    ("t.py::test_y[my-npu-ws2]", "my-npu", "t.py::test_y[ws2]"),  # hyphenated plug-in name
    ("t.py::test_y[cudagraph-ws1]", "cuda", "t.py::test_y[cudagraph-ws1]"),  # whole ids only
    ("t.py::test_y[cpu-ws1]", None, "t.py::test_y[cpu-ws1]"),
])
def test_device_neutral_id(nodeid, backend, expected):
    assert device_neutral_id(nodeid, backend) == expected


def test_same_test_on_two_backends_has_one_id():
    assert device_neutral_id("s/t.py::test_a[bf16-xpu-ws2]", "xpu") == \
        device_neutral_id("s/t.py::test_a[bf16-cuda-ws2]", "cuda")


# ---------------------------------------------------------------------------- signatures
def pytest_longrepr(error_lines: str, where: str = "/home/ci/work/suites/test_mem.py:41") -> str:
    """A pytest long traceback ending in the given ``E`` lines."""
    return textwrap.dedent("""\
        backend = <accel.backends.cuda.CUDABackend object at 0x7f3a9c2b1d90>

            def test_big_alloc(backend):
                device = backend.device(0)
        >       x = torch.empty(1 << 40, device=device)
        """) + error_lines + f"\n\n{where}: Error\n"


def test_two_oom_messages_with_different_sizes_share_a_signature():
    first = pytest_longrepr(
        "E       torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
        "capacity of 79.15 GiB of which 1.02 GiB is free. Process 12345 has 78.10 GiB memory in use.")
    second = pytest_longrepr(
        "E       torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB. GPU 3 has a total "
        "capacity of 39.39 GiB of which 20.50 MiB is free. Process 987 has 39.37 GiB memory in use.",
        where="/builds/other/suites/test_mem.py:57")
    signature = failure_signature(first)
    assert signature == failure_signature(second)
    assert signature == ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate <SIZE>. GPU <N> has a total "
                         "capacity of <SIZE> of which <SIZE> is free. Process <N> has <SIZE> memory in use.")


def test_first_error_line_keeps_the_raw_text():
    text = pytest_longrepr("E       RuntimeError: XPU out of memory. Tried to allocate 1.50 GiB")
    assert first_error_line(text) == "RuntimeError: XPU out of memory. Tried to allocate 1.50 GiB"


def test_assertion_with_tensor_values_on_different_devices():
    cuda = pytest_longrepr(
        "E       AssertionError: expected tensor([1.0000, 2.0000], device='cuda:0'), got "
        "tensor([1.0000, 2.5000], device='cuda:0')\n"
        "E       assert False")
    xpu = pytest_longrepr(
        "E       AssertionError: expected tensor([[3.], [4.]], device='xpu:1'), got tensor([[3.], [5.]], device='xpu:1')\n"
        "E       assert False")
    assert failure_signature(cuda) == failure_signature(xpu) == "AssertionError: expected tensor(<VALUE>), got tensor(<VALUE>)"


def test_torch_testing_mismatch_uses_the_exception_line():
    text = pytest_longrepr(
        "E       AssertionError: Tensor-likes are not close!\n"
        "E       \n"
        "E       Mismatched elements: 3 / 4 (75.0%)\n"
        "E       Greatest absolute difference: 0.5 at index (1,) (up to 1e-05 allowed)")
    assert failure_signature(text) == "AssertionError: Tensor-likes are not close!"


def test_plain_assert_rewrite():
    text = pytest_longrepr("E       assert 3 == 4\nE        +  where 3 = len([1, 2, 3])")
    assert failure_signature(text) == "assert <N> == <N>"


def test_pytest_fail_and_ansi_colours():
    text = pytest_longrepr("\x1b[1m\x1b[31mE       Failed: DID NOT RAISE <class 'ValueError'>\x1b[0m")
    assert failure_signature(text) == "Failed: DID NOT RAISE <class 'ValueError'>"


def test_paths_and_addresses_are_normalised():
    one = pytest_longrepr(
        "E       FileNotFoundError: [Errno 2] No such file or directory: "
        "'/tmp/pytest-of-ci/pytest-12/test_save0/ckpt/model.safetensors'")
    two = pytest_longrepr(
        "E       FileNotFoundError: [Errno 2] No such file or directory: "
        "'/tmp/pytest-of-vendor/pytest-3/test_save1/ckpt/model.safetensors'")
    assert failure_signature(one) == failure_signature(two) == \
        "FileNotFoundError: [Errno <N>] No such file or directory: '<PATH>'"
    addr = failure_signature("E   TypeError: cannot pickle <Foo object at 0x7f00deadbeef>")
    assert addr == "TypeError: cannot pickle <Foo object at <ADDR>>"


def test_identifiers_with_digits_are_kept():
    text = "E   RuntimeError: fp16 and float8_e4m3fn unsupported on sm_90 with xccl (code 7, 3.5s)"
    assert failure_signature(text) == "RuntimeError: fp16 and float8_e4m3fn unsupported on sm_90 with xccl (code <N>, <N>s)"


def test_chained_plain_traceback_gives_the_root_cause():
    text = textwrap.dedent("""\
        Traceback (most recent call last):
          File "/opt/venv/lib/python3.11/site-packages/accel/utils/operations.py", line 88, in gather
            dist.all_gather(out, tensor)
        RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:40211

        The above exception was the direct cause of the following exception:

        Traceback (most recent call last):
          File "/srv/ci/suites/test_ops.py", line 12, in test_gather
            gather(t)
        accel.utils.operations.DistributedOperationException: gather failed on rank 1
        """)
    assert first_error_line(text).startswith("RuntimeError: [../third_party/gloo")
    signature = failure_signature(text)
    assert signature.startswith("RuntimeError: [")
    assert "Connection closed by peer" in signature
    assert "534" not in signature and "40211" not in signature and "third_party" not in signature


def test_rank_failure_message_from_the_plugin():
    # what the plugin passes to pytest.fail(..., pytrace=False) when a rank fails
    def message(rank: int, port: int) -> str:
        return (
            f"rank {rank} of 2 failed: RuntimeError: Timed out after 30s waiting for rank {1 - rank} at port {port}\n\n"
            "Traceback (most recent call last):\n"
            f'  File "/srv/ci/harness/distributed.py", line {300 + rank}, in _run_task\n'
            "    fn(**kwargs)\n"
            f"RuntimeError: Timed out after 30s waiting for rank {1 - rank} at port {port}\n"
        )

    assert failure_signature(message(0, 29500)) == failure_signature(message(1, 41234)) == \
        "RuntimeError: Timed out after <N>s waiting for rank <N> at port <N>"


def test_message_without_an_exception_name_uses_its_first_line():
    text = "timeout: rank 1 did not finish within 120s (--dist-timeout=120)\n--- rank 0 ---\n  File x"
    assert failure_signature(text) == "timeout: rank <N> did not finish within <N>s (--dist-timeout=<N>)"


def test_signature_of_nothing():
    assert failure_signature(None) is None
    assert failure_signature("   \n") is None


def test_long_signature_is_capped():
    text = "E   ValueError: " + "word " * 500
    assert len(failure_signature(text)) <= records.SIGNATURE_LIMIT


def test_truncate_keeps_head_and_tail():
    text = "HEAD" + "x" * 20000 + "TAIL"
    cut = truncate(text, 8192)
    assert len(cut) <= 8192
    assert cut.startswith("HEAD") and cut.endswith("TAIL")
    assert "characters truncated" in cut
    assert truncate("short", 8192) == "short"
    assert truncate(None, 10) is None


# ---------------------------------------------------------------------------- records
def test_make_record_for_a_skip():
    record = make_record(run_id="r1", nodeid="s/t.py::test_a[cuda-ws1]", backend="cuda", outcome="skipped",
                         world_size=1, when="setup",
                         text=("s/t.py", 3, "Skipped: [needs-devices] test needs 2 cuda devices, 1 visible"))
    assert record.test_id == "s/t.py::test_a[ws1]"
    assert record.reason_code == "needs-devices"
    assert record.message == "test needs 2 cuda devices, 1 visible"
    assert record.signature is None and record.traceback is None


def test_make_record_for_a_failure():
    text = pytest_longrepr("E       RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB") + "y" * 20000
    record = make_record(run_id="r1", nodeid="s/t.py::test_a[cuda-ws1]", backend="cuda", outcome="failed",
                         duration=1.5, world_size=1, text=text, known_issue="pt-1")
    assert record.signature == "RuntimeError: CUDA out of memory. Tried to allocate <SIZE>"
    assert record.message == "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert len(record.traceback) <= records.TRACEBACK_LIMIT
    assert record.known_issue == "pt-1" and record.reason_code is None
    xfail = make_record(run_id="r1", nodeid="t.py::t", backend=None, outcome="xfailed", message="known bug")
    assert xfail.message == "known bug"


def test_record_rejects_bad_outcome_and_phase():
    with pytest.raises(ValueError, match="outcome"):
        TestRecord("r", "n", "n", "cpu", 1, "passd", 0.1)
    with pytest.raises(ValueError, match="when"):
        TestRecord("r", "n", "n", "cpu", 1, "passed", 0.1, when="collect")


# ---------------------------------------------------------------------------- header
class DescribedBackend:
    def __init__(self, name: str, info: dict | Exception):
        self.name = name
        self._info = info

    def describe(self):
        if isinstance(self._info, Exception):
            raise self._info
        return self._info


FAKE_ENV = {
    "accel": {"version": "9.9.9"},
    "torch": {"version": "2.7.1+xpu", "build": "XPU 20250101"},
    "python": {"version": "3.11.7"},
    "platform": {"platform": "Linux-6.8-x86_64", "host": "rig-7"},
}


def test_header_from_environment_and_backends(tmp_path):
    xpu = DescribedBackend("xpu", {
        "name": "xpu", "available": True, "device_count": 2, "comm_backend": "xccl",
        "devices": [
            {"index": 0, "name": "Intel(R) Data Center GPU Max 1550", "driver_version": "1.3.29735", "runtime_version": "SYCL 2025.0"},
            {"index": 1, "name": "Intel(R) Data Center GPU Max 1550", "driver_version": "1.3.29735", "runtime_version": "SYCL 2025.0"},
        ],
    })
    broken = DescribedBackend("hpu", RuntimeError("driver gone"))
    header = RunHeader.collect([xpu, broken], run_id="run-1", start_time="2025-01-01T00:00:00.000+00:00",
                               environment=FAKE_ENV, cwd=tmp_path, extra={"argv": ["-m", "xpu"]})
    data = header.to_dict()
    assert data["type"] == "header"
    assert (data["schema"], data["schema_version"]) == (SCHEMA, SCHEMA_VERSION)
    assert data["accel_version"] == "9.9.9"
    assert (data["torch_version"], data["torch_build"]) == ("2.7.1+xpu", "XPU 20250101")
    assert (data["python"], data["os"], data["host"]) == ("3.11.7", "Linux-6.8-x86_64", "rig-7")
    # tmp_path is no git checkout: the commit is the one of the checkout accel is imported from
    assert data["git_commit"] == records.git_commit(REPO_ROOT)
    assert data["kernel"] == platform.release()  # FAKE_ENV has no release: the running kernel
    assert data["backends"] == ["xpu", "hpu"]
    assert data["device_models"] == {"xpu": ["Intel(R) Data Center GPU Max 1550"] * 2}
    assert data["device_count"] == {"xpu": 2}
    assert data["driver_versions"] == {"xpu": "1.3.29735"}
    assert data["runtime_versions"] == {"xpu": "SYCL 2025.0"}
    assert data["comm_backends"] == {"xpu": "xccl"}
    assert data["extra"]["backend_errors"] == {"hpu": "RuntimeError: driver gone"}
    assert data["extra"]["argv"] == ["-m", "xpu"]


def test_header_with_the_real_environment_and_cpu_backend():
    from accel.backends.cpu import CPUBackend

    header = RunHeader.collect([CPUBackend()], cwd=REPO_ROOT)
    import torch

    import accel

    assert header.torch_version == torch.__version__
    assert header.accel_version == accel.__version__
    assert header.backends == ["cpu"] and header.device_count == {"cpu": 1}
    assert header.comm_backends["cpu"] == "gloo"
    assert header.run_id and header.start_time.endswith("+00:00")
    json.dumps(header.to_dict())  # JSON-ready


def test_git_commit_of_a_checkout(tmp_path):
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@e"}
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, env=env)
    (tmp_path / "f").write_text("x")
    subprocess.run(["git", "-C", str(tmp_path), "add", "f"], check=True, env=env)
    subprocess.run(["git", "-C", str(tmp_path), "commit", "-q", "-m", "m"], check=True, env=env)
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()
    assert records.git_commit(tmp_path) == head
    assert records.git_commit(tmp_path / "f") is None  # not a directory: failure means None


# ---------------------------------------------------------------------------- writer and reader
def header_for(run_id="run-1") -> RunHeader:
    return RunHeader(run_id=run_id, start_time="2025-01-01T00:00:00.000+00:00", torch_version="2.7.1",
                     backends=["cpu"])


def some_records(run_id="run-1"):
    return [
        make_record(run_id=run_id, nodeid="s/t.py::test_a[cpu-ws1]", backend="cpu", outcome="passed", duration=0.25, world_size=1),
        make_record(run_id=run_id, nodeid="s/t.py::test_b[cpu-ws2]", backend="cpu", outcome="failed", duration=1.0,
                    world_size=2, text="E   AssertionError: loss 0.731 != 0.5 (naïve check)"),
        make_record(run_id=run_id, nodeid="s/t.py::test_c[cpu-ws1]", backend="cpu", outcome="skipped", when="setup",
                    world_size=1, text="Skipped: [needs-package] test needs the deepspeed package, which is not installed"),
    ]


def test_writer_reader_round_trip(tmp_path):
    path = tmp_path / "results" / "run-1.jsonl"  # the folder is created
    written = some_records()
    with RecordWriter(path, header_for()) as writer:
        for record in written:
            writer.write(record)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 5
    assert [json.loads(line)["type"] for line in lines] == ["header", "test", "test", "test", "run_end"]
    end = json.loads(lines[-1])
    assert end["records"] == 3 and end["counts"] == {"passed": 1, "failed": 1, "skipped": 1}

    header, loaded, problems = read_records(path)
    assert problems == []
    assert header["run_id"] == "run-1" and header["torch_version"] == "2.7.1"
    assert header["interrupted"] is False
    assert header["end_time"] == end["end_time"]
    assert loaded == [r.to_dict() for r in written]
    assert loaded[1]["message"] == "AssertionError: loss 0.731 != 0.5 (naïve check)"
    assert loaded[1]["signature"] == "AssertionError: loss <N> != <N> (naïve check)"
    assert loaded[2]["reason_code"] == "needs-package"


def test_every_record_is_on_disk_before_close(tmp_path):
    path = tmp_path / "r.jsonl"
    writer = RecordWriter(path, header_for())
    for record in some_records()[:2]:
        writer.write(record)
    header, loaded, problems = read_records(path)  # read while the writer is still open
    assert len(loaded) == 2 and problems == []
    assert header["interrupted"] is True and header["end_time"] is None
    writer.close(end_time="2025-01-01T01:00:00.000+00:00")
    writer.close()  # idempotent
    assert read_records(path).header["end_time"] == "2025-01-01T01:00:00.000+00:00"
    with pytest.raises(ValueError, match="closed"):
        writer.write(some_records()[0])


def test_killed_writer_with_a_half_written_line(tmp_path):
    path = tmp_path / "r.jsonl"
    writer = RecordWriter(path, header_for())
    for record in some_records():
        writer.write(record)
    # the process dies in the middle of writing the fourth record
    half = json.dumps(some_records()[0].to_dict())[:40]
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(half)
    header, loaded, problems = read_records(path)
    assert [r["nodeid"] for r in loaded] == [r.nodeid for r in some_records()]
    assert header["interrupted"] is True
    assert len(problems) == 1
    assert problems[0].path == str(path) and problems[0].line == 5
    assert "incomplete last line" in problems[0].message
    writer._fh.close()


def test_killed_process_keeps_every_finished_record(tmp_path):
    path = tmp_path / "killed.jsonl"
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(REPO_ROOT)!r})
        from accel_harness.records import RecordWriter, RunHeader, make_record
        w = RecordWriter({str(path)!r}, RunHeader(run_id="k", start_time="t"))
        for i in range(3):
            w.write(make_record(run_id="k", nodeid=f"t.py::test_{{i}}[cpu-ws1]", backend="cpu", outcome="passed"))
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=SAFETY_NET_S)
    assert proc.returncode != 0, proc.stderr
    header, loaded, problems = read_records(path)
    assert problems == []
    assert header["interrupted"] is True
    assert [r["test_id"] for r in loaded] == [f"t.py::test_{i}[ws1]" for i in range(3)]


def test_malformed_lines_are_reported_and_the_rest_loads(tmp_path):
    path = tmp_path / "r.jsonl"
    with RecordWriter(path, header_for()) as writer:
        for record in some_records():
            writer.write(record)
    lines = path.read_text(encoding="utf-8").splitlines()
    lines.insert(2, "{not json")
    lines.insert(3, "[1, 2]")
    lines.insert(4, json.dumps({"nodeid": "x"}))
    lines.insert(5, json.dumps({"type": "test", "outcome": "passed"}))
    lines.insert(6, json.dumps({"type": "benchmark", "value": 1}))  # a future line type
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    header, loaded, problems = read_records(path)
    assert len(loaded) == 3 and header["interrupted"] is False
    assert [p.line for p in problems] == [3, 4, 5, 6]
    assert "not valid JSON" in problems[0].message
    assert "JSON object" in problems[1].message
    assert "type" in problems[2].message
    assert "nodeid" in problems[3].message


def test_empty_file(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    header, loaded, problems = read_records(path)
    assert header is None and loaded == []
    assert problems == [(str(path), 1, "empty file: no run header", "unreadable")]


def test_unknown_major_version_is_refused(tmp_path):
    path = tmp_path / "future.jsonl"
    path.write_text(json.dumps({"type": "header", "schema": SCHEMA, "schema_version": "2.0", "run_id": "x"}) + "\n")
    with pytest.raises(SchemaVersionError) as info:
        read_records(path)
    assert str(info.value) == f"results file {path} has schema version 2.0; this accel reads 1.x"
    assert isinstance(info.value, ValueError)


def test_newer_minor_version_and_unknown_fields_load(tmp_path):
    path = tmp_path / "minor.jsonl"
    lines = [
        {"type": "header", "schema": SCHEMA, "schema_version": "1.7", "run_id": "x", "new_field": 1},
        {"type": "test", "run_id": "x", "nodeid": "t.py::a", "outcome": "passed", "flakiness": 0.1},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    header, loaded, problems = read_records(path)
    assert header["schema_version"] == "1.7" and loaded[0]["flakiness"] == 0.1
    assert [p.message for p in problems] == []


def test_another_schema_is_refused(tmp_path):
    path = tmp_path / "other.jsonl"
    path.write_text(json.dumps({"type": "header", "schema": "somebody.else", "schema_version": "1.0"}) + "\n")
    with pytest.raises(SchemaVersionError, match="somebody.else"):
        read_records(path)


def test_values_json_cannot_hold(tmp_path):
    path = tmp_path / "r.jsonl"
    with RecordWriter(path, header_for()) as writer:
        writer.write(TestRecord("run-1", "t.py::a", "t.py::a", "cpu", 1, "passed", math.nan,
                                extra={"path": Path("/x"), "inf": math.inf, "set": {3}}))
    text = path.read_text(encoding="utf-8")
    assert "NaN" not in text and "Infinity" not in text
    record = read_records(path).records[0]
    assert record["duration"] is None
    assert record["extra"] == {"path": "/x", "inf": None, "set": [3]}


def test_fsync_every_n_records(tmp_path, monkeypatch):
    calls = []
    real = os.fsync
    monkeypatch.setattr(records.os, "fsync", lambda fd: (calls.append(fd), real(fd)))
    writer = RecordWriter(tmp_path / "r.jsonl", header_for(), fsync_every=2)
    after_header = len(calls)
    for _ in range(5):
        writer.write(some_records()[0])
    assert len(calls) - after_header == 2  # after records 2 and 4
    writer.close()
    assert len(calls) - after_header == 3  # and at close


def test_header_mapping_needs_a_run_id(tmp_path):
    with pytest.raises(ValueError, match="run_id"):
        RecordWriter(tmp_path / "r.jsonl", {"start_time": "t"})
    writer = RecordWriter(tmp_path / "ok.jsonl", {"run_id": "m"})
    writer.write({"nodeid": "t.py::a", "outcome": "passed"})
    writer.close()
    header, loaded, _ = read_records(tmp_path / "ok.jsonl")
    assert header["schema"] == SCHEMA and loaded[0]["run_id"] == "m" and loaded[0]["type"] == "test"


def test_second_header_is_reported(tmp_path):
    path = tmp_path / "twice.jsonl"
    with RecordWriter(path, header_for("a")) as writer:
        writer.write(some_records("a")[0])
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(header_for("b").to_dict()) + "\n")
    header, loaded, problems = read_records(path)
    assert header["run_id"] == "a"
    assert len(problems) == 1 and problems[0].line == 4 and "second run header" in problems[0].message


def test_run_ids_are_unique_and_times_are_utc():
    assert records.new_run_id() != records.new_run_id()
    assert records.utc_now().endswith("+00:00")


def test_records_module_does_not_import_torch():
    code = f"import sys; sys.path.insert(0, {str(REPO_ROOT)!r}); import accel_harness.records, accel_harness.known_issues; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=SAFETY_NET_S, check=True)
    assert out.stdout.strip() == "False"


def test_accel_commit_falls_back_to_the_package_checkout_then_the_wheel(tmp_path, monkeypatch):
    head = records.git_commit(REPO_ROOT)
    assert head and records.accel_commit(tmp_path) == head  # cwd is no checkout; accel's own is
    # an installed wheel (no checkout next to the package): PEP 610 direct_url.json's commit
    monkeypatch.setattr(records, "git_commit", lambda cwd=None: None)
    commit = "ab" * 20

    class Dist:
        def __init__(self, text):
            self.text = text

        def read_text(self, name):
            assert name == "direct_url.json"
            return self.text

    import importlib.metadata as metadata

    monkeypatch.setattr(metadata, "distribution", lambda name: Dist(json.dumps({"url": "git+https://x/accel",
                                                                                   "vcs_info": {"vcs": "git", "commit_id": commit}})))
    assert records.accel_commit(tmp_path) == commit
    monkeypatch.setattr(metadata, "distribution", lambda name: Dist(json.dumps({"url": "file:///x", "dir_info": {}})))
    assert records.accel_commit(tmp_path) is None  # a local install records no commit: None, not a guess
    monkeypatch.setattr(metadata, "distribution", lambda name: Dist("{not json"))
    assert records.accel_commit(tmp_path) is None


def test_header_carries_the_kernel_release():
    header = RunHeader.collect([], run_id="x", environment={"platform": {"platform": "Linux-6.8", "release": "6.8.0-45-generic"}}, cwd="/")
    assert header.kernel == "6.8.0-45-generic" and header.to_dict()["kernel"] == "6.8.0-45-generic"


def test_simple_namespace_backend_is_enough_for_the_header():
    backend = SimpleNamespace(name="cpu", describe=lambda: {"device_count": 1, "devices": [{"name": "EPYC"}]})
    header = RunHeader.collect([backend], run_id="x", environment={}, cwd="/")
    assert header.device_models == {"cpu": ["EPYC"]} and header.accel_version is None


def test_tb_line_style_location_prefix_is_dropped():
    one = "/home/ci/suites/test_ops.py:41: AssertionError: sums differ by 0.25"
    two = "C:\\ci\\suites\\test_ops.py:57: AssertionError: sums differ by 0.5"
    assert first_error_line(one) == "AssertionError: sums differ by 0.25"
    assert failure_signature(one) == failure_signature(two) == "AssertionError: sums differ by <N>"
