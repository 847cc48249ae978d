"""The tables of accel.facts: torch-free, importing nothing else of accel, and each one right."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from accel.facts import checkpoint, environment, network, precision, reasons, versions
from accel.facts.backends import BUILTIN_BACKENDS

ROOT = Path(__file__).resolve().parents[3]


def test_facts_import_neither_torch_nor_the_rest_of_accel():
    code = "import sys, accel.facts, accel.names; bad = [m for m in sys.modules if m == 'torch' " \
           "or (m.startswith('accel.') and not m.startswith(('accel.facts', 'accel._lazy', 'accel.names')))]; print(bad)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert out.strip() == "[]"
    for path in (ROOT / "accel" / "facts").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                assert not node.module.startswith("accel"), (path.name, node.module)
            if isinstance(node, ast.ImportFrom) and node.level > 1:
                raise AssertionError(f"{path.name} imports from outside accel.facts: {ast.unparse(node)}")


def test_builtin_backends_are_those_the_registry_registers():
    from accel.backends import get_registry
    from accel.backends.builtin import builtin_factories

    assert [factory().name for factory in builtin_factories()] == list(BUILTIN_BACKENDS)
    assert set(BUILTIN_BACKENDS) <= set(get_registry().names())


@pytest.mark.parametrize("word, value", [("1", True), (" YES ", True), ("t", True), ("On", True), ("0", False),
                                         ("n", False), ("False", False), ("off", False), (True, True)])
def test_parse_bool_takes_accelerates_words(word, value):
    assert environment.parse_bool(word, "X") is value


def test_parse_bool_names_the_variable_and_env_flag_reads_the_first_set_name():
    with pytest.raises(ValueError, match=r"ACCEL_X must be yes or no .*got 'maybe'"):
        environment.parse_bool("maybe", "ACCEL_X")
    environ = {"ACCEL_X": "", "ACCELERATE_X": "yes", "BAD": "2"}
    assert environment.env_flag("ACCEL_X", "ACCELERATE_X", environ=environ) is True
    assert environment.env_flag("UNSET", default=True, environ=environ) is True
    assert environment.env_flag("ACCEL_X", environ=environ) is False  # empty counts as unset
    with pytest.raises(ValueError, match="BAD must be yes or no"):
        environment.env_flag("BAD", environ=environ)
    assert environment.env_text("ACCEL_X", "ACCELERATE_X", environ=environ) == "yes"
    with pytest.raises(ValueError, match="at least one"):
        environment.env_flag()


def test_accelerate_str_to_bool_takes_the_same_words():
    accelerate = pytest.importorskip("accelerate.utils.environment")
    for word in environment.TRUE_WORDS | environment.FALSE_WORDS:
        assert accelerate.str_to_bool(word) == int(environment.parse_bool(word))
    with pytest.raises(ValueError):
        accelerate.str_to_bool("maybe")


def test_precision_names():
    assert precision.PRECISIONS == ("no", "fp16", "bf16", "fp8")
    assert precision.check_precision("BF16") == "bf16" and precision.check_precision(None) == "no"
    with pytest.raises(ValueError, match="mixed_precision must be one of no, fp16, bf16, fp8, got 'fp4'"):
        precision.check_precision("fp4")
    dataclasses = pytest.importorskip("accelerate.utils.dataclasses")
    assert set(precision.PRECISIONS) == {p.value for p in dataclasses.PrecisionType}


def test_port_helpers():
    assert network.DEFAULT_PORT == 29500
    port = network.free_port("127.0.0.1")
    assert 0 < port < 65536 and not network.is_port_in_use(port, "127.0.0.1")
    with pytest.raises(ValueError, match="TCP port"):
        network.is_port_in_use(70000)


def test_checkpoint_names_and_floors_are_accelerates():
    constants = pytest.importorskip("accelerate.utils.constants")
    for name in ("MODEL_NAME", "SAFE_MODEL_NAME", "WEIGHTS_NAME", "SAFE_WEIGHTS_NAME", "WEIGHTS_INDEX_NAME",
                 "SAFE_WEIGHTS_INDEX_NAME", "WEIGHTS_PATTERN_NAME", "SAFE_WEIGHTS_PATTERN_NAME", "FSDP_MODEL_NAME",
                 "OPTIMIZER_NAME", "SCHEDULER_NAME", "SAMPLER_NAME", "SCALER_NAME", "RNG_STATE_NAME",
                 "PROFILE_PATTERN_NAME"):
        assert getattr(checkpoint, name) == getattr(constants, name), name
    assert versions.TORCH_FSDP2 == constants.FSDP2_PYTORCH_VERSION
    assert versions.TORCH_TP == constants.BETA_TP_AVAILABLE_PYTORCH_VERSION
    assert versions.TRANSFORMERS_TP == constants.BETA_TP_AVAILABLE_TRANSFORMERS_VERSION
    assert checkpoint.index_suffix(0) == "" and checkpoint.index_suffix(2) == "_2"
    with pytest.raises(ValueError, match="non-negative"):
        checkpoint.index_suffix(-1)
    with pytest.raises(KeyError, match="TORCH_FSDP2"):
        versions.floor("TORCH_FSDP3")


def test_reason_codes_have_descriptions():
    assert len(set(reasons.SKIP_CODES)) == len(reasons.SKIP_CODES) == 10
    assert all(reasons.describe_reason(code) for code in (*reasons.SKIP_CODES, reasons.UNSPECIFIED))
    with pytest.raises(KeyError, match="known: backend-unavailable"):
        reasons.describe_reason("no-such-code")


def test_every_variable_accel_launch_writes_is_in_the_contract():
    from accel.utils.launch import launch_env

    args = SimpleNamespace(
        cpu=True, debug=True, mixed_precision="no", dynamo_backend="inductor", gradient_accumulation_steps=2,
        gradient_clipping=1.0, use_fsdp=True, fsdp_version=2, fsdp_sharding_strategy="FULL_SHARD",
        fsdp_reshard_after_forward="true", fsdp_offload_params=False, fsdp_min_num_params=0,
        fsdp_auto_wrap_policy="NO_WRAP", fsdp_state_dict_type="FULL_STATE_DICT", use_deepspeed=True, zero_stage=2,
        offload_optimizer_device="cpu", zero3_init_flag=False, use_parallelism_config=True, enable_cpu_affinity=True)
    written = launch_env(args, environ={})
    ours = [name for name in written if name.startswith(("ACCEL", "FSDP_", "PARALLELISM_CONFIG_"))]
    assert len(ours) > 30
    missing = [name for name in ours if environment.contract_entry(name) is None]
    assert not missing, f"written by accel launch but not in accel.facts.environment: {missing}"


def test_every_reader_in_the_contract_is_a_module_here():
    def exists(module: str) -> bool:
        path = ROOT.joinpath(*module.split("."))
        return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file() or path.is_dir()

    rows = list(environment.ENV_VARS.values()) + list(environment.ENV_FAMILIES.values())
    missing = sorted({(row.readers, reader) for row in rows for reader in row.readers if not exists(reader)})
    assert not missing, missing
    for row in environment.ENV_VARS.values():
        assert row.meaning and row.writer and len(set(row.names)) == len(row.names), row.name
