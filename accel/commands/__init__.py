"""The `accel` command line. Commands are listed once, in `cli.COMMANDS`, and loaded on demand."""

from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(ValueError):
    """A mistake in how the user invoked a command; `accel` prints it on one line and exits 2."""
