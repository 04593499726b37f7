"""The console as part of the daemon's face: `console_app(daemon)` is the HTTP API with the
console's routers under /ui/ (which check the session cookie themselves, so the API's token
gate lets /ui/ through), its icon at /favicon.ico, and its pages' errors as pages
(errors.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import FastAPI

from optimizer.api.serve import daemon_app
from optimizer.ui import auth, errors, pages, static_files

if TYPE_CHECKING:
    from optimizer.daemon.service import Daemon

PREFIX = "/ui/"


def console_app(daemon: Daemon) -> FastAPI:
    """The daemon's API with the web console under /ui/ (and its icon at /favicon.ico)."""
    app = daemon_app(
        daemon,
        routers=[
            (static_files.router, []),
            (errors.icon_router, []),
            (auth.router, []),
            (pages.router, []),
        ],
        own_auth=(PREFIX, errors.ICON),
    )
    errors.install(app)
    return app
