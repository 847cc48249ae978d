"""Bases of the Accelerate-named enums and kwargs handlers (re-exported by :mod:`accel.utils.dataclasses`),
and the environment readers their defaults use."""

from __future__ import annotations

import copy
import enum
from typing import Any


class EnumWithContains(enum.EnumMeta):
    """Enum metaclass whose ``in`` accepts values too (``"NO" in DistributedType``), as Accelerate's does."""

    def __contains__(cls, item: Any) -> bool:
        try:
            cls(item)
        except ValueError:
            return False
        return True


class BaseEnum(enum.Enum, metaclass=EnumWithContains):
    """An enum whose ``str()`` is its value and whose ``list()`` gives every value (Accelerate's base enum)."""

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def list(cls) -> list[str]:
        """Every member's value, in definition order."""
        return [str(member) for member in cls]


class StrValueEnum(str, enum.Enum):
    """A str-valued enum that compares equal to its value, like Accelerate's."""

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def list(cls) -> list[str]:
        return [m.value for m in cls]


class KwargsHandler:
    """Base of the ``kwargs_handlers`` dataclasses: ``to_kwargs`` returns the non-default fields."""

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self.__dict__)

    def to_kwargs(self) -> dict[str, Any]:
        """The fields that differ from the class defaults, the defaults taken with no environment
        variables set (handlers such as :class:`TorchDynamoPlugin` read their defaults from it)."""
        from ..environment import clear_environment

        with clear_environment():
            default = self.__class__().to_dict()
        return {k: v for k, v in self.to_dict().items() if default.get(k) != v}


def env_suffix(suffix: str, default: str | None = None) -> str | None:
    """``ACCEL_<suffix>`` or Accelerate's ``ACCELERATE_<suffix>``, else ``default``."""
    from ..environment import env_value

    return env_value(suffix, default)


def env_bool(suffix: str, default: bool = False) -> bool:
    """:func:`env_suffix` read as a boolean (``default`` when unset)."""
    from ..environment import str_to_bool

    value = env_suffix(suffix)
    return default if value is None else bool(str_to_bool(value))
