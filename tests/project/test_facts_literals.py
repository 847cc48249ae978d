"""A fact from accel.facts written again elsewhere fails here: the default port, checkpoint file names,
precision-name collections, yes/no word collections, reason-code strings, lists of built-in backend names
(outside accel/backends, which registers them), version floors, and ``ACCEL_*``/``ACCELERATE_*`` variable
names missing from the environment table.

:data:`JUSTIFIED` lists the literals that look like a copy but stay, each with the reason; it is matched by
file, kind and value, with a count, so a new copy in an allow-listed file still fails.
"""

from __future__ import annotations

import ast
import functools
import re
from collections import Counter
from pathlib import Path

from packaging.version import InvalidVersion, Version

from accel.facts import backends, checkpoint, environment, network, reasons, versions

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("accel", "accel_harness", "accel_reports")

CHECKPOINT_NAMES = {
    checkpoint.MODEL_NAME, checkpoint.WEIGHTS_NAME, checkpoint.SAFE_WEIGHTS_NAME, checkpoint.WEIGHTS_INDEX_NAME,
    checkpoint.SAFE_WEIGHTS_INDEX_NAME, checkpoint.FSDP_MODEL_NAME, checkpoint.SCALER_NAME, checkpoint.RNG_STATE_NAME,
    checkpoint.DATALOADER_STATE_NAME, checkpoint.CUSTOM_NAME,
}
REASON_CODES = set(reasons.SKIP_CODES) | {reasons.UNSPECIFIED}
TRUTH_WORDS = environment.TRUE_WORDS | environment.FALSE_WORDS
FLOOR_VALUES = {value for _, value in versions.FLOORS.values()}
FLOOR_VERSIONS = {Version(value) for value in FLOOR_VALUES}
BACKEND_NAMES = set(backends.BUILTIN_BACKENDS)
#: where backend names are the subject (the registry and the built-in backends), so lists of them are at home
BACKEND_HOMES = ("accel/backends/",)
VERSION_CALL = re.compile(r"version|Version|at_least")
VARIABLE = re.compile(r"^(ACCEL|ACCELERATE)_[A-Z0-9_]+$")

PORT, CKPT, PRECISION, TRUTH, CODE, VAR, FLOOR, BACKENDS = (
    "port", "checkpoint name", "precision names", "truth words", "reason code", "variable outside the table",
    "version floor", "backend names")

#: (file, kind, value) -> (count, why it stays)
JUSTIFIED: dict[tuple[str, str, str], tuple[int, str]] = {
    ("accel/checkpointing/api.py", CKPT, "random_states"): (1, "a manifest field of that name, not the file name"),
    ("accel/checkpointing/manifest.py", CKPT, "random_states"): (1, "a manifest field of that name, not the file name"),
    ("accel_harness/markers.py", VAR, "ACCELERATE_ALIASES"): (1, "a Python name in __all__, not a variable"),
    ("accel/launch/config_file.py", VAR, "ACCELERATE_ONLY_KEYS"): (1, "a Python name in __all__, not a variable"),
    ("accel/utils/dataclasses/__init__.py", BACKENDS, "cpu,xpu,mtia,cuda,hpu"): (
        1, "torch.profiler.ProfilerActivity's names in Accelerate's ProfileKwargs type (mtia is an activity, no backend)"),
    ("accel/utils/modeling/memory_map.py", BACKENDS, "mps,cpu,disk"): (
        1, "the named places of a max_memory budget after the device ids, in Accelerate's order; no backend list"),
    ("accel/launch/sagemaker_args.py", TRUTH, "false,true"): (
        1, "Python's own spellings True/False, read by literal_eval case-sensitively as Accelerate does (a SageMaker "
           "hyperparameter 'true' stays text); not the yes/no words"),
}


def _collection_strings(node: ast.AST) -> list[str]:
    return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def _is_floor(text: object) -> bool:
    """``text`` names a version floor's version, however written (``"2.6"`` is the floor ``"2.6.0"``)."""
    if not isinstance(text, str) or not re.fullmatch(r"v?\d+(\.\d+)*\S*", text):
        return False
    try:
        return Version(text) in FLOOR_VERSIONS
    except InvalidVersion:
        return False


