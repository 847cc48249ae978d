"""The YAML layer of the nightly matrix reader: a parsed file that knows the line of every key, and
the value checks whose errors name the file, the line and the key (the workflow checker reads its
file with the same document).
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, Iterable, Sequence

from accel.launch.config_file import FileValueError  # stdlib-only: usable before accel is installed

#: a value without spaces (the default a checked text must match)
WORD_PATTERN = re.compile(r"^\S+$")

KeyPath = tuple  # ("backends", "cpu", "world_sizes", 0)


class MatrixError(FileValueError):
    """A matrix file (or a request against one) that cannot be used; the message says where and why."""

    what = "matrix file"


def suggest(word: Any, options: Iterable[Any]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``options``, or an empty string."""
    match = difflib.get_close_matches(str(word), [str(o) for o in options], n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _dotted(path: KeyPath) -> str:
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            part = str(part)
            shown = part if re.fullmatch(r"[\w-]+", part) else f'"{part}"'
            text += ("." if text else "") + shown
    return text


class Document:
    """The parsed file plus the line of every key and the raw text of every scalar."""

    def __init__(self, path: Path, text: str, error: type[MatrixError] = MatrixError,
                 empty_hint: str = "expected `version: 1`, `backends:`, `torch:`, ..."):
        import yaml

        self.path = path
        self.Error = error  # the kind of error this document raises (matrix or workflow file)
        self.lines: dict[KeyPath, int] = {}
        self.raw: dict[KeyPath, str] = {}
        from accel.facts import yaml_safe

        try:  # aliases are checked before anything is built: an anchor bomb is refused, never expanded
            root = yaml_safe.compose(text, path)
        except yaml_safe.YamlError as exc:
            kind = "refused" if exc.refused else "YAML syntax error"
            raise self.Error(f"{kind}: {exc.problem}", path, exc.line) from None
        if root is None:
            raise self.Error(f"the file is empty ({empty_hint})", path)
        self._constructor = yaml.SafeLoader("")
        self._yaml = yaml
        self.data = self._build(root, ())

    def error(self, path: KeyPath, message: str) -> MatrixError:
        line = None
        probe = tuple(path)
        while probe and line is None:
            line = self.lines.get(probe)
            probe = probe[:-1]
        return self.Error(message, self.path, line if line is not None else self.lines.get(()), _dotted(path) or None)

    def _build(self, node: Any, path: KeyPath) -> Any:
        yaml = self._yaml
        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            result: dict[str, Any] = {}
            merged: dict[str, Any] = {}
            for key_node, value_node in node.value:
                line = key_node.start_mark.line + 1
                if key_node.tag == "tag:yaml.org,2002:merge":
                    sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                    for source in sources:
                        value = self._build(source, path)
                        if not isinstance(value, dict):
                            raise self.Error("`<<` merges mappings only", self.path, line, _dotted(path) or None)
                        for k, v in value.items():
                            merged.setdefault(k, v)
                    continue
                if not isinstance(key_node, yaml.ScalarNode):
                    raise self.Error("keys must be plain names", self.path, line, _dotted(path) or None)
                key = key_node.value
                if key in result:
                    raise self.Error(f"appears twice (lines {self.lines[path + (key,)]} and {line})",
                                      self.path, line, _dotted(path + (key,)))
                self.lines[path + (key,)] = line
                result[key] = self._build(value_node, path + (key,))
            for k, v in merged.items():
                result.setdefault(k, v)
            return result
        if isinstance(node, yaml.SequenceNode):
            return [self._build(item, path + (i,)) for i, item in enumerate(node.value)]
        self.raw[path] = node.value
        return self._constructor.construct_object(node, deep=True)


class Checker:
    """Checks of one value each (a mapping, a text, a list, a number, a flag) that fail naming its line and key."""

    def __init__(self, doc: Document):
        self.doc = doc

    def fail(self, path: KeyPath, message: str) -> MatrixError:
        return self.doc.error(path, message)

    def mapping(self, value: Any, path: KeyPath, keys: Sequence[str] | None, what: str) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(path, f"expected a mapping of {what}, got {kind(value)}")
        if keys is not None:
            for key in value:
                if key not in keys:
                    raise self.fail(path + (key,), f"unknown key{suggest(key, keys)}; known keys: {', '.join(keys)}")
        return value

    def text(self, value: Any, path: KeyPath, pattern: re.Pattern[str] = WORD_PATTERN, what: str = "a word without spaces") -> str:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and path in self.doc.raw:
            value = self.doc.raw[path]  # versions: the text as written, so 3.10 stays "3.10"
        if not isinstance(value, str) or not pattern.match(value.strip()):
            raise self.fail(path, f"expected {what}, got {value!r}")
        return value.strip()

    def texts(self, value: Any, path: KeyPath, pattern: re.Pattern[str] = WORD_PATTERN, what: str = "words",
              single_ok: bool = False, empty_ok: bool = False) -> list[str]:
        if single_ok and isinstance(value, (str, int, float)) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, list):
            raise self.fail(path, f"expected a list of {what}, got {kind(value)}")
        if not value and not empty_ok:
            raise self.fail(path, f"expected a non-empty list of {what}")
        items = [self.text(v, path + (i,) if (path + (i,)) in self.doc.lines else path, pattern, what) for i, v in enumerate(value)]
        for i, item in enumerate(items):
            if item in items[:i]:
                raise self.fail(path, f"lists {item!r} twice")
        return items

    def whole(self, value: Any, path: KeyPath, minimum: int) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise self.fail(path, f"expected a whole number >= {minimum}, got {value!r}")
        return value

    def flag(self, value: Any, path: KeyPath) -> bool:
        if not isinstance(value, bool):
            raise self.fail(path, f"expected true or false, got {value!r}")
        return value


def kind(value: Any) -> str:
    """What a value is, for an error message (``the text 'x'``, ``a mapping``)."""
    if value is None:
        return "nothing"
    if isinstance(value, str):
        return f"the text {value!r}"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    return {dict: "a mapping", list: "a list"}.get(type(value), type(value).__name__)
