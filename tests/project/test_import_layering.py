"""The import graph of accel, accel_harness and accel_reports has no cycle, and its layers point one way.

Every import counts, at module level, inside a function (a lazy import is still a dependency) or under
``if TYPE_CHECKING:`` (a reader must follow a type-only import too; a Protocol avoids one). For the layers a
lazy re-export counts as well: a string naming a project module as a dict value or a call's first argument
(``_LAZY = {"Name": "accel.x"}``, ``_export("accel.x", ...)``, ``"accel.x:Class"``). The layers, lowest first,
are :data:`LAYERS`; a module imports its own layer and those below, apart from the edges in
:data:`UPWARD_ALLOWED`, each with its reason.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("accel", "accel_harness", "accel_reports")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _targets(module: str, is_package: bool, node: ast.AST, known: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        assert isinstance(node, ast.ImportFrom)
        base = node.module or ""
        if node.level:
            package = module.split(".") if is_package else module.split(".")[:-1]
            package = package[: len(package) - node.level + 1]
            base = ".".join(package + ([base] if base else []))
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
    out = []
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != module and not module.startswith(name + "."):
            out.append(name)
    return out


def _lazy_targets(module: str, tree: ast.AST, known: dict[str, Path]) -> set[str]:
    """Project modules ``tree`` names for a lazy import: a string dict value or a call's first argument."""
    found = set()
    for node in ast.walk(tree):
        values = node.values if isinstance(node, ast.Dict) else node.args[:1] if isinstance(node, ast.Call) else []
        for value in values:
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                name = value.value.partition(":")[0]
                if name in known and name != "accel" and name != module and not module.startswith(name + "."):
                    found.add(name)
    return found


@functools.lru_cache(maxsize=None)
def import_graph(lazy: bool = False) -> dict[str, set[str]]:
    """module -> the project modules it imports (with ``lazy``, also those it names in a lazy re-export table);
    built once per session (callers must not change it)."""
    known = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        edges = graph.setdefault(module, set())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges.update(_targets(module, path.name == "__init__.py", node, known))
        if lazy:
            edges.update(_lazy_targets(module, tree, known))
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


#: the layers, lowest first: layer number -> (name, the packages and modules in it). A module is in the layer of
#: the longest prefix that holds it; the root ``accel`` (a lazy table of Accelerate's top-level names) is in none.
LAYERS: dict[int, tuple[str, tuple[str, ...]]] = {
    -1: ("facts", ("accel.facts", "accel.names")),
    0: ("backends", ("accel.backends",)),
    1: ("core", ("accel._lazy", "accel.state", "accel._state_gradient", "accel._state_setup", "accel.logging",
                 "accel.utils", "accel.launch", "accel.io", "accel.parallelism_config", "accel.resolve",
                 "accel.optimizer", "accel.scheduler")),
    2: ("subsystems", ("accel.strategies", "accel.precision", "accel.quantization", "accel.data_loader",
                       "accel.checkpointing", "accel.big_modeling", "accel.hooks", "accel.tracking", "accel.inference",
                       "accel.launchers", "accel.sysinfo")),
    3: ("facade", ("accel.accelerator", "accel.facade")),
    4: ("test helpers", ("accel.test_utils",)),
    5: ("harness", ("accel_harness",)),
    6: ("reports", ("accel_reports",)),
    7: ("CLI", ("accel.commands",)),
}


def layer(module: str) -> int | None:
    """The layer number of ``module`` (see :data:`LAYERS`), None for the root ``accel`` or a module in no layer."""
    best: tuple[int, int] | None = None
    for number, (_, prefixes) in LAYERS.items():
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[1]):
                best = (number, len(prefix))
    return None if best is None else best[0]