def _findings_in(tree: ast.AST, relative: str = "") -> list[tuple[str, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant):
            value = node.value
            if isinstance(value, str) and value in FLOOR_VALUES:
                found.append((FLOOR, value))
            elif value == network.DEFAULT_PORT or value == str(network.DEFAULT_PORT):
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
            if len(set(strings) & BACKEND_NAMES) >= 2 and not relative.startswith(BACKEND_HOMES):
                found.append((BACKENDS, ",".join(strings)))
            elif {"no", "fp16", "bf16"} <= lowered:
                found.append((PRECISION, ",".join(strings)))
            elif (len(lowered & TRUTH_WORDS) >= 2 and lowered & {"true", "yes", "false", "no"}
                  and not lowered - TRUTH_WORDS - {""}):
                found.append((TRUTH, ",".join(sorted(lowered))))
        elif isinstance(node, ast.Call) and VERSION_CALL.search(ast.unparse(node.func)):
            # a floor written another way in a version comparison; the exact spelling is found above
            found.extend((FLOOR, a.value) for a in node.args
                         if isinstance(a, ast.Constant) and a.value not in FLOOR_VALUES and _is_floor(a.value))
    return found


def scan(root: Path = ROOT) -> Counter:
    """(file, kind, value) -> how often it occurs, over the scanned packages outside accel/facts."""
    counts: Counter = Counter()
    for package in SCANNED:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            if relative.startswith("accel/facts/"):
                continue
            for kind, value in _findings_in(ast.parse(path.read_text(encoding="utf-8")), relative):
                counts[(relative, kind, value)] += 1
    return counts


@functools.lru_cache(maxsize=1)
def repository_scan() -> Counter:
    """:func:`scan` of this repository, once per session (two tests read it)."""
    return scan()


def unlisted(found: Counter) -> dict[tuple[str, str, str], int]:
    """The copies in ``found`` beyond what :data:`JUSTIFIED` allows for their file, kind and value."""
    allowed = {key: count for key, (count, _) in JUSTIFIED.items()}
    return {key: n for key, n in found.items() if n > allowed.get(key, 0)}


def test_no_fact_is_written_again():
    extra = unlisted(repository_scan())
    assert not extra, "facts written again (use accel.facts): " + "; ".join(
        f"{path}: {kind} {value!r} x{n}" for (path, kind, value), n in sorted(extra.items()))


def test_the_allow_lists_hold_no_stale_entries():
    """An entry whose copy is gone (or fewer) is removed from the list, so the lists only shrink."""
    found = repository_scan()
    stale = [key for key, (count, _) in JUSTIFIED.items() if found.get(key, 0) < count]
    assert not stale, f"allow-list entries to remove or lower: {stale}"


def test_the_scanner_finds_each_kind(tmp_path):
    package = tmp_path / "accel"
    package.mkdir()
    (package / "copy.py").write_text(
        'PORT = 29500\nNAME = "scaler.pt"\nP = ("no", "fp16", "bf16", "fp8")\nT = {"1", "true", "yes"}\n'
        'CODE = "needs-devices"\nV = "ACCEL_NOT_IN_THE_TABLE"\nOK = "ACCEL_DEVICE"\nF = "FSDP_VERSION"\n'
        'is_torch_version(">=", "2.6.0")\nMIN = "0.18.2"\nif Version(v) < Version("2.6"): pass\n'
        'B = ("cuda", "xpu")\nONE = ("cuda", "meta")\n')
    backends_home = package / "backends"
    backends_home.mkdir()
    (backends_home / "order.py").write_text('ORDER = ["cuda", "xpu", "cpu"]\n')
    found = {(kind, value) for (_, kind, value) in scan(tmp_path)}
    assert found == {(PORT, "29500"), (CKPT, "scaler.pt"), (PRECISION, "no,fp16,bf16,fp8"), (TRUTH, "1,true,yes"),
                     (CODE, "needs-devices"), (VAR, "ACCEL_NOT_IN_THE_TABLE"), (FLOOR, "2.6.0"), (FLOOR, "0.18.2"),
                     (FLOOR, "2.6"), (BACKENDS, "cuda,xpu")}


def test_a_new_copy_in_an_allow_listed_file_fails(tmp_path):
    """The allow-list counts: a second backend list next to a justified one is reported."""
    (path, kind, value), (count, _) = next((key, entry) for key, entry in JUSTIFIED.items() if key[1] == BACKENDS)
    target = tmp_path / path
    target.parent.mkdir(parents=True)
    names = value.split(",")
    target.write_text("\n".join(f"L{i} = {names!r}" for i in range(count)) + "\n")
    assert unlisted(scan(tmp_path)) == {}
    target.write_text("\n".join(f"L{i} = {names!r}" for i in range(count + 1)) + "\n")
    assert unlisted(scan(tmp_path)) == {(path, kind, value): count + 1}
