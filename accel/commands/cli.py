"""`accel` entry point: a table of subcommands, each loaded only when it is the one being run.

Keeping the other commands unimported keeps `accel --help` fast (no torch import) and means one
command's missing optional dependency cannot break the rest. A command module provides
``add_arguments(parser)`` and ``run(args) -> int``; adding a command is one line in ``COMMANDS``.
A command whose module is not installed (an optional part) is listed and, when run, says what is
missing instead of failing with a traceback.

An unknown flag, on any command, is named with the closest flag the command has ("unrecognized argument
--num_proceses; did you mean --num_processes?", exit status 2). `accel launch` passes the words after the
script to the script, so only the flags before the script are checked.

Shell completion (bash, zsh, fish) comes from argcomplete: ``accel completion bash`` prints the
script to source (``eval "$(accel completion bash)"``); while completing, the parser is built with the
options of the command being completed only, so completion stays as fast as ``accel --help``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any, NoReturn, Sequence

from accel import __version__
from accel.commands import UsageError

__all__ = ["COMMANDS", "SHELLS", "build_parser", "main", "option_strings", "suggest"]

# name -> (module providing add_arguments/run, one-line summary for `accel --help`)
COMMANDS: dict[str, tuple[str, str]] = {
    "env": ("accel.commands.env", "show versions, hardware and backends (paste into bug and qualification reports)"),
    "config": ("accel.commands.config", "write the config file `accel launch` reads (questions, flags or `default`)"),
    "launch": ("accel.commands.launch", "run a script in several processes (torch elastic), e.g. `accel launch --num_processes 2 train.py`"),
    "test": ("accel.commands.test", "smoke-check this machine: launch, verify the world size, run the core checks"),
    "qualify": ("accel.commands.qualify", "qualify this machine: conformance suites, benchmarks and a report in one folder"),
    "ops": ("accel.commands.ops", "operator conformance: torch's OpInfo/ModuleInfo/OptimInfo on a backend against the host, op x dtype table"),
    "bench": ("accel.commands.bench", "run the throughput benchmarks for a backend (pytest-benchmark JSON into ./results), e.g. `accel bench --quick`"),
    "report": ("accel.commands.report", "turn results (JSONL, JUnit XML, benchmark JSON) into report.html + report.md; CI exit codes"),
    "estimate-memory": ("accel.commands.estimate", "estimate a model's memory for inference and training, per dtype (no weights downloaded)"),
    "merge-weights": ("accel.commands.merge", "merge a sharded FSDP checkpoint (DCP folder) into one model.safetensors"),
    "to-fsdp2": ("accel.commands.to_fsdp2", "convert a config file's FSDP1 settings to FSDP2 and list what changed"),
    "tpu-config": ("accel.commands.tpu", "run set-up commands on every worker of a Cloud TPU pod (builds the gcloud command)"),
    "completion": ("accel.commands.cli", "print the shell completion script: eval \"$(accel completion bash)\" (bash, zsh or fish)"),
}
#: the parser of each command, as the last :func:`build_parser` made it (for the "did you mean" hint)
COMMAND_PARSERS: dict[str, argparse.ArgumentParser] = {}
#: shells `accel completion` writes scripts for (argcomplete's shellcode)
SHELLS = ("bash", "zsh", "fish")


class _ParseError(Exception):
    """Raised instead of argparse's print-usage-and-exit, so ``main`` can return the code."""


