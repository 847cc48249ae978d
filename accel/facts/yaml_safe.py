"""The one way accel reads YAML: checked before anything is built.

:func:`compose` parses the text into PyYAML's node graph (with libyaml's C parser where PyYAML has it)
and refuses, before any Python value exists, a text over ``max_bytes``, more than ``max_aliases``
aliases, aliases that would add more than ``max_alias_nodes`` nodes once expanded (an anchor bomb), and
an alias inside the node it names. The check walks each node of the graph once and adds up node sizes
(a shared node's size is computed once), so it costs the size of the file, never that of the
expansion. :func:`construct` then builds the value, :func:`load` does both, :func:`read` checks a
file's size before reading it. :func:`key_lines` maps paths to lines without entering aliases, and
:func:`preview` quotes a value in a bounded number of characters, for error messages.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:
    import yaml

__all__ = ["YamlError", "YamlLimits", "check_size", "compose", "construct", "get_limits", "key_lines", "load",
           "parser_class", "preview", "read", "set_limits"]


def parser_class() -> type:
    """libyaml's parser (``yaml.CSafeLoader``) where PyYAML was built with it, else ``yaml.SafeLoader``."""
    import yaml

    return yaml.CSafeLoader if getattr(yaml, "__with_libyaml__", False) else yaml.SafeLoader


@dataclass(frozen=True)
class YamlLimits:
    """What one YAML file may hold; beyond any of these it is refused."""

    #: size of the file in bytes (of the text, in characters, when a text is passed)
    max_bytes: int = 16 * 1024 * 1024
    #: alias uses (``*name``) in the document
    max_aliases: int = 10_000
    #: nodes the document's aliases would add if each were replaced by what it names
    max_alias_nodes: int = 100_000

    def __post_init__(self) -> None:
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"YamlLimits.{item.name} must be a whole number >= 0, got {value!r}")


_limits = YamlLimits()


def get_limits() -> YamlLimits:
    """The limits that reads use when they are given none."""
    return _limits


def set_limits(**changes: int) -> YamlLimits:
    """Change the default limits (``set_limits(max_bytes=64 << 20)``); returns the previous ones."""
    global _limits
    previous = _limits
    _limits = dataclasses.replace(previous, **changes)
    return previous


class YamlError(ValueError):
    """YAML that was not read: a syntax error, or (``refused``) a text beyond one of the limits.

    ``problem`` is the reason alone; ``source``, ``line`` and ``column`` (1-based) say where, when known.
    """

    def __init__(self, problem: str, source: Any = None, line: int | None = None, refused: bool = False,
                 column: int | None = None):
        self.problem, self.source, self.line, self.refused, self.column = problem, source, line, refused, column
        where = ", ".join(p for p in (str(source) if source is not None else "", f"line {line}" if line else "") if p)
        super().__init__(f"{where}: {problem}" if where else problem)


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _from_pyyaml(exc: Exception, source: Any) -> YamlError:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
    if mark is None:
        return YamlError(_clip(problem), source)
    return YamlError(_clip(problem), source, mark.line + 1, column=mark.column + 1)


def _too_big(size: int, limits: YamlLimits, source: Any, unit: str) -> YamlError:
    return YamlError(f"{size:,} {unit}, over the limit of {limits.max_bytes:,} for a YAML file (max_bytes; "
                     "raise it with accel.facts.yaml_safe.set_limits)", source, refused=True)


def check_size(path: str | os.PathLike[str], limits: YamlLimits | None = None) -> None:
    """Refuse the file at ``path`` when it is larger than ``max_bytes`` (OSError when it cannot be seen)."""
    limits = limits or _limits
    size = os.stat(path).st_size
    if size > limits.max_bytes:
        raise _too_big(size, limits, path, "bytes")


def _children(node: yaml.Node) -> Iterator[tuple[yaml.Node, int]]:
    """Each child of ``node`` with the line to name for it (a mapping value: its key's line)."""
    import yaml

    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            yield key, node.start_mark.line + 1
            yield value, key.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            yield item, node.start_mark.line + 1


def _check_aliases(root: yaml.Node, limits: YamlLimits, source: Any) -> None:
    """Count alias uses and what they would add once expanded, walking each node once."""
    import yaml

    sizes: dict[int, int] = {}  # id(node) -> nodes in it once every alias under it is expanded
    open_nodes = {id(root)}  # nodes whose children are being walked
    aliases = added = 0
    stack = [(root, _children(root))]
    while stack:
        node, children = stack[-1]
        for child, line in children:
            size = sizes.get(id(child))
            if size is None and id(child) not in open_nodes:
                if isinstance(child, yaml.ScalarNode):
                    sizes[id(child)] = 1
                    continue
                open_nodes.add(id(child))
                stack.append((child, _children(child)))
                break
            if size is None:
                raise YamlError("an alias names a node that contains it (a recursive structure); refused",
                                source, line, refused=True)
            aliases += 1
            added += size
            if aliases > limits.max_aliases:
                raise YamlError(f"more than {limits.max_aliases:,} aliases (max_aliases); refused before expanding them",
                                source, line, refused=True)
            if added > limits.max_alias_nodes:
                raise YamlError(f"aliases would add more than {limits.max_alias_nodes:,} nodes once expanded "
                                f"(max_alias_nodes; an anchor bomb?); refused before expanding them",
                                source, line, refused=True)
        else:
            stack.pop()
            open_nodes.discard(id(node))
            sizes[id(node)] = 1 + sum(sizes[id(child)] for child, _ in _children(node))


