"""The fence, decided here: why an attempt's agent must not start the job yet.

The agent API (optimizer/api/agent.py) answers every register and events call with the
fence; it asks `fence_for` and adds nothing of its own. The daemon lifts the fence once
every earlier attempt's job has exited or its instance is seen gone (`handover.fence`), so
two runs never overlap; the announced power-off lifts it only well after it has passed, with
a `job.fence_lifted` event. It never lifts it for an attempt the daemon has ended before its
job started (a cancel, or a job that finished on an earlier attempt meanwhile): the stop
comes with the answers. A gang's node then waits for the gang (`gang.gate`): every node
registered and probed, then the inter-node probe passed.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from optimizer.jobs.context import EventDrafter
from optimizer.jobs.gang import Gate, Node, gate, head_number
from optimizer.jobs.handover import FENCE_CLOCK_MARGIN, fence, lifted_on_clock
from optimizer.jobs.machine import AttemptView
from optimizer.jobs.spec import DEFAULT_PROBES, job_spec
from optimizer.jobs.views import attempt_view, finished_keys, power_off_at
from optimizer.model import EventKind
from optimizer.store import Store
from optimizer.store.jobs import AttemptRecord


def fence_for(
    store: Store, emitter: EventDrafter, attempt: AttemptRecord, *, now: datetime
) -> str | None:
    """Why the attempt's agent must wait before starting the job (None: it may start it)."""
    if attempt.job_started_at is not None:
        return None
    head = head_number(attempt.number, attempt.gang)
    if attempt.ended:
        return f"attempt {head} has ended ({attempt.end_reason or 'ended'})"
    if attempt.idle_spare:  # it idles, registered and probed, until it takes the job over
        return f"attempt {head} is the job's warm spare"
    every = store.jobs.attempts(attempt.job_id)
    before = [a for a in every if head_number(a.number, a.gang) < head]
    done = finished_keys(store, before)
    # Every earlier attempt whose job started: one still running holds the fence, and one that
    # started after an attempt whose job finished takes the job over (`machine.finished_on`).
    # A gang's nodes go by their rank 0's number.
    earlier = [a for a in before if a.key in done or a.job_started_at is not None]
    finals = _final_checkpoints(store, attempt, earlier)
    views = [
        replace(
            attempt_view(a, power_off_at=power_off_at(store, a), finished=a.key in done),
            number=head_number(a.number, a.gang),
            final_checkpoint=a.id in finals,
        )
        for a in earlier
    ]
    why = fence(views, now=now)
    if why is None:
        for old in lifted_on_clock(views, now=now):
            _record_clock_lift(store, emitter, attempt, old, now)
    if why is None and attempt.nodes > 1:
        why = gang_gate(store, attempt, every).why
    return why


def _final_checkpoints(
    store: Store, attempt: AttemptRecord, earlier: list[AttemptRecord]
) -> set[int]:
    """The earlier attempts (ids) whose final checkpoint is committed to the job's bucket;
    none for a job without `checkpoint` (its attempts share a folder: only the exit counts)."""
    if not earlier:
        return set()
    job = store.jobs.get_job_by_id(attempt.job_id)
    if job is None or job_spec(job).checkpoint is None:
        return set()
    return store.checkpoints.final_committed(a.id for a in earlier)


def _record_clock_lift(
    store: Store, emitter: EventDrafter, attempt: AttemptRecord, old: AttemptView, now: datetime
) -> None:
    """Record (once per earlier attempt) that the fence let the job start on the clock
    alone: nothing said that attempt's job had exited, so the runs may overlap."""
    job = store.jobs.get_job_by_id(attempt.job_id)
    name = job.given_name if job is not None else str(attempt.job_id)
    off = old.power_off_at.isoformat(timespec="seconds") if old.power_off_at else "?"
    margin = FENCE_CLOCK_MARGIN.total_seconds()
    dedupe = f"attempt:{old.key}:fence-lifted-on-clock"
    event = emitter.draft(
        EventKind.JOB_FENCE_LIFTED,
        f"job {name}: attempt {head_number(attempt.number, attempt.gang)} starts the job on the "
        f"clock: attempt {old.number}'s job never reported its exit and its instance was never "
        f"seen gone, {margin:.0f} s after the power-off announced for {off}",
        severity="warning",
        policy=job.policy if job is not None else None,
        job_id=attempt.job_id,
        data={
            "job": name,
            "attempt": head_number(attempt.number, attempt.gang),
            "earlier_attempt": old.number,
            "power_off_at": None if old.power_off_at is None else old.power_off_at.isoformat(),
            "margin_s": margin,
        },
        dedupe_key=dedupe,
    )
    store.events.record_once(
        event,
        since=old.power_off_at or now,
        same=lambda e: (
            (e.data or {}).get("earlier_attempt") == old.number and e.job_id == attempt.job_id
        ),
    )


def gang_nodes(attempt: AttemptRecord, every: list[AttemptRecord]) -> list[Node]:
    """The nodes of `attempt`'s gang as the gang's gate sees them (`every`: the job's rows)."""
    return [
        Node(
            rank=a.node_rank,
            registered=a.registered_at is not None,
            address=a.address,
            probe_status=a.probe_status,
            internode_status=a.internode_status,
        )
        for a in every
        if a.gang == attempt.gang
    ]


def gang_gate(store: Store, attempt: AttemptRecord, every: list[AttemptRecord]) -> Gate:
    """The gang's part of the fence, and whether to run the inter-node probe now."""
    job = store.jobs.get_job_by_id(attempt.job_id)
    probes = DEFAULT_PROBES if job is None else job_spec(job).probes
    return gate(gang_nodes(attempt, every), probes=probes)


__all__ = ["fence_for", "gang_gate", "gang_nodes"]
