"""ci/matrix.py: expansion into cells, exclusions, filters, profiles, and broken matrix files."""

from __future__ import annotations

import pytest

from _ci_data import SMALL_MATRIX, line_of, write

from ci.matrix import DEFAULT_MATRIX, MatrixError, load_matrix, version_matches


# ---------------------------------------------------------------------------- the project's matrix
def test_project_matrix_expands_to_the_documented_cells():
    matrix = load_matrix()
    ids = [c.id for c in matrix.cells()]
    assert ids == [
        "cpu-torch2.13.0-py3.11", "cpu-torch2.13.0-py3.12", "cpu-torch2.14.1-py3.11", "cpu-torch2.14.1-py3.12",
        "emu-torch2.13.0-py3.11", "emu-torch2.14.1-py3.11",
        "cuda-torch2.13.0-py3.11", "cuda-torch2.14.1-py3.11",
        "xpu-torch2.13.0-py3.11", "xpu-torch2.14.1-py3.11",
        "hpu-torch2.13.0-py3.11",
        "mps-torch2.13.0-py3.11", "mps-torch2.14.1-py3.11",
    ]
    everything = matrix.cells(include_disabled=True)
    assert len(everything) == 18 and not any(c.id.startswith(("hpu-torchnightly", "emu-torchnightly")) for c in everything)
    assert {c.id for c in everything} - set(ids) == {
        "cpu-torchnightly-py3.11", "cpu-torchnightly-py3.12", "cuda-torchnightly-py3.11",
        "xpu-torchnightly-py3.11", "mps-torchnightly-py3.11"}


def test_project_matrix_cells_carry_runner_install_and_world_sizes():
    matrix = load_matrix()
    cells = {c.id: c for c in matrix.cells(include_disabled=True)}
    cpu = cells["cpu-torch2.13.0-py3.11"]
    assert cpu.runner == ("ubuntu-latest",) and cpu.world_sizes == (1, 2, 4) and cpu.bench == "quick"
    assert cpu.install.requirement == "torch==2.13.0" and cpu.install.index_url == "https://download.pytorch.org/whl/cpu"
    assert cpu.expected_torch == "2.13.0"
    assert cells["cpu-torch2.14.1-py3.12"].world_sizes == (1, 2)  # exclusion drops 4 ranks on 3.12
    assert cells["cpu-torch2.14.1-py3.12"].removed_world_sizes == (4,)
    assert cells["cuda-torch2.14.1-py3.11"].runner == ("self-hosted", "linux", "gpu-nvidia")
    emu = cells["emu-torch2.13.0-py3.11"]  # the emulated device: an ordinary runner, its plug-in installed after accel
    assert emu.runner == ("ubuntu-latest",) and emu.plugins == ("plugins/accel-emu",) and emu.comm == "emu_ccl"
    assert emu.to_dict()["plugins"] == ["plugins/accel-emu"] and cpu.plugins == ()
    # the full operator sweep runs on the emulated device and on the host swept as a device, nowhere else
    assert {c.backend for c in cells.values() if c.ops == "full"} == {"cpu", "emu"}
    assert {c.ops for c in cells.values() if c.backend not in ("cpu", "emu")} == {"off"}
    assert cpu.to_dict()["ops"] == "full" and "ops" not in cpu.github()
    assert "cu" in cells["cuda-torch2.14.1-py3.11"].install.index_url
    hpu = cells["hpu-torch2.13.0-py3.11"]
    assert hpu.install.preinstalled and hpu.setup_python is False and hpu.expected_torch == "2.13.0"
    assert all(c.world_sizes == (1,) for c in cells.values() if c.backend == "mps")
    nightly = cells["cpu-torchnightly-py3.11"]
    assert nightly.install.pre and nightly.install.requirement == "torch" and nightly.expected_torch is None
    assert not nightly.enabled