def compose(text: str | bytes, source: Any = None, limits: YamlLimits | None = None) -> yaml.Node | None:
    """The checked node graph of the one document in ``text`` (None when it is empty); nothing is built."""
    import yaml

    limits = limits or _limits
    if len(text) > limits.max_bytes:
        raise _too_big(len(text), limits, source, "characters" if isinstance(text, str) else "bytes")
    parser = parser_class()(text)
    try:
        root = parser.get_single_node()
    except yaml.YAMLError as exc:
        raise _from_pyyaml(exc, source) from None
    except RecursionError:
        raise YamlError("nested too deeply to read; refused", source, refused=True) from None
    finally:
        parser.dispose()
    if root is not None:
        _check_aliases(root, limits, source)
    return root


def construct(node: yaml.Node | None, source: Any = None) -> Any:
    """The Python value of a node from :func:`compose` (None for None)."""
    import yaml

    if node is None:
        return None
    try:
        return yaml.constructor.SafeConstructor().construct_document(node)
    except yaml.YAMLError as exc:
        raise _from_pyyaml(exc, source) from None
    except ValueError as exc:  # e.g. an integer with more digits than Python converts
        raise YamlError(f"a value cannot be read: {_clip(str(exc))}", source) from None
    except RecursionError:
        raise YamlError("nested too deeply to read; refused", source, refused=True) from None


def load(text: str | bytes, source: Any = None, limits: YamlLimits | None = None) -> Any:
    """The value of the one YAML document in ``text``, checked first (YamlError names ``source``)."""
    return construct(compose(text, source, limits), source)


def read(path: str | os.PathLike[str], limits: YamlLimits | None = None) -> Any:
    """The value of the YAML file at ``path`` (UTF-8), its size checked before it is read."""
    check_size(path, limits)
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    return load(text, path, limits)


def key_lines(root: yaml.Node | None) -> dict[tuple, int]:
    """Line of each path of the document: ``()`` the root, ``("device", "name")``, ``("issues", 0)``.

    A key's path gets the key's line. What lies under an alias is not entered (its paths are absent,
    so a lookup falls back to the alias's own path), nor what lies under a key that is not a scalar.
    """
    import yaml

    lines: dict[tuple, int] = {}
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, tuple]] = [(root, ())] if root is not None else []
    while stack:
        node, where = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        lines.setdefault(where, node.start_mark.line + 1)
        children: list[tuple[yaml.Node, tuple]] = []
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    lines[where + (str(key.value),)] = key.start_mark.line + 1
                    children.append((value, where + (str(key.value),)))
        elif isinstance(node, yaml.SequenceNode):
            children = [(item, where + (i,)) for i, item in enumerate(node.value)]
        stack.extend(reversed(children))  # document order: an anchor is entered before its aliases
    return lines


class _Text(str):
    """Punctuation that :func:`preview` writes as it is."""


def preview(value: Any, limit: int = 80) -> str:
    """``repr(value)`` when it has at most ``limit`` characters, else its first ``limit`` and ``...``.

    Lists, tuples and dicts are written item by item until the limit is passed, so a huge value
    costs no more than its first ``limit`` characters.
    """
    out: list[str] = []
    size = 0
    stack: list[Any] = [value]
    while stack and size <= limit:
        item = stack.pop()
        if type(item) is _Text:
            piece = str(item)
        elif type(item) in (list, tuple) and item:
            close = [_Text(",)")] if type(item) is tuple and len(item) == 1 else [_Text("]" if type(item) is list else ")")]
            parts: list[Any] = [_Text("[" if type(item) is list else "(")]
            for i, element in enumerate(item[:limit]):
                parts += [_Text(", "), element] if i else [element]
            if len(item) > limit:
                parts.append(_Text(", ..."))
            stack.extend(reversed(parts + close))
            continue
        elif type(item) is dict and item:
            parts = [_Text("{")]
            for i, (key, element) in enumerate(item.items()):
                if i >= limit:
                    parts.append(_Text(", ..."))
                    break
                parts += ([_Text(", ")] if i else []) + [key, _Text(": "), element]
            stack.extend(reversed(parts + [_Text("}")]))
            continue
        elif isinstance(item, (str, bytes)):
            piece = repr(item[: limit + 1])
        else:
            try:
                piece = repr(item)
            except Exception:  # an int too long to write, a broken __repr__
                piece = f"<{type(item).__name__}>"
        out.append(piece)
        size += len(piece)
    text = "".join(out)
    return text if size <= limit and not stack else text[:limit] + "..."
