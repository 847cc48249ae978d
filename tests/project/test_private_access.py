"""No module reaches into another object's underscore attributes (outside checkpointing and the strategies).

The test walks the syntax tree of every module in ``accel``, ``accel_harness`` and ``accel_reports``
and flags each ``obj._name`` (read, written or deleted) where ``obj`` is not ``self``, ``cls``,
``super()`` or a class or function the same module defines. ``accel/checkpointing/`` and
``accel/strategies/`` are exempt: they work on torch's and DeepSpeed's internals by design.

One allow-list, :data:`PROTOCOL_NAMES`, each entry with its reason: names that are another library's
or Accelerate's protocol (torch module internals, argparse actions, Accelerate's markers that accel
shares by design). A reach into one of accel's own objects is fixed where it is written: the owner
gives the attribute a public name, a method or a property, or the value is passed explicitly. A
protocol name that nothing uses any more fails the test, so the list does not keep dead entries.
Attribute access through ``getattr(obj, "_name")`` is not seen by this check.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("accel", "accel_harness", "accel_reports")
EXEMPT = ("accel/checkpointing/", "accel/strategies/")

#: attribute name -> why reaching it on another object is right
PROTOCOL_NAMES = {
    # Accelerate's own protocol, which accel keeps for scripts and tests written for Accelerate
    "_reset_state": "Accelerate's way to forget a state singleton; its tests and launchers call it",
    "_shared_state": "Accelerate's state singletons share one dict; its launchers check whether it is empty",
    "_is_accelerate_prepared": "Accelerate's marker on an object prepare() returned",
    "_hf_hook": "Accelerate's hook protocol: the hook add_hook_to_module attached",
    "_old_forward": "Accelerate's hook protocol: the forward a hook replaced",
    "_original_forward": "Accelerate's protocol: the forward prepare_pippy replaced; extract_model_from_parallel puts it back",
    "_accelerate_step_called": "Accelerate's protocol: the scheduler asks whether its optimizer really stepped",
    "_add_dataloader": "Accelerate's GradientState protocol: a loader registers itself while it iterates",
    "_remove_dataloader": "Accelerate's GradientState protocol: a loader unregisters itself at the end",
    "_unselect": "Accelerate's DeepSpeedPlugin protocol: the state unselects the plugins it does not activate",
    "_is_hf_initialized": "transformers' marker of weights that are already initialised",
    # torch, NumPy and the standard library, where no public name exists
    "_orig_mod": "torch.compile's OptimizedModule has no public accessor for the module it compiled",
    "_parameters": "torch.nn.Module internals: a tensor is swapped in place without re-registering it",
    "_buffers": "torch.nn.Module internals: a buffer is swapped in place without re-registering it",
    "_modules": "torch.nn.Module internals: children are walked and replaced without re-registering them",
    "_non_persistent_buffers_set": "torch.nn.Module internals: which buffers a state dict leaves out",
    "_step_count": "torch LRScheduler's counter, advanced while accumulating (Accelerate's adjust_scheduler rule)",
    "_scaled_mm": "torch._scaled_mm, torch's fp8 matmul, has no public name",
    "_flatten": "torch DeviceMesh has no public way to flatten mesh dimensions (Accelerate uses the same call)",
    "_reconstruct": "numpy.core.multiarray._reconstruct is what a pickled array names; the safe unpickler allows it",
    "_rand": "NumPy's global RandomState has no public accessor",
    "_bit_generator": "the bit generator behind NumPy's global RandomState has no public accessor",
    "_exit": "os._exit: a bootstrap process ends without running the parent's clean-up",
    # multiprocessing's fork server record, which a server forked from the test session fills in as
    # ensure_running fills it for the server it spawns (accel_harness/forked_fork_server.py checks its shape)
    "_forkserver": "multiprocessing.forkserver's one ForkServer instance has no public accessor",
    "_lock": "the ForkServer's lock, held while its record changes, as ensure_running holds it",
    "_forkserver_pid": "the ForkServer's record of its server process, which rank starts read",
    "_forkserver_address": "the ForkServer's record of the socket rank starts connect to",
    "_forkserver_alive_fd": "the ForkServer's record of the pipe whose end-of-file stops the server",
    "_run_exitfuncs": "atexit has no public way to run the exit handlers before os._exit",
    "_replace": "namedtuple's documented method",
    "_actions": "argparse has no public list of a parser's actions",
    "_option_string_actions": "argparse has no public map from option strings to actions",
    "_StoreAction": "argparse's action classes are not exported under public names",
    "_StoreTrueAction": "argparse's action classes are not exported under public names",
    "_StoreFalseAction": "argparse's action classes are not exported under public names",
    "_AppendAction": "argparse's action classes are not exported under public names",
    "_fixtureinfo": "pytest has no public accessor for an item's fixture information",
    "_arg2fixturedefs": "pytest has no public accessor for the fixture definitions of an argument",
    "_quantize": "bitsandbytes' Params4bit/Int8Params quantize in place only through _quantize",
    "_C": "torch's dispatcher tables (which key has a kernel, the fallbacks) are reachable only through torch._C",
    "_dispatch_has_kernel_for_dispatch_key": "torch's dispatcher has no public query for the kernels registered under a key",
    "_dispatch_has_backend_fallback": "torch's dispatcher has no public query for a key's backend fallback",
    "_dispatch_key_for_device": "torch has no public map from a device type to its dispatch key",
    "_dispatch_get_all_op_names": "torch's dispatcher has no public list of the registered operators",
    "_num_samples": "torch's RandomSampler keeps the num_samples it was given only there (the public "
                    "num_samples turns None into the dataset's length at the time it is read)",
}

def _local_names(tree: ast.AST) -> set[str]:
    """Classes and functions the module defines (anywhere) and the names it assigns at top level."""
    names = {n.name for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))}
    for node in getattr(tree, "body", []):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def _is_own(value: ast.expr, local: set[str]) -> bool:
    if isinstance(value, ast.Name):
        return value.id in ("self", "cls") or value.id in local
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super"


@functools.lru_cache(maxsize=None)
def private_accesses(root: Path = ROOT) -> list[tuple[str, int, str, str]]:
    """``(module path, line, expression, attribute)`` of every reach into another object's underscore attribute."""
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel.startswith(EXEMPT):
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            local = _local_names(tree)
            for node in ast.walk(tree):
                if not isinstance(node, ast.Attribute):
                    continue
                name = node.attr
                if not name.startswith("_") or (name.startswith("__") and name.endswith("__")):
                    continue
                if _is_own(node.value, local):
                    continue
                found.append((rel, node.lineno, ast.unparse(node), name))
    return found


