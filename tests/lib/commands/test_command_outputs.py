"""Commands write into one documented folder when no ``-o`` is given, and the repository ignores it."""

from __future__ import annotations

import re
from pathlib import Path

from accel.commands import RESULTS_DIR, default_output

ROOT = Path(__file__).resolve().parents[3]


def test_default_outputs_are_fresh_folders_under_one_results_folder():
    path = default_output("qualify")
    assert path.parent == Path(RESULTS_DIR)
    assert re.fullmatch(r"qualify-\d{8}T\d{6}Z", path.name), path.name


def test_the_results_folder_is_ignored_by_git_and_named_by_the_commands():
    assert f"{RESULTS_DIR}/" in (ROOT / ".gitignore").read_text().splitlines()
    for command in ("qualify", "ops"):
        source = (ROOT / "accel" / "commands" / f"{command}.py").read_text()
        assert "default_output(" in source, command


def test_bench_writes_into_the_results_folder_by_default():
    from accel.commands import cli

    parser = cli.build_parser(load="bench")
    assert parser.parse_args(["bench"]).results_dir == RESULTS_DIR


def test_bench_leaves_no_benchmark_storage_folder_behind(tmp_path, monkeypatch):
    """pytest-benchmark makes its storage folder when it starts; accel bench gives it a temporary one."""
    from accel.commands import bench
    from accel.commands.cli import main

    seen = []

    def fake_call(command, **kwargs):
        storage = command[command.index("--benchmark-storage") + 1].removeprefix("file://")
        seen.append((Path(storage), Path(storage).is_dir()))
        return 5  # no benchmark matched

    monkeypatch.setattr(bench.subprocess, "call", fake_call)
    monkeypatch.chdir(tmp_path)
    main(["bench", "--backend", "cpu", "-k", "nothing", "--results-dir", str(tmp_path / "out")])
    ((storage, existed),) = seen
    assert existed and not storage.exists()
    assert not (tmp_path / ".benchmarks").exists()