class _Parser(argparse.ArgumentParser):
    """The parser of `accel` and of every command (argparse gives subcommand parsers their parent's class)."""

    def error(self, message: str) -> NoReturn:
        """Raise instead of printing and exiting, so ``main`` returns the exit code."""
        raise _ParseError(f"{self.prog}: error: {message} (see '{self.prog} --help')")

    def unrecognized(self, words: Sequence[str]) -> NoReturn:
        """Refuse words no option took: each unknown flag named with the closest flag this command has."""
        flags = [w for w in words if w.startswith("-") and len(w) > 1]
        if not flags:  # stray words only; with an unknown flag, the words after it are most likely its value
            self.error(f"unrecognized argument{'s' if len(words) > 1 else ''}: {' '.join(words)}")
        known = option_strings(self)
        parts = []
        for word in flags:
            flag = word.split("=", 1)[0]
            parts.append(f"unrecognized argument {word}" + (f"; did you mean {close}?" if (close := suggest(flag, known)) else ""))
        self.error("; ".join(parts))

    def _get_option_tuples(self, option_string: str) -> list:
        """argparse's abbreviation matches, one per option: ``--flake`` matches ``--flake-runs`` and
        ``--flake_runs`` (:func:`add_both_spellings`), which is one option, not an ambiguity."""
        matches, seen = [], set()
        for match in super()._get_option_tuples(option_string):
            if id(match[0]) not in seen:
                seen.add(id(match[0]))
                matches.append(match)
        return matches

    def unknown_flags(self, words: Sequence[str]) -> list[str]:
        """The long flags among ``words`` that this command does not take (nor abbreviates, where it allows
        abbreviations); none for a command that passes words on to a script (``accel launch``)."""
        if any(action.nargs == argparse.REMAINDER for action in self._actions):
            return []
        known = option_strings(self)
        unknown = []
        for word in words:
            flag = word.split("=", 1)[0]
            if not flag.startswith("--") or flag == "--" or flag in known:
                continue
            if self.allow_abbrev and any(k.startswith(flag) for k in known):
                continue
            unknown.append(word)
        return unknown


def add_both_spellings(parser: argparse.ArgumentParser) -> None:
    """Make every long flag of ``parser`` (its subcommands' included) take both spellings, ``--flake-runs``
    and ``--flake_runs``, as Accelerate's commands do; help lists the spelling the command declared."""
    lookup = parser._option_string_actions
    for action in parser._actions:
        for flag in list(action.option_strings):
            if not flag.startswith("--") or len(flag) < 4:
                continue
            body = flag[2:]
            for other in ("--" + body.replace("-", "_"), "--" + body.replace("_", "-")):
                lookup.setdefault(other, action)  # a flag declared apart under the other spelling keeps its own
        choices = getattr(action, "choices", None)
        if isinstance(choices, dict):
            for sub in choices.values():
                if isinstance(sub, argparse.ArgumentParser):
                    add_both_spellings(sub)


def option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """Every long flag ``parser`` takes, its subcommands' included (``--num_processes``, ``--cpu``, ...)."""
    found: list[str] = []
    for action in parser._actions:
        found += [s for s in action.option_strings if s.startswith("--")]
    found += [s for s in parser._option_string_actions if s.startswith("--")]  # the other spellings
    for action in parser._actions:
        choices = getattr(action, "choices", None)
        if isinstance(choices, dict):
            for sub in choices.values():
                if isinstance(sub, argparse.ArgumentParser):
                    found += option_strings(sub)
    return list(dict.fromkeys(found))


def suggest(flag: str, known: Sequence[str]) -> str | None:
    """The flag in ``known`` closest to a mistyped ``flag`` (difflib's ratio, 0.6 or more), else None;
    ``--num-proceses`` and ``--num_proceses`` are compared alike."""
    import difflib

    if not flag.startswith("--"):
        return None
    canonical = {k.replace("-", "_"): k for k in reversed(known)}  # the underscore spelling when both exist
    match = difflib.get_close_matches(flag.replace("-", "_"), list(canonical), n=1, cutoff=0.6)
    return canonical[match[0]] if match else None


def _requested_command(argv: Sequence[str]) -> str | None:
    """The first word that is not an option: top-level options take no values."""
    for word in argv:
        if not word.startswith("-"):
            return word
    return None


def build_parser(load: str | None = None) -> argparse.ArgumentParser:
    """The full parser; only the command named ``load`` has its module imported and options added."""
    parser = _Parser(prog="accel", description="accel: one training loop on any PyTorch backend, and the tools to qualify them.")
    parser.add_argument("--version", action="version", version=f"accel {__version__}")
    subparsers = parser.add_subparsers(dest="accel_command", metavar="<command>", title="commands")
    for name, (module_path, summary) in COMMANDS.items():
        sub = subparsers.add_parser(name, help=summary, description=summary)
        COMMAND_PARSERS[name] = sub
        if name == load:
            if name == "completion":
                add_arguments(sub)
                sub.set_defaults(accel_run=run)
                continue
            try:
                module = importlib.import_module(module_path)
            except ModuleNotFoundError as exc:
                if exc.name != module_path:
                    raise
                sub.set_defaults(accel_run=_missing(name, module_path))
                continue
            module.add_arguments(sub)
            add_both_spellings(sub)
            sub.set_defaults(accel_run=module.run)
    return parser


