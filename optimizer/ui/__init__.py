"""The web console: server-rendered pages under /ui/ of the daemon's HTTP API (docs/console.md)."""

from optimizer.ui.app import console_app

__all__ = ["console_app"]