def test_local_profile_installs_from_pip_configuration():
    matrix = load_matrix()
    cell = matrix.cell("cpu-torch2.14.1-py3.11", profile="local")
    assert cell.install.requirement == "torch==2.14.1" and cell.install.index_url is None
    assert cell.install.profile == "local" and cell.install.pip_options() == []
    assert matrix.cell("hpu-torch2.13.0-py3.11", profile="local").install.preinstalled  # vendor image stays
    with pytest.raises(MatrixError, match=r"unknown install profile 'locl' \(did you mean 'local'\?\)"):
        matrix.cell("cpu-torch2.13.0-py3.11", profile="locl")
    with pytest.raises(MatrixError, match="'nightly' is not a version number"):
        matrix.cell("cpu-torchnightly-py3.11", profile="local")


# ---------------------------------------------------------------------------- expansion
def test_expansion_count_ids_and_order(tmp_path):
    matrix = load_matrix(write(tmp_path, SMALL_MATRIX))
    assert [c.id for c in matrix.cells()] == [
        "cpu-torch2.13.0-py3.11", "cpu-torch2.13.0-py3.12", "cpu-torch2.14.1-py3.11", "cpu-torch2.14.1-py3.12",
        "cuda-torch2.13.0-py3.11", "cuda-torch2.14.1-py3.11", "hpu-torch2.13.0-py3.11"]
    assert len(matrix.cells(include_disabled=True)) == 7 + 3  # cpu x2 and cuda nightly; hpu nightly excluded


def test_defaults_and_backend_settings_merge(tmp_path):
    cells = {c.id: c for c in load_matrix(write(tmp_path, SMALL_MATRIX)).cells()}
    assert cells["cpu-torch2.13.0-py3.11"].bench == "quick"  # from defaults
    assert cells["cuda-torch2.13.0-py3.11"].bench == "full"  # backend overrides defaults
    assert cells["cuda-torch2.13.0-py3.11"].python == "3.11" and cells["cuda-torch2.13.0-py3.11"].workers == 0
    assert cells["cpu-torch2.13.0-py3.11"].workers == 2
    # "*" install for backends not named; a backend's own entry wins
    assert cells["cpu-torch2.14.1-py3.11"].install.index_url.endswith("/whl/cpu")
    assert cells["cuda-torch2.13.0-py3.11"].install.index_url.endswith("/whl/cu130")


def test_exclusions_remove_cells_or_world_sizes(tmp_path):
    matrix = load_matrix(write(tmp_path, SMALL_MATRIX))
    ids = {c.id for c in matrix.cells(include_disabled=True)}
    assert "hpu-torch2.14.1-py3.11" not in ids and "hpu-torchnightly-py3.11" not in ids
    cells = {c.id: c for c in matrix.cells()}
    assert cells["cpu-torch2.13.0-py3.12"].world_sizes == (1, 2)
    assert cells["cpu-torch2.13.0-py3.11"].world_sizes == (1, 2, 4)
    with pytest.raises(MatrixError, match=r"cell 'hpu-torch2.14.1-py3.11' is excluded by exclude\[0\].*image ships 2.13.0"):
        matrix.cell("hpu-torch2.14.1-py3.11")


def test_filters_only_torch_python_and_unknown_names(tmp_path):
    matrix = load_matrix(write(tmp_path, SMALL_MATRIX))
    assert {c.backend for c in matrix.cells(only=["cpu"])} == {"cpu"}
    assert [c.id for c in matrix.cells(only=["cuda,hpu"], torch=["2.13.0"])] == ["cuda-torch2.13.0-py3.11", "hpu-torch2.13.0-py3.11"]
    assert [c.id for c in matrix.cells(python=["3.12"])] == ["cpu-torch2.13.0-py3.12", "cpu-torch2.14.1-py3.12"]
    assert len(matrix.cells(only=[""], torch=[""])) == 7  # empty filter values (workflow inputs) mean no filter
    assert matrix.cells(only=["hpu"], torch=["2.14.1"]) == []
    with pytest.raises(MatrixError, match=r"--only: unknown backend 'cdua' \(did you mean 'cuda'\?\)"):
        matrix.cells(only=["cdua"])
    with pytest.raises(MatrixError, match=r"--torch: unknown torch version '2.13'"):
        matrix.cells(torch=["2.13"])


