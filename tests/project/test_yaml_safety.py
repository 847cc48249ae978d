"""Every YAML file accel reads goes through accel.facts.yaml_safe: anchor bombs, recursive aliases and
oversized files are refused before anything is built, with a short message naming the file and the line.

The anchor-bomb loads run in a subprocess whose address space may grow by at most 1 GiB past what its
imports mapped, so a reader that expands the bomb ends in MemoryError there instead of taking the host.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from _waits import SAFETY_NET_S

from accel.facts import yaml_safe

ROOT = Path(__file__).resolve().parents[2]

#: kind -> (import, call on ``path``, the error it raises)
READERS = {
    "profile": ("from accel.backends.profile import load_profile", "load_profile(path)", "ProfileError"),
    "known-issues": ("from accel_harness.known_issues import load_known_issues", "load_known_issues(path)",
                     "KnownIssuesError"),
    "config": ("from accel.launch.config_file import load_config", "load_config(path)", "ConfigError"),
    "config-update": ("import argparse; from accel.commands.config.update import update_config",
                      "update_config(argparse.Namespace(config_file=str(path)))", "ConfigError"),
    "to-fsdp2": ("from accel.commands.to_fsdp2 import load_config", "load_config(str(path))", "YamlError"),
    "skip-table": ("from accel_harness.upstream.skips import load_skip_table", "load_skip_table(path)", "UpstreamError"),
    "matrix": ("from ci.matrix import load_matrix", "load_matrix(path)", "MatrixError"),
}


def _bomb(indent: str, levels: int = 9) -> str:
    """A block sequence of anchored lists, each holding nine aliases of the one before (9**9 strings)."""
    items = [f"{indent}- &a0 [{', '.join(['lol'] * 9)}]"]
    items += [f"{indent}- &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(items) + "\n"


#: kind -> (text before the bomb, the bomb's indentation); the bomb sits where each reader prints a value
PLACES = {
    "profile": ("device:\n  name: bombdev\n  device_type: cpu\nknown_issues:\n", "  "),
    "known-issues": ("issues:\n  - id: fine\n    error: boom\n  -\n", "    "),
    "config": ("compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nfsdp_config:\n", "  "),
    "skip-table": ("rules:\n  -\n", "    "),
    "matrix": ("version: 1\ndefaults:\n  python: [\"3.11\"]\nbackends:\n  cpu:\n    world_sizes:\n", "      "),
}
PLACES["config-update"] = PLACES["to-fsdp2"] = PLACES["config"]


def _bomb_file(tmp_path: Path, kind: str) -> tuple[Path, int]:
    """The bomb for ``kind`` and the line of the list whose aliases pass the default ``max_alias_nodes``."""
    head, indent = PLACES[kind]
    path = tmp_path / f"{kind}.yaml"
    path.write_text(head + _bomb(indent), encoding="utf-8")
    # a0..a4 add 74,718 nodes; the first alias of a4 in a5 adds 66,430 more
    return path, head.count("\n") + 6


_RUNNER = """
import json, resource, sys, time
from pathlib import Path
path = Path(sys.argv[1])
{imports}
def vm_bytes():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
hard = resource.getrlimit(resource.RLIMIT_AS)[1]
limit = vm_bytes() + (1 << 30)
resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
try:
    {call}
    error, message = "none", ""
except BaseException as exc:
    error, message = type(exc).__name__, str(exc)[:4000]
