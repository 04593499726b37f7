"""Standby start, the daemon's part (docs/standby.md): when the replacement of an interrupted
(or moved) attempt runs its job in standby, the old job keeps training until that job has
started up and waits for its go (its agent's `standby_ready`), and only then gets its stop,
so the time between the old job's last step and the new job's first is the old job's
checkpoint, the restore and the go, not the new job's imports, CUDA and model. The wait is
bounded: STANDBY_READY_WAIT after the replacement registered, or the power-off less the
checkpoint allowance (`handover.handover`), whichever comes first.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from optimizer.protocol import STANDBY_READY_EVENT
from optimizer.store import Store
from optimizer.store.jobs import AttemptRecord

# A job that asks for standby but never says it waits (it does not call `wait_for_go`, or
# hangs in its start-up) holds the old job at most this long after its agent registered: two
# minutes cover a large model's build and its data loaders (a gpuopt choice).
STANDBY_READY_WAIT = timedelta(minutes=2)


def standby_ready(store: Store, attempt: AttemptRecord, *, now: datetime) -> bool:
    """Whether the replacement attempt's job, started in standby, has started up (or ended:
    its start-up failed), or has been waited for long enough. A gang's nodes start their job
    as without standby (the rendezvous is part of the fence): nothing to wait for."""
    if attempt.nodes > 1:
        return True
    if attempt.registered_at is None:
        return False
    if now - attempt.registered_at >= STANDBY_READY_WAIT:
        return True
    return any(e["kind"] == STANDBY_READY_EVENT for e in store.jobs.agent_events(attempt.key))


__all__ = ["STANDBY_READY_WAIT", "standby_ready"]