def test_unknown_cell_lists_the_known_ones(tmp_path):
    matrix = load_matrix(write(tmp_path, SMALL_MATRIX))
    with pytest.raises(MatrixError) as info:
        matrix.cell("cpu-torch2.13-py3.11")
    message = str(info.value)
    assert "did you mean 'cpu-torch2.13.0-py3.11'" in message
    assert "cpu-torch2.14.1-py3.12" in message and "hpu-torch2.13.0-py3.11" in message


def test_disabled_torch_cells_are_runnable_by_id(tmp_path):
    cell = load_matrix(write(tmp_path, SMALL_MATRIX)).cell("cuda-torchnightly-py3.11")
    assert not cell.enabled and cell.install.pip_options() == ["--index-url", "https://download.pytorch.org/whl/nightly/cpu", "--pre"]


def test_github_entry_shape(tmp_path):
    cell = load_matrix(write(tmp_path, SMALL_MATRIX)).cell("hpu-torch2.13.0-py3.11")
    assert cell.github() == {"id": "hpu-torch2.13.0-py3.11", "backend": "hpu", "torch": "2.13.0", "python": "3.11",
                             "runner": ["self-hosted", "gaudi"], "setup_python": False, "timeout_minutes": 120}


def test_unquoted_python_versions_keep_their_text(tmp_path):
    text = SMALL_MATRIX.replace('python: ["3.11", "3.12"]', "python: [3.10, 3.12]")
    ids = [c.id for c in load_matrix(write(tmp_path, text)).cells(only=["cpu"], torch=["2.13.0"])]
    assert ids == ["cpu-torch2.13.0-py3.10", "cpu-torch2.13.0-py3.12"]  # not py3.1


@pytest.mark.parametrize("installed, expected, ok", [
    ("2.13.0+cpu", "2.13.0", True), ("2.13.0", "2.13.0", True), ("2.13.1+cpu", "2.13.0", False),
    ("2.14.1", "2.13.0", False), ("2.13.0+cu130", "2.13.0+cpu", False), ("2.15.0.dev20250101+cpu", None, True),
])
def test_version_matches(installed, expected, ok):
    assert version_matches(installed, expected) is ok


def test_ops_defaults_to_off_and_merges_like_bench(tmp_path):
    cells = {c.id: c for c in load_matrix(write(tmp_path, SMALL_MATRIX)).cells()}
    assert {c.ops for c in cells.values()} == {"off"}  # a matrix without the key sweeps nothing
    text = SMALL_MATRIX.replace("  bench: quick\n", "  bench: quick\n  ops: quick\n").replace(
        "    bench: full\n", "    bench: full\n    ops: full\n")
    cells = {c.id: c for c in load_matrix(write(tmp_path, text)).cells()}
    assert cells["cpu-torch2.13.0-py3.11"].ops == "quick"  # from defaults
    assert cells["cuda-torch2.13.0-py3.11"].ops == "full"  # the backend's own
    assert cells["hpu-torch2.13.0-py3.11"].to_dict()["ops"] == "quick"


@pytest.mark.parametrize("written", ["off", '"off"', "'off'"])
def test_unquoted_off_is_off_for_ops_and_bench(tmp_path, written):
    text = SMALL_MATRIX.replace("  bench: quick\n", f"  bench: {written}\n  ops: {written}\n")
    cell = load_matrix(write(tmp_path, text)).cell("cpu-torch2.13.0-py3.11")
    assert (cell.ops, cell.bench) == ("off", "off")


@pytest.mark.parametrize("value, words", [
    ("fast", "expected one of off, quick, full, got 'fast'"),
    ("ful", "got 'ful' (did you mean 'full'?)"),
    ("true", "expected one of off, quick, full, got True"),
    ("[full]", "expected one of off, quick, full, got ['full']"),
])
def test_bad_ops_values_name_the_file_line_and_key(tmp_path, value, words):
    text = SMALL_MATRIX.replace("    workers: 2\n", f"    workers: 2\n    ops: {value}\n")
    err = error_for(tmp_path, text)
    assert err.key == "backends.cpu.ops" and err.line == line_of(text, f"ops: {value}")
    assert words in str(err)
    text = SMALL_MATRIX.replace("  bench: quick\n", f"  bench: quick\n  ops: {value}\n")
    err = error_for(tmp_path, text)
    assert err.key == "defaults.ops" and err.line == line_of(text, f"ops: {value}") and words in str(err)