print(json.dumps({{"error": error, "message": message, "seconds": time.perf_counter() - start,
                  "rss_growth_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss}}))
"""


def _load_bounded(kind: str, path: Path) -> dict:
    imports, call, _ = READERS[kind]
    code = _RUNNER.format(imports=imports, call=call)
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, cwd=ROOT,
                          timeout=SAFETY_NET_S)
    assert proc.returncode == 0 and proc.stdout.strip(), f"rc {proc.returncode}: {proc.stderr[-2000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _load(kind: str, path: Path) -> None:
    imports, call, _ = READERS[kind]
    scope: dict = {"path": path}
    exec(imports, scope)
    eval(call, scope)


def _error(kind: str, path: Path) -> Exception:
    with pytest.raises(Exception) as info:
        _load(kind, path)
    assert type(info.value).__name__ == READERS[kind][2], repr(info.value)
    return info.value


@pytest.fixture
def limits():
    """Whatever a test changes with yaml_safe.set_limits is undone after it."""
    previous = yaml_safe.get_limits()
    yield yaml_safe.set_limits
    yaml_safe.set_limits(**{name: getattr(previous, name) for name in ("max_bytes", "max_aliases", "max_alias_nodes")})


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/status and RLIMIT_AS are Linux's")
@pytest.mark.parametrize("kind", sorted(READERS))
def test_an_anchor_bomb_is_refused_at_once_in_bounded_memory(tmp_path, kind):
    path, line = _bomb_file(tmp_path, kind)
    result = _load_bounded(kind, path)
    assert result["error"] == READERS[kind][2], result
    message = result["message"]
    assert "max_alias_nodes" in message and "refused before expanding them" in message, message
    assert str(path) in message and f"line {line}" in message, message
    assert len(message) < 400, message
    assert result["seconds"] < 5, result
    assert result["rss_growth_kib"] < 64 * 1024, result


@pytest.mark.parametrize("kind", sorted(READERS))
def test_an_oversized_file_is_refused_before_it_is_read(tmp_path, kind):
    path = tmp_path / f"{kind}.yaml"
    with open(path, "wb") as handle:
        handle.truncate(16 * 1024 * 1024 + 1)  # sparse: no disk, and nothing worth reading
    message = str(_error(kind, path))
    assert "16,777,217 bytes, over the limit of 16,777,216" in message and "max_bytes" in message, message
    assert str(path) in message and len(message) < 400, message


BENIGN = {
    "profile": """\
        device: {name: aliasdev, device_type: cpu}
        capabilities: {dtypes: &dtypes [fp32, bf16], autocast: *dtypes}
        tolerances:
          bf16: &tol {training: 0.05}
          fp16: *tol
        """,
    "known-issues": """\
        issues:
          - &base {id: first, backends: [cpu], tests: &tests ["suites/test_a.py::test_*"], xfail: true}
          - {<<: *base, id: second, tests: *tests}
        """,
    "config": """\
        compute_environment: LOCAL_MACHINE
        distributed_type: MULTI_CPU
        num_processes: &two 2
        num_machines: 1
        num_processes: *two
        """,
    "skip-table": """\
        rules:
          - &rule {match: "needs a GPU", code: needs-devices}
          - {<<: *rule, match: "requires CUDA"}
        """,
    "matrix": """\
        version: 1
        defaults: {python: ["3.11"], bench: quick}
        backends:
          cpu: {runner: &linux [ubuntu-latest], comm: gloo, world_sizes: &sizes [1, 2]}
          emu: {runner: *linux, comm: gloo, world_sizes: *sizes}
        torch:
          "2.13.0": {install: {"*": {index_url: "https://download.pytorch.org/whl/cpu"}}}
        """,
}
BENIGN["config-update"] = BENIGN["to-fsdp2"] = BENIGN["config"]


@pytest.mark.parametrize("kind", sorted(READERS))
def test_a_file_with_a_few_aliases_still_loads(tmp_path, kind):
    path = tmp_path / f"{kind}.yaml"
    text = textwrap.dedent(BENIGN[kind])
    path.write_text(text, encoding="utf-8")
    _load(kind, path)
    assert yaml_safe.load(text) == yaml.safe_load(text)
    if kind == "profile":
        from accel.backends.profile import load_profile

        profile = load_profile(path)
        assert profile.capabilities["autocast"] == ["fp32", "bf16"] and profile.tolerance("fp16", "training")["rtol"] == 0.05
    elif kind == "known-issues":
        from accel_harness.known_issues import load_known_issues

        second = load_known_issues(path).get("second")
        assert second.backends == ("cpu",) and second.xfail and second.tests == ("suites/test_a.py::test_*",)


#: kind -> a file whose error quotes a value of 20,000 items
BIG_VALUES = {
    "profile": "device: [{items}]\n",
    "known-issues": "issues:\n  - [{items}]\n",
    "config": "compute_environment: LOCAL_MACHINE\nfsdp_config: [{items}]\n",
    "skip-table": "rules:\n  - [{items}]\n",
}


@pytest.mark.parametrize("kind", sorted(BIG_VALUES))
def test_error_messages_quote_a_short_prefix_of_a_value(tmp_path, kind):
    path = tmp_path / f"{kind}.yaml"
    path.write_text(BIG_VALUES[kind].format(items=", ".join(["word"] * 20_000)), encoding="utf-8")
    message = str(_error(kind, path))
    assert "['word', 'word'," in message and "..." in message, message
    assert len(message) < 400, message


RECURSIVE = {
    "profile": "device: {name: d, device_type: cpu}\nknown_issues: &loop\n  - *loop\n",
    "known-issues": "issues: &loop\n  - *loop\n",
    "config": "compute_environment: LOCAL_MACHINE\nfsdp_config: &loop\n  - *loop\n",
    "skip-table": "rules: &loop\n  - *loop\n",
}


@pytest.mark.parametrize("kind", sorted(RECURSIVE))
def test_an_alias_inside_the_node_it_names_is_refused(tmp_path, kind):
    path = tmp_path / f"{kind}.yaml"
    path.write_text(RECURSIVE[kind], encoding="utf-8")
    message = str(_error(kind, path))
    assert "recursive structure" in message and "line" in message and str(path) in message, message


def test_a_profile_error_under_an_alias_names_the_line_where_the_alias_is_used(tmp_path):
    from accel.backends.profile import ProfileError, load_profile

    path = tmp_path / "alias.yaml"
    path.write_text("device: {name: d, device_type: cpu}\n"
                    "capabilities: &caps\n"
                    "  collectives: true\n"           # line 3: valid here
                    "tolerances:\n"
                    "  bf16: *caps\n", encoding="utf-8")  # line 5: not a tolerance
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    assert info.value.key == "tolerances.bf16.collectives" and info.value.line == 5, str(info.value)


def test_the_line_map_does_not_enter_aliases(limits):
    limits(max_alias_nodes=10_000_000)
    root = yaml_safe.compose("lists:\n" + _bomb("  ", levels=7))  # about 6 million nodes once expanded
    lines = yaml_safe.key_lines(root)
    assert lines[("lists",)] == 1 and lines[("lists", 6)] == 8 and ("lists", 6, 0) not in lines
    assert len(lines) == 2 + 7 + 9, sorted(lines)  # the root, the key, seven lists, a0's nine strings


def test_alias_count_and_size_limits_are_settable(tmp_path, limits):
    path = tmp_path / "aliases.yaml"
    path.write_text("base: &b [1, 2]\nuses: [*b, *b, *b]\n", encoding="utf-8")
    assert yaml_safe.read(path) == {"base": [1, 2], "uses": [[1, 2]] * 3}
    limits(max_aliases=2)
    with pytest.raises(yaml_safe.YamlError, match=r"aliases.yaml, line 2: more than 2 aliases \(max_aliases\)"):
        yaml_safe.read(path)
    limits(max_aliases=10, max_alias_nodes=8)
    with pytest.raises(yaml_safe.YamlError, match=r"more than 8 nodes once expanded \(max_alias_nodes"):
        yaml_safe.read(path)
    limits(max_alias_nodes=9, max_bytes=10)
    with pytest.raises(yaml_safe.YamlError, match="over the limit of 10 for a YAML file") as info:
        yaml_safe.read(path)
    assert info.value.refused and info.value.line is None
    with pytest.raises(ValueError, match="max_bytes must be a whole number"):
        limits(max_bytes=-1)


def test_the_pure_python_parser_is_used_without_libyaml_and_refuses_the_same(monkeypatch):
    assert yaml_safe.parser_class() is (yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader)
    monkeypatch.setattr(yaml_safe, "parser_class", lambda: yaml.SafeLoader)
    with pytest.raises(yaml_safe.YamlError, match="line 7: aliases would add more than 100,000 nodes") as info:
        yaml_safe.load("lists:\n" + _bomb("  "), "bomb.yaml")
    assert info.value.refused and str(info.value).startswith("bomb.yaml, line 7: ")
    with pytest.raises(yaml_safe.YamlError, match="nested too deeply"):
        # deeper than the recursion limit allows, whatever an earlier test in this process raised it to
        # (torch's compiler raises it: 600 levels then parsed)
        depth = 2 * sys.getrecursionlimit()
        yaml_safe.load("[" * depth + "]" * depth)
    text = textwrap.dedent(BENIGN["known-issues"])
    assert yaml_safe.load(text) == yaml.safe_load(text)


def test_syntax_errors_keep_their_line_and_are_not_refusals():
    with pytest.raises(yaml_safe.YamlError) as info:
        yaml_safe.load("a: 1\nb: [1, 2\nc: 3\n", "broken.yaml")
    assert not info.value.refused and info.value.line == 3 and str(info.value).startswith("broken.yaml, line 3: ")


@pytest.mark.parametrize("value", [None, 3, "text", [1, "a", {"k": (1,)}], {"a": [1, 2]}, (), (1,), [], {}])
def test_preview_is_repr_for_short_values(value):
    assert yaml_safe.preview(value) == repr(value)


def test_preview_cuts_long_values_without_writing_them_whole():
    shared: list = ["x" * 10]
    for _ in range(40):  # 2**40 strings once written out
        shared = [shared, shared]
    text = yaml_safe.preview(shared, 60)
    assert text.startswith("[[[[") and text.endswith("...") and len(text) == 63
    assert yaml_safe.preview("y" * 10_000, 20) == "'" + "y" * 19 + "..."
