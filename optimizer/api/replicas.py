"""/replicas: every daemon process on this store, which one leads, and which one answered.

With several replicas behind one Service, any of them answers with the same list (it comes
from the shared store); `answered_by` names the one that did.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from optimizer import answers
from optimizer.api.state import StateDep, utc_text
from optimizer.daemon.leader import HEARTBEAT_S, STALE_AFTER

router = APIRouter(tags=["replicas"])

# A replica that missed this many heartbeats is shown as not alive (its row is pruned by
# the leader once it is STALE_AFTER old).
MISSED_BEATS = 3


@router.get("/replicas", response_model=answers.ReplicaList)
def list_replicas(state: StateDep) -> dict[str, Any]:
    """Replicas seen in the last minute, the leader first."""
    now = state.clock()
    rows = state.store.replicas.seen(since=now - STALE_AFTER)
    leaders = [r.id for r in rows if r.role == "leader"]
    return {
        "leader": leaders[0] if leaders else None,
        "answered_by": state.extras.get("replica"),
        "replicas": [
            {
                "id": r.id,
                "role": r.role,
                "host": r.host,
                "pid": r.pid,
                "version": r.version,
                "api_url": r.api_url,
                "started_at": utc_text(r.started_at),
                "leader_since": utc_text(r.leader_since),
                "heartbeat_at": utc_text(r.heartbeat_at),
                "alive": (now - r.heartbeat_at).total_seconds() <= MISSED_BEATS * HEARTBEAT_S,
            }
            for r in rows
        ],
    }
