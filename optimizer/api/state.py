"""What the HTTP API reads and acts through; the daemon builds one and hands it to
`create_app`. Handlers reach it with the `StateDep` dependency (`request.app.state.gpuopt`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import Depends, Request
from pydantic import SecretStr

from optimizer import clock
from optimizer.alerts.outbox import Emitter
from optimizer.api.followers import FollowerSlots
from optimizer.api.throttle import AuthThrottle
from optimizer.clock import Clock
from optimizer.code import CodeStore
from optimizer.daemon.metrics import Metrics
from optimizer.daemon.policies import PolicyRegistry
from optimizer.jobs.measured import DEFAULT_WINDOW, ProbeWindow
from optimizer.jobs.state import RegionLookup, bucket_region
from optimizer.store import Store
from optimizer.store.logs import DEFAULT_MAX_BYTES_PER_JOB

# Ids are 64-bit integers in the store: a number past them is a 422, not a database error.
MAX_ID = 2**63 - 1
MIN_ID = -(2**63)


def _always_ready() -> tuple[bool, dict[str, Any]]:
    return True, {}


class Changes:
    """Counts that only grow, one per key (a job's id), bumped from any thread: how often
    something changed (the job's output arriving), so a waiter can notice a change without
    asking the store."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[int, int] = {}

    def bump(self, key: int) -> None:
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + 1

    def count(self, key: int) -> int:
        return self._counts.get(key, 0)


@dataclass
class ApiState:
    """The daemon's parts the API uses. `wakeup.set()` asks for a reconcile pass now;
    `ready()` answers /readyz; `stopping` is set when the daemon begins to stop (streams that
    follow a job's output end then); `log_changes` counts, per job, the output chunks this
    replica took (its followers look at the store at once); `max_log_bytes_per_job` is
    logs.max_bytes_per_job; `followers` counts the answers following job logs against
    logs.max_followers_per_job and logs.max_followers;
    `auth_throttle` counts wrong tokens per client address (optimizer/api/throttle.py);
    `bucket_region` reads a checkpoint bucket's region at submit (optimizer/jobs/state.py);
    `code` keeps the code archives (None: this API takes none);
    `extras` is room for later areas (the agent's token table)."""

    store: Store
    policies: PolicyRegistry
    emitter: Emitter
    metrics: Metrics
    clock: Clock
    token: SecretStr
    wakeup: threading.Event = field(default_factory=threading.Event)
    ready: Callable[[], tuple[bool, dict[str, Any]]] = _always_ready
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    stopping: threading.Event = field(default_factory=threading.Event)
    log_changes: Changes = field(default_factory=Changes)
    max_log_bytes_per_job: int = DEFAULT_MAX_BYTES_PER_JOB
    followers: FollowerSlots = field(default_factory=FollowerSlots)  # of job logs, capped
    probe_window: ProbeWindow = DEFAULT_WINDOW  # the daemon config's `probes:`
    auth_throttle: AuthThrottle = field(default_factory=AuthThrottle)
    bucket_region: RegionLookup = bucket_region
    code: CodeStore | None = None
    extras: dict[str, Any] = field(default_factory=dict)


def get_state(request: Request) -> ApiState:
    state: ApiState = request.app.state.gpuopt
    return state


StateDep = Annotated[ApiState, Depends(get_state)]


def utc_text(value: datetime | None) -> str | None:
    if value is None:
        return None
    return clock.utc_text(value)
