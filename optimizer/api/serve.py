"""The HTTP API as the daemon's face: `Daemon(config, face=daemon_app)` serves it.

The daemon does not import the API; this module joins the two, so dependencies run one way
(api -> daemon). The tests pass `daemon_app` as the daemon's `face`; `gpuopt daemon` passes
the web console's `console_app` (optimizer/ui), which is this app with the console's router.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, FastAPI

from optimizer.api import agent, code
from optimizer.api.app import create_app
from optimizer.api.followers import FollowerSlots
from optimizer.api.state import ApiState
from optimizer.code import MIB, CodeStore

if TYPE_CHECKING:
    from optimizer.daemon.service import Daemon


def daemon_state(daemon: Daemon) -> ApiState:
    """What the API (and the console) read and act through, from a daemon's parts."""
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
        followers=FollowerSlots(
            per_job=daemon.config.logs.max_followers_per_job,
            total=daemon.config.logs.max_followers,
        ),
        probe_window=daemon.config.probes.window(),
        code=CodeStore(daemon.config.effective_data_dir / "code", uri=daemon.config.code.store),
    )
    state.extras["replica"] = daemon.leadership.replica
    owned = daemon.handles.get("ssh")
    if owned is not None:  # owned machines (optimizer/api/machines.py)
        polls = [p for p in daemon.polls if p.handle is owned]
        state.extras["machines"] = owned.source
        state.extras["machines_polled"] = lambda: [p.run_once() for p in polls]
    return state


def daemon_app(
    daemon: Daemon,
    *,
    routers: Sequence[tuple[APIRouter, Sequence[Any]]] = (),
    own_auth: Sequence[str] = (),
) -> FastAPI:
    """The API over a daemon's parts, with the agent's endpoints (per-instance tokens) and
    `routers` after them (`own_auth`: their prefixes that check callers themselves)."""
    return create_app(
        daemon_state(daemon),
        routers=[(agent.router, []), (code.agent_router, []), *routers],
        max_body_bytes=daemon.config.api.max_body_bytes,
        max_code_bytes=daemon.config.code.max_mib * MIB,
        own_auth=own_auth,
    )
