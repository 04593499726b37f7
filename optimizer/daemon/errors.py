"""The daemon's startup error, shared by the modules that can refuse to start."""

from __future__ import annotations


class DaemonError(RuntimeError):
    """The daemon cannot start as configured; the message is one line for the user."""
