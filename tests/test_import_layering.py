"""The import graph of accel, accel_harness and accel_reports has no cycle, and its layers point one way.

Every import counts, at module level, inside a function (a lazy import is still a dependency) or under
``if TYPE_CHECKING:`` (a reader must follow a type-only import too; a Protocol avoids one). Layers, lowest first: ``accel.backends`` → the library
(``accel`` outside ``accel.commands``) → ``accel_harness`` → ``accel_reports`` → ``accel.commands``
(the CLI, which may use everything). A lower layer never imports a higher one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
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


def import_graph() -> dict[str, set[str]]:
    """module -> the project modules it imports."""
    known = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        edges = graph.setdefault(module, set())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges.update(_targets(module, path.name == "__init__.py", node, known))
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


def layer(module: str) -> int:
    """-1 torch-free fact tables, 0 backends, 1 library, 2 harness, 3 reports, 4 the CLI."""
    if module == "accel.names" or module == "accel.facts" or module.startswith("accel.facts."):
        return -1
    if module == "accel.commands" or module.startswith("accel.commands."):
        return 4
    if module.startswith("accel_reports"):
        return 3
    if module.startswith("accel_harness"):
        return 2
    if module.startswith("accel.backends"):
        return 0
    return 1


def test_no_import_cycles():
    found = cycles(import_graph())
    assert found == [], "import cycles: " + "; ".join(" -> ".join(c) for c in found)


#: edges that go upward today, each with the reason it is allowed (none may be added silently)
UPWARD_ALLOWED = {
    # Accelerate's public utils.write_basic_config writes a config file in the CLI's format
    ("accel.utils.other", "accel.commands.config"): "write_basic_config",
    ("accel.utils.other", "accel.commands.config_file"): "write_basic_config",
    # notebook_launcher binds gloo to loopback and patches the environment as accel launch does;
    # those helpers move below the CLI when the launcher becomes a package
    ("accel.launchers", "accel.commands.launch"): "loopback_interface, patched_environ",
    # a results header's environment block is what `accel env --json` collects (a lazy default)
    ("accel_harness.records", "accel.commands.env"): "collect_environment",
}


def test_layers_point_one_way():
    upward = sorted((a, b) for a, edges in import_graph().items() for b in edges
                    if layer(b) > layer(a) and a != "accel" and (a, b) not in UPWARD_ALLOWED)
    assert upward == [], "imports from a lower layer into a higher one: " + ", ".join(f"{a} -> {b}" for a, b in upward)


def test_the_checker_sees_a_cycle_and_a_function_level_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    tree = ast.parse("def f():\n    from accel import state\n")
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom))
    assert _targets("accel.x", False, node, {"accel": Path(), "accel.state": Path(), "accel.x": Path()}) == ["accel.state"]


@pytest.mark.parametrize("module, expected", [("accel.backends.cpu", 0), ("accel.state", 1), ("accel_harness.plugin", 2),
                                               ("accel_reports.render", 3), ("accel.commands.qualify", 4)])
def test_layer_of(module, expected):
    assert layer(module) == expected