def _better_error(exc: _ParseError, argv: Sequence[str], requested: str | None) -> str:
    """A mistyped flag can make argparse fail elsewhere first (its value taken as a positional: "invalid
    choice", or a required option not seen): then name the unknown flag instead, with the closest one."""
    text = str(exc)
    if requested not in COMMANDS and "argument <command>: invalid choice" in text:
        import difflib

        close = difflib.get_close_matches(requested or "", list(COMMANDS), n=1, cutoff=0.6)
        head, sep, tail = text.rpartition(" (see ")
        return f"{head}; did you mean {close[0]}?{sep}{tail}" if close and sep else text
    command_parser = COMMAND_PARSERS.get(requested or "")
    if not isinstance(command_parser, _Parser) or not ("invalid choice" in text or "arguments are required" in text):
        return text
    unknown = command_parser.unknown_flags(list(argv)[list(argv).index(requested) + 1:])
    if not unknown:
        return text
    try:
        command_parser.unrecognized(unknown)
    except _ParseError as better:
        return str(better)
    return text


def _missing(name: str, module_path: str) -> Any:
    def fail(args: argparse.Namespace) -> int:
        raise UsageError(f"`accel {name}` is not available in this installation ({module_path} is missing)")

    return fail


# ---------------------------------------------------------------------------- `accel completion`
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`accel completion`'s argument: the shell."""
    parser.add_argument("shell", choices=SHELLS, help="the shell to write the completion script for")


def run(args: argparse.Namespace) -> int:
    """Print argcomplete's completion script for ``args.shell`` (register it with eval or a file)."""
    try:
        import argcomplete
    except ImportError:
        raise UsageError("shell completion needs argcomplete: pip install argcomplete") from None
    print(argcomplete.shellcode(["accel"], shell=args.shell), end="")
    return 0


def _complete_if_asked() -> None:
    """Under argcomplete (``_ARGCOMPLETE`` set by the shell script), print completions and exit."""
    if not os.environ.get("_ARGCOMPLETE"):
        return
    try:
        import argcomplete
    except ImportError:
        return
    import shlex

    try:
        words = shlex.split(os.environ.get("COMP_LINE", ""))[1:]
    except ValueError:  # an unfinished quote
        words = os.environ.get("COMP_LINE", "").split()[1:]
    requested = _requested_command(words)
    parser = build_parser(load=requested if requested in COMMANDS else None)
    argcomplete.autocomplete(parser)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``accel`` with ``argv`` (default: the process arguments) and return the exit code."""
    code = _run(argv)
    if argv is None:  # the process's own command: the interpreter exits next
        _freeze_before_exit()
    return code


def _freeze_before_exit() -> None:
    """Collect the process's garbage now (its finalizers run) and freeze what is left, so that the
    interpreter's last collections at exit skip it: with torch imported they traverse all of it, about
    half a second. Python does not promise to finalize objects still alive at exit in any case."""
    if "torch" not in sys.modules:  # a light command's exit is quick already
        return
    import gc

    gc.collect()
    gc.freeze()


def _run(argv: Sequence[str] | None) -> int:
    """Parse ``argv`` and run the command it names; the exit code."""
    if argv is None:
        _complete_if_asked()
    argv = list(sys.argv[1:] if argv is None else argv)
    requested = _requested_command(argv)
    parser = build_parser(load=requested if requested in COMMANDS else None)
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # name the command the stray words were given to, not just `accel`, and the closest flag
            command_parser = COMMAND_PARSERS.get(args.accel_command, parser) if args.accel_command else parser
            if not isinstance(command_parser, _Parser):
                command_parser = parser
            command_parser.unrecognized(extra)
    except _ParseError as exc:
        print(_better_error(exc, argv, requested), file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help and --version
        return exc.code if isinstance(exc.code, int) else 0
    if args.accel_command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.accel_run(args))
    except UsageError as exc:
        print(f"accel {args.accel_command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `accel env | head`: the reader left; say nothing more
        _silence_stdout()
        return 1


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