def upward_edges(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The edges of ``graph`` from a module into a higher layer than its own."""
    return sorted((a, b) for a, edges in graph.items() for b in edges
                  if layer(a) is not None and layer(b) is not None and layer(b) > layer(a))


#: edges that go into a higher layer, each with the reason it is allowed (none may be added silently)
_STRATEGY_TABLE = "the strategy table (module:class), loaded when an Accelerator builds one"
UPWARD_ALLOWED = {
    # core -> subsystems: Accelerate's accel.utils modules are the public face of subsystems that live above
    ("accel.utils", "accel.strategies.fsdp.plugin"):
        "lazy re-export of FullyShardedDataParallelPlugin (Accelerate's name)",
    ("accel.utils.dataclasses", "accel.strategies.fsdp.plugin"):
        "lazy re-export of FullyShardedDataParallelPlugin, defined in accelerate.utils.dataclasses",
    ("accel.utils.deepspeed", "accel.strategies.deepspeed.config"):
        "re-export of DeepSpeedPlugin and its config classes at Accelerate's path",
    ("accel.utils.fsdp_utils", "accel.strategies.fsdp"):
        "Accelerate's fsdp_utils names, which live with the FSDP strategy",
    ("accel.utils.bnb", "accel.quantization.bnb_params"): "load_and_quantize_model quantizes each parameter there",
    ("accel.utils.bnb", "accel.big_modeling"): "load_and_quantize_model dispatches the quantized model",
    ("accel.utils.modeling.checkpoint", "accel.quantization.bnb_params"):
        "load_checkpoint_in_model offloads 8-bit weights as Accelerate's loader does",
    ("accel.utils.modeling.tensors", "accel.quantization.bnb_params"):
        "set_module_tensor_to_device quantizes a bitsandbytes parameter on its device",
    ("accel.utils.launch", "accel.precision.fp8"): "the launcher refuses fp8 with the library's one message (lazy)",
    # core -> subsystems: the resolver names the strategy it picks and builds the plugin the launcher asked for
    ("accel.resolve", "accel.strategies.base"): _STRATEGY_TABLE,
    ("accel.resolve", "accel.strategies.ddp"): _STRATEGY_TABLE,
    ("accel.resolve", "accel.strategies.deepspeed"): _STRATEGY_TABLE,
    ("accel.resolve", "accel.strategies.fsdp"): _STRATEGY_TABLE,
    ("accel.resolve", "accel.strategies.deepspeed.config"): "ACCELERATE_USE_DEEPSPEED without a plugin builds one (lazy)",
    ("accel.resolve", "accel.strategies.fsdp.plugin"): "ACCELERATE_USE_FSDP without a plugin builds one (lazy)",
}


def test_no_import_cycles():
    found = cycles(import_graph())
    assert found == [], "import cycles: " + "; ".join(" -> ".join(c) for c in found)


def test_every_module_has_a_layer():
    assert sorted(m for m in import_graph() if layer(m) is None) == ["accel"]


def test_layers_point_one_way():
    upward = [edge for edge in upward_edges(import_graph(lazy=True)) if edge not in UPWARD_ALLOWED]
    assert upward == [], "imports into a higher layer: " + ", ".join(f"{a} -> {b}" for a, b in upward)


def test_every_allowed_upward_edge_still_exists():
    edges = set(upward_edges(import_graph(lazy=True)))
    assert sorted(set(UPWARD_ALLOWED) - edges) == [], "allowed upward edges that are gone: remove them from UPWARD_ALLOWED"


def test_a_new_upward_edge_fails():
    graph = {"accel.state": {"accel.accelerator", "accel.backends"}, "accel.utils.bnb": {"accel.big_modeling"},
             "accel.precision": {"accel.utils.imports"}, "accel.accelerator": {"accel.precision"}}
    new = [edge for edge in upward_edges(graph) if edge not in UPWARD_ALLOWED]
    assert new == [("accel.state", "accel.accelerator")]


def test_a_lazy_re_export_is_an_edge():
    tree = ast.parse('_LAZY = {"Plugin": "accel.strategies.fsdp.plugin"}\n_export("accel.utils.memory", "x")\n'
                     'TABLE = {"fsdp": "accel.strategies.fsdp:FSDPStrategy"}\nversion("accel")\n')
    known = {m: Path() for m in ("accel", "accel.utils", "accel.utils.memory", "accel.strategies.fsdp",
                                 "accel.strategies.fsdp.plugin")}
    assert _lazy_targets("accel.utils", tree, known) == {"accel.strategies.fsdp.plugin", "accel.utils.memory",
                                                          "accel.strategies.fsdp"}


def test_the_checker_sees_a_cycle_and_a_function_level_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    tree = ast.parse("def f():\n    from accel import state\n")
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom))
    known = {"accel": Path(), "accel.state": Path(), "accel.x": Path()}
    assert _targets("accel.x", False, node, known) == ["accel.state"]


@pytest.mark.parametrize("module, expected", [
    ("accel.facts.network", -1), ("accel.backends.cpu", 0), ("accel.state", 1), ("accel.utils.operations", 1),
    ("accel.launch.heartbeat", 1), ("accel.launch.execution", 1), ("accel.strategies.fsdp.plugin", 2),
    ("accel.sysinfo", 2), ("accel.precision.fp8", 2),
    ("accel.quantization.bnb_params", 2), ("accel.accelerator", 3), ("accel.facade.preparation", 3), ("accel.test_utils", 4),
    ("accel_harness.plugin", 5), ("accel_reports.render.report", 6), ("accel.commands.qualify", 7), ("accel", None),
])
def test_layer_of(module, expected):
    assert layer(module) == expected


#: the stages of a report inside the reports layer, lowest first (history and render both stand on analyse and
#: neither imports the other: a report drawn from a history is handed its rows)
REPORT_STAGES = {"accel_reports.load": 0, "accel_reports.analyse": 1, "accel_reports.history": 2, "accel_reports.render": 2}
#: the reports modules outside the stages: the package root and the runner of ``python -m accel_reports.census``
REPORT_ROOT = {"accel_reports", "accel_reports.census"}


def _stage(module: str) -> str | None:
    return next((s for s in REPORT_STAGES if module == s or module.startswith(s + ".")), None)


def test_report_stages_point_one_way():
    """Each module of accel_reports is in one stage (load, analyse, history, render) and imports only its own
    stage or a lower one, so a stage can be read, tested and replaced without the ones after it."""
    graph = import_graph(lazy=True)
    reports = {m for m in graph if m == "accel_reports" or m.startswith("accel_reports.")}
    assert {m for m in reports if _stage(m) is None} == REPORT_ROOT
    wrong = sorted((a, b) for a in reports for b in graph[a] if _stage(a) and _stage(b) and _stage(b) != _stage(a)
                   and REPORT_STAGES[_stage(b)] >= REPORT_STAGES[_stage(a)])
    assert not wrong, wrong


#: the module names Accelerate 1.x has in accelerate/utils/ (accel.utils may have these and no others)
ACCELERATE_UTILS_MODULES = {
    "ao", "bnb", "constants", "dataclasses", "deepspeed", "environment", "fsdp_utils", "imports", "launch",
    "megatron_lm", "memory", "modeling", "offload", "operations", "other", "random", "rich", "torch_xla", "tqdm",
    "transformer_engine", "versions",
}


def test_accel_utils_holds_only_accelerates_module_names():
    here = {p.stem if p.suffix == ".py" else p.name for p in (ROOT / "accel" / "utils").iterdir()
            if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}
    assert sorted(here - ACCELERATE_UTILS_MODULES) == [], "accel/utils holds modules Accelerate has not: move them out"