def test_a_mistyped_ops_key_suggests_it(tmp_path):
    text = SMALL_MATRIX.replace("    workers: 2\n", "    workers: 2\n    opps: full\n")
    err = error_for(tmp_path, text)
    assert err.key == "backends.cpu.opps" and "did you mean 'ops'" in str(err) and err.line == line_of(text, "opps: full")


# ---------------------------------------------------------------------------- broken files
def error_for(tmp_path, text: str) -> MatrixError:
    path = write(tmp_path, text)
    with pytest.raises(MatrixError) as info:
        load_matrix(path)
    assert str(path) in str(info.value)
    return info.value


def test_yaml_syntax_error_names_the_line(tmp_path):
    text = SMALL_MATRIX.replace("    runner: [ubuntu-latest]\n", "    runner: [ubuntu-latest\n")
    err = error_for(tmp_path, text)
    assert "YAML syntax error" in str(err)
    assert err.line is not None and line_of(text, "runner: [ubuntu-latest") <= err.line <= line_of(text, "comm: gloo") + 1


def test_unknown_key_with_did_you_mean_and_line(tmp_path):
    text = SMALL_MATRIX.replace("    world_sizes: [1, 2, 4]", "    world_size: [1, 2, 4]")
    err = error_for(tmp_path, text)
    assert err.key == "backends.cpu.world_size" and err.line == line_of(text, "world_size: [1, 2, 4]")
    assert "did you mean 'world_sizes'" in str(err)
    err = error_for(tmp_path, SMALL_MATRIX.replace("exclude:", "exlude:"))
    assert err.key == "exlude" and "did you mean 'exclude'" in str(err) and err.line == line_of(SMALL_MATRIX, "exclude:")


@pytest.mark.parametrize("old, new, key, words", [
    ("world_sizes: [1, 2, 4]", "world_sizes: 4", "backends.cpu.world_sizes", "expected a non-empty list"),
    ("world_sizes: [1, 2, 4]", "world_sizes: [1, two]", "backends.cpu.world_sizes[1]", "expected a whole number >= 1"),
    ("    workers: 2", "    workers: two", "backends.cpu.workers", "expected a whole number >= 0, got 'two'"),
    ("    setup_python: false", "    setup_python: nope", "backends.hpu.setup_python", "expected true or false"),
    ("  bench: quick", "  bench: fast", "defaults.bench", "expected one of off, quick, full"),
    ("    runner: [ubuntu-latest]", "    runner: {os: ubuntu}", "backends.cpu.runner", "expected a list of runner labels"),
    ("      hpu: preinstalled", "      hpu: preinstaled", 'torch."2.13.0".install.hpu', "did you mean 'preinstalled'"),
    ("    enabled: false", "    enabled: 0", "torch.nightly.enabled", "expected true or false"),
    ('python: ["3.11", "3.12"]', 'python: ["3.11", "py3.12"]', "backends.cpu.python[1]", "quoted python versions"),
])
def test_bad_types_name_the_key_and_line(tmp_path, old, new, key, words):
    assert old in SMALL_MATRIX
    text = SMALL_MATRIX.replace(old, new, 1)
    err = error_for(tmp_path, text)
    assert err.key == key, str(err)
    assert words in str(err)
    assert err.line == line_of(text, new.strip().split(":")[0] + ":") or err.line == line_of(text, new.strip())


def test_empty_and_non_mapping_files(tmp_path):
    assert "the file is empty" in str(error_for(tmp_path, ""))
    assert "the file is empty" in str(error_for(tmp_path, "# only a comment\n"))
    assert "expected a mapping" in str(error_for(tmp_path, "- cpu\n- cuda\n"))
    err = error_for(tmp_path, "version: 1\nbackends: {}\ntorch: {}\n")
    assert err.key == "backends" and "no backends defined" in str(err)


def test_missing_file_and_version(tmp_path):
    with pytest.raises(MatrixError, match="no such file"):
        load_matrix(tmp_path / "absent.yaml")
    err = error_for(tmp_path, SMALL_MATRIX.replace("version: 1", "version: 2"))
    assert err.key == "version" and err.line == 1


