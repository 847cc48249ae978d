"""`accel launch`: start a script in N processes through torch elastic, taking every `accelerate launch` option.

This package is the command line: ``options`` (the flags) -> ``settings`` (flags over config file over
defaults) -> ``plan`` (every check, torchrun's arguments, the ranks' environment) -> ``command`` (the
command itself). What runs while the job runs -- torch elastic in this process, the hang watchdog, whom
to blame, what every rank runs -- is the library's :mod:`accel.launch`. Names are imported on first use.
"""

from __future__ import annotations

from accel._lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(("launch_command", "launch_command_parser", "run", "run_plan"), "accel.commands.launch.command"),
    **dict.fromkeys(("DYNAMO_CHOICES", "HANG_TIMEOUT_ENV", "LAUNCH_OPTIONS", "MIXED_PRECISIONS", "REFUSED",
                     "_REFUSED_FLAG", "HideDashedAliasesFormatter", "add_arguments", "add_launch_options", "option_dest"),
                    "accel.commands.launch.options"),
    "_validate_launch_command": "accel.commands.launch.settings",
    **dict.fromkeys(("BOOTSTRAP_MODULE", "build_plan", "_hang_timeout"), "accel.commands.launch.plan"),
}

__all__ = [
    "LAUNCH_OPTIONS",
    "REFUSED",
    "add_arguments",
    "add_launch_options",
    "build_plan",
    "launch_command",
    "launch_command_parser",
    "run",
    "run_plan",
]

__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