def test_no_module_reaches_into_another_objects_private_attributes():
    """Every reach into another object's underscore attribute is a named protocol."""
    unexplained = [f"{rel}:{line}: {expr}" for rel, line, expr, name in private_accesses() if name not in PROTOCOL_NAMES]
    assert not unexplained, ("these read or write another object's underscore attribute; give it a public name "
                             "(or, for another library's internals, add it to PROTOCOL_NAMES with the reason):\n"
                             + "\n".join(unexplained))


def test_the_allow_lists_hold_no_stale_entries():
    """A protocol name nobody uses any more is removed from the list."""
    names = {name for *_, name in private_accesses()}
    assert sorted(set(PROTOCOL_NAMES) - names) == []


def test_the_check_sees_a_reach_and_spares_self(tmp_path):
    """The scanner flags ``other._x`` and ``other._x = 1`` but not ``self._x``, ``cls._x`` or the module's own class."""
    package = tmp_path / "accel"
    package.mkdir()
    (package / "m.py").write_text(
        "class Own:\n    _hidden = 1\n\n"
        "def f(self, other):\n"
        "    other._secret = 1\n"
        "    return self._mine, Own._hidden, other._secret, other.__dict__\n",
        encoding="utf-8",
    )
    (tmp_path / "accel_harness").mkdir()
    (tmp_path / "accel_reports").mkdir()
    hits = [(line, expr) for _, line, expr, _ in private_accesses(tmp_path)]
    assert sorted(hits) == [(5, "other._secret"), (6, "other._secret")]