def test_exclusion_naming_an_unknown_backend(tmp_path):
    text = SMALL_MATRIX.replace("  - backend: hpu\n", "  - backend: hpuu\n")
    err = error_for(tmp_path, text)
    assert err.key == "exclude[0].backend" and err.line == line_of(text, "backend: hpuu")
    assert "unknown backend 'hpuu' (did you mean 'hpu'?)" in str(err)
    text = SMALL_MATRIX.replace('    torch: ["2.14.1", nightly]', '    torch: ["2.14.1", nigthly]')
    err = error_for(tmp_path, text)
    assert err.key == "exclude[0].torch[1]" and "did you mean 'nightly'" in str(err)


def test_exclusion_that_matches_nothing_or_everything(tmp_path):
    text = SMALL_MATRIX.replace("  - backend: cpu\n    python: \"3.12\"", "  - backend: cuda\n    python: \"3.12\"")
    err = error_for(tmp_path, text)
    assert err.key == "exclude[1]" and "matches no cell" in str(err)
    err = error_for(tmp_path, SMALL_MATRIX.replace("exclude:\n", "exclude:\n  - reason: everything\n"))
    assert err.key == "exclude[0]" and "matches every cell" in str(err)


def test_a_cell_without_a_torch_install_is_an_error(tmp_path):
    text = SMALL_MATRIX.replace('  "2.14.1":\n    install:\n      "*": {index_url: "https://download.pytorch.org/whl/cpu"}\n',
                                '  "2.14.1":\n    install:\n      cpu: {index_url: "https://download.pytorch.org/whl/cpu"}\n')
    err = error_for(tmp_path, text)
    assert err.key == 'torch."2.14.1".install' and "no install for backend 'cuda'" in str(err)


def test_duplicate_keys_and_single_process_backends(tmp_path):
    text = SMALL_MATRIX.replace("    comm: gloo\n", "    comm: gloo\n    comm: ccl\n")
    err = error_for(tmp_path, text)
    assert err.key == "backends.cpu.comm" and "appears twice" in str(err) and err.line == line_of(text, "comm: ccl")
    err = error_for(tmp_path, SMALL_MATRIX.replace("    comm: nccl", "    comm: none"))
    assert err.key == "backends.cuda.world_sizes" and "single process only" in str(err)


def test_nightly_without_requirement_and_unknown_install_backend(tmp_path):
    err = error_for(tmp_path, SMALL_MATRIX.replace('"*": {requirement: torch, pre: true,', '"*": {pre: true,'))
    assert err.key == 'torch.nightly.install."*"' and "'nightly' is not a version number" in str(err)
    err = error_for(tmp_path, SMALL_MATRIX.replace("      hpu: preinstalled", "      gaudi: preinstalled"))
    assert err.key == 'torch."2.13.0".install.gaudi' and "unknown backend" in str(err)


def test_unknown_suite_file(tmp_path):
    text = SMALL_MATRIX.replace("    workers: 2\n", "    workers: 2\n    suites: [test_collectives.py, test_colectives2.py]\n")
    err = error_for(tmp_path, text)
    assert err.key == "backends.cpu.suites[1]" and "no suite 'test_colectives2.py'" in str(err)
    ok = SMALL_MATRIX.replace("    workers: 2\n", "    workers: 2\n    suites: [test_collectives.py]\n")
    cell = load_matrix(write(tmp_path, ok)).cell("cpu-torch2.13.0-py3.11")
    assert cell.suites == ("test_collectives.py",)


def test_default_matrix_path_is_the_project_file():
    assert DEFAULT_MATRIX.name == "matrix.yaml" and DEFAULT_MATRIX.parent.name == "ci"
    assert load_matrix().path == DEFAULT_MATRIX


def test_a_plugin_folder_that_is_not_a_package_is_named(tmp_path):
    path = write(tmp_path, SMALL_MATRIX.replace("    comm: gloo\n", "    comm: gloo\n    plugins: [plugins/no-such-plugin]\n", 1))
    with pytest.raises(MatrixError, match="no plug-in package .* at 'plugins/no-such-plugin'"):
        load_matrix(path)
