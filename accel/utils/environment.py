"""Environment-variable helpers with Accelerate's names (``accelerate.utils.environment``).

Reading: :func:`str_to_bool`, :func:`parse_flag_from_env`, :func:`parse_choice_from_env`,
:func:`get_int_from_env`, :func:`env_value` (accel's ``ACCEL_*`` name first, Accelerate's
``ACCELERATE_*`` alias second). Changing, for tests and launchers: :func:`patch_environment`,
:func:`clear_environment`, :func:`purge_accelerate_environment`,
:func:`convert_dict_to_env_variables`.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Mapping

logger = logging.getLogger(__name__)

__all__ = [
    "ENV_PREFIXES",
    "are_libraries_initialized",
    "clear_environment",
    "convert_dict_to_env_variables",
    "env_value",
    "get_int_from_env",
    "parse_choice_from_env",
    "parse_flag_from_env",
    "patch_environment",
    "purge_accelerate_environment",
    "str_to_bool",
]

#: accel's own prefix first, then Accelerate's: ``ACCEL_X`` wins over ``ACCELERATE_X``
ENV_PREFIXES = ("ACCEL_", "ACCELERATE_")

_TRUTHY = frozenset({"y", "yes", "t", "true", "on", "1"})
_FALSY = frozenset({"n", "no", "f", "false", "off", "0"})


def str_to_bool(value: str, to_bool: bool = False) -> int | bool:
    """``1``/``0`` (or ``True``/``False`` with ``to_bool``) for a yes/no word; ValueError for anything else."""
    text = str(value).strip().lower()
    if text in _TRUTHY:
        return True if to_bool else 1
    if text in _FALSY:
        return False if to_bool else 0
    raise ValueError(f"invalid truth value {value!r}: expected one of {sorted(_TRUTHY | _FALSY)}")


def env_value(suffix: str, default: str | None = None, environ: Mapping[str, str] | None = None) -> str | None:
    """The value of ``ACCEL_<suffix>``, else of Accelerate's ``ACCELERATE_<suffix>``, else ``default``.

    Empty values count as unset, so ``ACCEL_X=`` does not hide ``ACCELERATE_X=1``.
    """
    environ = os.environ if environ is None else environ
    for prefix in ENV_PREFIXES:
        value = environ.get(prefix + suffix)
        if value not in (None, ""):
            return value
    return default


def get_int_from_env(env_keys: Iterable[str], default: int) -> int:
    """The first non-negative integer among the variables ``env_keys``, else ``default``.

    A set variable that is not an integer is an error naming it (Accelerate raises a bare ValueError).
    """
    for key in env_keys:
        raw = os.environ.get(key)
        if raw is None or raw.strip() == "":
            continue
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"environment variable {key} must be an integer, got {raw!r}") from None
        if value >= 0:
            return value
    return default


def parse_flag_from_env(key: str, default: bool = False) -> bool:
    """Whether the yes/no variable ``key`` is set to a true value (``default`` when unset)."""
    value = os.environ.get(key)
    if value is None:
        return bool(default)
    return bool(str_to_bool(value))


def parse_choice_from_env(key: str, default: str = "no") -> str:
    """The raw value of ``key``, or ``default`` (as a string) when unset."""
    return os.environ.get(key, str(default))


def are_libraries_initialized(*library_names: str) -> list[str]:
    """Those of ``library_names`` that are already imported in this process."""
    return [name for name in library_names if name in sys.modules]


_FORBIDDEN = (";", "\n", "<", ">", " ")


def convert_dict_to_env_variables(current_env: Mapping[str, str]) -> list[str]:
    """``["KEY=value\\n", ...]`` for the items safe to write into an environment file.

    Items whose key or value is empty or holds ``; < >``, a space or a newline are left out with a
    warning (they would break or inject into the file a multi-node launcher sources).
    """
    lines = []
    for key, value in current_env.items():
        key, value = str(key), str(value)
        if key and value and not any(ch in key or ch in value for ch in _FORBIDDEN):
            lines.append(f"{key}={value}\n")
        else:
            logger.warning(f"WARNING: Skipping {key}={value} as it contains forbidden characters or missing values.")
    return lines


@contextmanager
def clear_environment() -> Iterator[None]:
    """Run the block with an empty ``os.environ``; the previous environment is back afterwards."""
    saved = dict(os.environ)
    os.environ.clear()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextmanager
def patch_environment(**kwargs: Any) -> Iterator[None]:
    """Set ``KEY=str(value)`` for each keyword (keys upper-cased) during the block, then restore.

    A key that existed before gets its old value back, a new one is removed, even if the block raises.
    """
    updates = {key.upper(): str(value) for key, value in kwargs.items()}
    saved = {key: os.environ.get(key) for key in updates}
    os.environ.update(updates)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


_PURGED = "_accelerate_is_purged_environment_wrapped"


def _is_purged_name(key: str) -> bool:
    return key.startswith(ENV_PREFIXES)


@contextmanager
def _restore_accelerate_variables() -> Iterator[None]:
    before = {k: v for k, v in os.environ.items() if _is_purged_name(k)}
    try:
        yield
    finally:
        for key in [k for k in os.environ if _is_purged_name(k)]:
            if key not in before:
                del os.environ[key]
        os.environ.update(before)


def _purging(function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _restore_accelerate_variables():
            return function(*args, **kwargs)

    setattr(wrapper, _PURGED, True)
    return wrapper


def _purge_test_methods(cls: type) -> type:
    for name in dir(cls):
        if not name.startswith("test"):
            continue
        member = getattr(cls, name)
        if callable(member) and not getattr(member, _PURGED, False):
            setattr(cls, name, _purging(member))
    return cls


def purge_accelerate_environment(func_or_cls: Any) -> Any:
    """Undo the ``ACCEL_*``/``ACCELERATE_*`` variables a test (function, or every ``test*`` method of a class) sets.

    Some code (e.g. ``transformers.TrainingArguments(fp16=True)``) exports ``ACCELERATE_*`` variables
    that would leak into the next test. Variables that existed before the test keep their values.
    Decorating a class also covers its subclasses' test methods (unittest and plain pytest classes).
    """
    if not isinstance(func_or_cls, type):
        return _purging(func_or_cls)
    _purge_test_methods(func_or_cls)
    previous = func_or_cls.__dict__.get("__init_subclass__")

    def __init_subclass__(cls: type, **kwargs: Any) -> None:
        if previous is not None:
            previous.__func__(cls, **kwargs)
        _purge_test_methods(cls)

    func_or_cls.__init_subclass__ = classmethod(__init_subclass__)
    return func_or_cls
