"""A fact from accel.facts written again elsewhere fails here: the default port, checkpoint file names,
precision-name collections, yes/no word collections, reason-code strings, and ``ACCEL_*``/``ACCELERATE_*``
variable names missing from the environment table.

:data:`JUSTIFIED` lists the literals that look like a copy but stay, each with the reason; it is matched by
file, kind and value, with a count, so a new copy in an allow-listed file still fails.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

from accel.facts import checkpoint, environment, network, reasons, versions

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("accel", "accel_harness", "accel_reports")

CHECKPOINT_NAMES = {
    checkpoint.MODEL_NAME, checkpoint.WEIGHTS_NAME, checkpoint.SAFE_WEIGHTS_NAME, checkpoint.WEIGHTS_INDEX_NAME,
    checkpoint.SAFE_WEIGHTS_INDEX_NAME, checkpoint.FSDP_MODEL_NAME, checkpoint.SCALER_NAME, checkpoint.RNG_STATE_NAME,
    checkpoint.DATALOADER_STATE_NAME, checkpoint.CUSTOM_NAME,
}
REASON_CODES = set(reasons.SKIP_CODES) | {reasons.UNSPECIFIED}
TRUTH_WORDS = environment.TRUE_WORDS | environment.FALSE_WORDS
FLOOR_VALUES = {value for _, value in versions.FLOORS.values()}
VARIABLE = re.compile(r"^(ACCEL|ACCELERATE)_[A-Z0-9_]+$")

PORT, CKPT, PRECISION, TRUTH, CODE, VAR, FLOOR = (
    "port", "checkpoint name", "precision names", "truth words", "reason code", "variable outside the table",
    "version floor")

#: (file, kind, value) -> (count, why it stays)
JUSTIFIED: dict[tuple[str, str, str], tuple[int, str]] = {
    ("accel/checkpointing/api.py", CKPT, "random_states"): (1, "a manifest field of that name, not the file name"),
    ("accel/checkpointing/manifest.py", CKPT, "random_states"): (1, "a manifest field of that name, not the file name"),
    ("accel_harness/markers.py", VAR, "ACCELERATE_ALIASES"): (1, "a Python name in __all__, not a variable"),
    ("accel/commands/config_file.py", VAR, "ACCELERATE_ONLY_KEYS"): (1, "a Python name in __all__, not a variable"),
    ("accel/launch/sagemaker_args.py", TRUTH, "false,true"): (
        1, "Python's own spellings True/False, read by literal_eval case-sensitively as Accelerate does (a SageMaker "
           "hyperparameter 'true' stays text); not the yes/no words"),
}


def _collection_strings(node: ast.AST) -> list[str]:
    return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def _findings_in(tree: ast.AST) -> list[tuple[str, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant):
            value = node.value
            if value == network.DEFAULT_PORT or value == str(network.DEFAULT_PORT):
                found.append((PORT, str(value)))
            elif isinstance(value, str) and value in CHECKPOINT_NAMES:
                found.append((CKPT, value))
            elif isinstance(value, str) and value in REASON_CODES:
                found.append((CODE, value))
            elif (isinstance(value, str) and VARIABLE.match(value) and value not in environment.ENV_FAMILIES
                  and environment.contract_entry(value) is None):
                found.append((VAR, value))
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            strings = _collection_strings(node)
            lowered = {s.strip().lower() for s in strings}
            if {"no", "fp16", "bf16"} <= lowered:
                found.append((PRECISION, ",".join(strings)))
            elif (len(lowered & TRUTH_WORDS) >= 2 and lowered & {"true", "yes", "false", "no"}
                  and not lowered - TRUTH_WORDS - {""}):
                found.append((TRUTH, ",".join(sorted(lowered))))
        elif isinstance(node, ast.Call) and re.search(r"version|Version|at_least", ast.unparse(node.func)):
            found.extend((FLOOR, a.value) for a in node.args if isinstance(a, ast.Constant) and a.value in FLOOR_VALUES)
    return found


def scan(root: Path = ROOT) -> Counter:
    """(file, kind, value) -> how often it occurs, over the scanned packages outside accel/facts."""
    counts: Counter = Counter()
    for package in SCANNED:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            if relative.startswith("accel/facts/"):
                continue
            for kind, value in _findings_in(ast.parse(path.read_text(encoding="utf-8"))):
                counts[(relative, kind, value)] += 1
    return counts


def test_no_fact_is_written_again():
    allowed = {key: count for key, (count, _) in JUSTIFIED.items()}
    extra = {key: n for key, n in scan().items() if n > allowed.get(key, 0)}
    assert not extra, "facts written again (use accel.facts): " + "; ".join(
        f"{path}: {kind} {value!r} x{n}" for (path, kind, value), n in sorted(extra.items()))


def test_the_allow_lists_hold_no_stale_entries():
    """An entry whose copy is gone (or fewer) is removed from the list, so the lists only shrink."""
    found = scan()
    stale = [key for key, (count, _) in JUSTIFIED.items() if found.get(key, 0) < count]
    assert not stale, f"allow-list entries to remove or lower: {stale}"


def test_the_scanner_finds_each_kind(tmp_path):
    package = tmp_path / "accel"
    package.mkdir()
    (package / "copy.py").write_text(
        'PORT = 29500\nNAME = "scaler.pt"\nP = ("no", "fp16", "bf16", "fp8")\nT = {"1", "true", "yes"}\n'
        'CODE = "needs-devices"\nV = "ACCEL_NOT_IN_THE_TABLE"\nOK = "ACCEL_DEVICE"\nF = "FSDP_VERSION"\n'
        'is_torch_version(">=", "2.6.0")\n')
    found = {(kind, value) for (_, kind, value) in scan(tmp_path)}
    assert found == {(PORT, "29500"), (CKPT, "scaler.pt"), (PRECISION, "no,fp16,bf16,fp8"), (TRUTH, "1,true,yes"),
                     (CODE, "needs-devices"), (VAR, "ACCEL_NOT_IN_THE_TABLE"), (FLOOR, "2.6.0")}
