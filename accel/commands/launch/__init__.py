"""`accel launch`: start a script in N processes through torch elastic, taking every `accelerate launch` option.

Split by job: ``options`` (the flags) -> ``settings`` (flags over config file over defaults) -> ``plan``
(every check, torchrun's arguments, the ranks' environment) -> ``execution`` (torch elastic in this
process), with ``watchdog`` (hangs), ``diagnosis`` and ``report`` (whom to blame) and ``bootstrap`` (what
every rank runs). Names are imported on first use, so a rank's ``python -m accel.commands.launch.bootstrap``
does not load the launcher.
"""

from __future__ import annotations

from accel._lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(("launch_command", "launch_command_parser", "run"), "accel.commands.launch.command"),
    "DEFAULT_PORT": "accel.facts.network",
    **dict.fromkeys(("DEFAULT_HANG_TIMEOUT", "DYNAMO_CHOICES", "HANG_TIMEOUT_ENV", "LAUNCH_OPTIONS",
                     "MIXED_PRECISIONS", "REFUSED", "_REFUSED_FLAG", "HideDashedAliasesFormatter", "add_arguments",
                     "add_launch_options", "option_dest"), "accel.commands.launch.options"),
    "_validate_launch_command": "accel.commands.launch.settings",
    **dict.fromkeys(("BOOTSTRAP_MODULE", "LaunchPlan", "build_plan", "_hang_timeout"), "accel.commands.launch.plan"),
    "loopback_interface": "accel.commands.launch.network",
    **dict.fromkeys(("execute", "patched_environ"), "accel.commands.launch.execution"),
    **dict.fromkeys(("HANG_EXIT_CODE", "HangWatchdog", "hang_report"), "accel.commands.launch.watchdog"),
    **dict.fromkeys(("TRACEBACK_LINES", "clean_traceback", "failure_report"), "accel.commands.launch.report"),
    **dict.fromkeys(("LAUNCHER_PID_ENV", "worker_main"), "accel.commands.launch.bootstrap"),
    "waiting_in_collective": "accel.commands.launch.diagnosis",
}

__all__ = [
    "HANG_EXIT_CODE",
    "LAUNCHER_PID_ENV",
    "LAUNCH_OPTIONS",
    "REFUSED",
    "TRACEBACK_LINES",
    "HangWatchdog",
    "LaunchPlan",
    "add_arguments",
    "add_launch_options",
    "build_plan",
    "clean_traceback",
    "execute",
    "failure_report",
    "hang_report",
    "launch_command",
    "launch_command_parser",
    "loopback_interface",
    "patched_environ",
    "run",
    "waiting_in_collective",
    "worker_main",
]

__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)
