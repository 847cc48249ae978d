"""Small pieces the config questions are built from, with Accelerate's names (``_ask_field``, ...)."""

from __future__ import annotations

import argparse
from typing import Any, Callable, Sequence

from accel.facts.environment import parse_bool

__all__ = ["SubcommandHelpFormatter", "_ask_field", "_ask_options", "_convert_yes_no_to_bool"]


def _ask_field(input_text: str, convert_value: Callable[[str], Any] | None = None, default: Any = None,
               error_message: str | None = None) -> Any:
    """Ask until ``convert_value`` accepts the answer; an empty answer gives ``default`` (when not None)."""
    while True:
        answer = input(input_text).strip()
        if not answer and default is not None:
            return default
        try:
            return convert_value(answer) if convert_value is not None else answer
        except Exception as exc:
            print(error_message or f"  {exc}; please try again")


def _ask_options(input_text: str, options: Sequence[str] = (), convert_value: Callable[[Any], Any] | None = None,
                 default: int = 0) -> Any:
    """Ask for one of ``options`` by number or name (default: the option at index ``default``)."""
    listing = "\n".join(f"  [{i}] {option}" for i, option in enumerate(options))

    def pick(text: str) -> Any:
        index = int(text) if text.isdigit() else list(options).index(text)
        if not 0 <= index < len(options):
            raise ValueError(f"choose 0 to {len(options) - 1}")
        return convert_value(index) if convert_value is not None else options[index]

    print(f"{input_text}\n{listing}")
    return _ask_field(f"[{default}]: ", pick, default=pick(str(default)))


def _convert_yes_no_to_bool(value: str) -> bool:
    """``yes``/``no`` (any word :func:`accel.facts.environment.parse_bool` reads) as a bool; ValueError otherwise."""
    try:
        return parse_bool(value)
    except ValueError:
        raise ValueError(f"answer yes or no, not {value!r}") from None


class SubcommandHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help for a config sub-command without argparse's repeated ``{a,b,c}`` choice list in the usage line."""

    def _format_usage(self, usage: Any, actions: Any, groups: Any, prefix: Any) -> str:
        return super()._format_usage(usage, actions, groups, prefix).replace("<command> [<args>] ", "")


def _ask(question: str, check: Callable[[str], Any], default: Any = None) -> Any:
    """Ask (on stdin) until ``check`` accepts the answer; an empty answer takes ``default`` (when there is one)."""
    shown = "" if default is None else f" [{default}]"
    while True:
        try:
            answer = input(f"{question}{shown}: ").strip()
        except EOFError:
            from accel.commands import UsageError

            print()
            raise UsageError("the input ended before every question was answered (nothing was written)") from None
        if not answer:
            if default is None:
                print("  an answer is needed")
                continue
            answer = str(default)
        try:
            return check(answer)
        except ValueError as exc:
            print(f"  {exc}; please try again")


def _choice(options: tuple[str, ...]) -> Callable[[str], str]:
    def check(text: str) -> str:
        word = text.strip()
        match = next((o for o in options if o.lower() == word.lower()), None)
        if match is None:
            raise ValueError(f"answer one of {', '.join(options)}, not {text!r}")
        return match
    return check
