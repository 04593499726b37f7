"""The HTTP API as the daemon's face: `Daemon(config, face=daemon_app)` serves it.

The daemon does not import the API; this module joins the two, so dependencies run one way
(api -> daemon). `gpuopt daemon` and the tests pass `daemon_app` as the daemon's `face`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import FastAPI

from optimizer.api import agent
from optimizer.api.app import create_app
from optimizer.api.state import ApiState

if TYPE_CHECKING:
    from optimizer.daemon.service import Daemon


def daemon_app(daemon: Daemon) -> FastAPI:
    """The API over a daemon's parts, with the agent's endpoints (per-instance tokens)."""
    state = ApiState(
        store=daemon.store,
        policies=daemon.registry,
        emitter=daemon.emitter,
        metrics=daemon.metrics,
        clock=daemon.clock,
        token=daemon.token,
        wakeup=daemon.wakeup,
        ready=daemon.readiness,
        started_at=daemon.started_at,
        stopping=daemon.stopping,
        max_log_bytes_per_job=daemon.config.logs.max_bytes_per_job,
        probe_window=daemon.config.probes.window(),
    )
    state.extras["replica"] = daemon.leadership.replica
    return create_app(
        state,
        routers=[(agent.router, [])],
        max_body_bytes=daemon.config.api.max_body_bytes,
    )
