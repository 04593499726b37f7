"""What the state machine sees of stored attempts, and the view one reconcile pass reads.

`PassView` is built once per pass (reconcile.py), after the describe step has recorded what
the clouds report: the live jobs and every attempt of each, read in one go. The migration
pass, the per-job pass and the clean-up read it (the clean-up reads the attempts again: the
per-job pass has just ended some). The folds here turn stored rows into the state machine's
views (`machine.AttemptView`): one attempt, a gang folded into one, the power-off an
interruption notice announced, and whether a job finished on its own during a handover. The
fence (fence.py) reads the same folds, so the API and the reconciler see attempts alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from optimizer.jobs.context import ReconcileContext
from optimizer.jobs.gang import fold
from optimizer.jobs.machine import AttemptView, finished_on
from optimizer.jobs.migration import Move
from optimizer.lifecycle import HANDED_OVER, AttemptEnd, JobState
from optimizer.lifecycle import LIVE_JOB_STATES as LIVE
from optimizer.model import Market
from optimizer.protocol import power_off_time
from optimizer.store import JobRecord, Store
from optimizer.store.jobs import AttemptRecord
from policies.deadline import Decision, Situation


@dataclass(frozen=True, slots=True)
class Watched:
    """A job with a deadline at one pass (deadlines.py): its deadline, situation and the
    deadline strategy's decision (both None while its work left is not known), whether it
    is missed, and the markets a launch for it uses (None: the policy's)."""

    deadline: datetime
    situation: Situation | None
    decision: Decision | None
    missed: bool
    markets: tuple[Market, ...] | None


@dataclass(frozen=True, slots=True)
class PassView:
    """One pass's reading of the live jobs: built once, read by every pass after describe."""

    live: tuple[JobRecord, ...]  # the jobs in a live state, as the pass's context lists them
    attempts: Mapping[int, list[AttemptRecord]]  # job id -> its attempts, oldest first
    # The migration pass's decisions (values), job id -> its move: the per-job pass applies one
    # where the job is healthy and running, as the move was decided for.
    moves: dict[int, Move] = field(default_factory=dict)
    # The deadline pass's reading of each live job with a deadline (deadlines.py): the
    # per-job pass launches it on the markets the deadline strategy chose.
    deadlines: dict[int, Watched] = field(default_factory=dict)

    @classmethod
    def read(cls, ctx: ReconcileContext) -> PassView:
        live = tuple(job for job in ctx.jobs if JobState(job.state) in LIVE)
        return cls(live, ctx.store.jobs.attempts_of(job.id for job in live))

    def open_keys(self) -> set[str]:
        """The keys of the live jobs' attempts that have not ended."""
        return {a.key for rows in self.attempts.values() for a in rows if not a.ended}


def current_rows(attempts: list[AttemptRecord]) -> list[AttemptRecord]:
    """The rows of the job's newest open attempt, rank 0 first ([] when none is open); an idle
    warm spare (spares.py) is not the job's attempt until it takes the job over."""
    current = next((a for a in reversed(attempts) if not a.ended and not a.idle_spare), None)
    return gang_rows(attempts, current)


def gang_rows(attempts: list[AttemptRecord], current: AttemptRecord | None) -> list[AttemptRecord]:
    """The rows of `current`'s attempt, rank 0 first ([current] for a single node)."""
    if current is None:
        return []
    if current.gang is None:
        return [current]
    rows = [a for a in attempts if a.gang == current.gang]
    return sorted(rows, key=lambda a: a.node_rank)


def gang_head(attempts: list[AttemptRecord]) -> AttemptRecord:
    """The newest attempt's rank-0 row."""
    last = attempts[-1]
    return gang_rows(attempts, last)[0]


def gang_view(store: Store, nodes: list[AttemptRecord]) -> AttemptView:
    """The attempt as the state machine sees it: a gang folded into one (gang.fold)."""
    failed = exit_failures(store, nodes)
    views = [
        attempt_view(n, power_off_at=power_off_at(store, n), failure=failed.get(n.key))
        for n in nodes
    ]
    if len(nodes) == 1:
        return attempt_view(nodes[0], failure=failed.get(nodes[0].key))
    internode = {n.node_rank: (n.internode_status, n.internode_reason) for n in nodes}
    return fold(views, internode=internode)


def _notices(store: Store, a: AttemptRecord) -> list[dict[str, Any]]:
    if a.notice_at is None:
        return []
    return [e for e in store.jobs.agent_events(a.key) if e["kind"] == "interruption_notice"]


def power_off_at(store: Store, a: AttemptRecord) -> datetime | None:
    """When the instance of an attempt with an interruption notice goes (None: no notice)."""
    times = [power_off_time(e["data"], e["at"]) for e in _notices(store, a)]
    return min((t for t in times if t is not None), default=None)


def preempting(store: Store, a: AttemptRecord) -> bool:
    """Whether a notice says the cloud is already ending the instance, rather than announcing
    an end: GCP's `preempted` comes with the VM's soft power-off, and the VM is stopped 30 s
    later (Compute Engine's Spot VM preemption process), whatever gpuopt does."""
    return any(e["data"].get("action") == "preempted" for e in _notices(store, a))


def finished_keys(store: Store, attempts: list[AttemptRecord]) -> frozenset[str]:
    """The attempts among `attempts` ended by a handover (a notice, a move) whose job then
    exited 0 on its own: its agent's `job_exited` says no stop reached it (rank 0's, for a
    gang). Reads the agents' reports only for attempts that exited 0 after such an end."""
    exited = [
        a.key
        for a in attempts
        if a.ended and a.exit_code == 0 and a.end_reason in HANDED_OVER and a.node_rank == 0
    ]
    if not exited:
        return frozenset()
    reports = store.jobs.exit_reports(exited)
    return frozenset(
        key
        for key, data in reports.items()
        if data.get("exit_code") == 0 and data.get("stopped") is False and not data.get("adopted")
    )


def finished_earlier(
    store: Store, attempts: list[AttemptRecord], current: list[AttemptRecord]
) -> int | None:
    """The attempt (its number) on which the job finished during its handover, if it did
    (`machine.finished_on`): an earlier one than `current`'s rows."""
    mine = {a.key for a in current}
    done = finished_keys(store, [a for a in attempts if a.key not in mine])
    if not done:
        return None
    heads = [attempt_view(a, finished=a.key in done) for a in attempts if a.node_rank == 0]
    found = finished_on(heads)
    return None if found is None else found.number


def exit_failures(
    store: Store, nodes: list[AttemptRecord]
) -> dict[str, tuple[str | None, str | None]]:
    """(phase, error) of each attempt among `nodes` that exited non-zero, from its agent's
    `job_exited` report; reads the reports only when one did."""
    failed = [n.key for n in nodes if n.exit_code not in (None, 0)]
    if not failed:
        return {}
    return {
        key: (_text(data.get("phase")), _text(data.get("error")))
        for key, data in store.jobs.exit_reports(failed).items()
    }


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def attempt_view(
    a: AttemptRecord,
    *,
    power_off_at: datetime | None = None,
    finished: bool = False,
    failure: tuple[str | None, str | None] | None = None,
) -> AttemptView:
    """An attempt as the state machine sees it (`finished`: see `finished_keys`; `failure`:
    see `exit_failures`)."""
    phase, error = failure or (None, None)
    return AttemptView(
        number=a.number,
        key=a.key,
        pool=a.pool,
        launched_at=a.started_at,
        registered=a.registered_at is not None,
        probe_status=a.probe_status,
        job_started=a.job_started_at is not None,
        exit_code=a.exit_code,
        interruption_notice_at=a.notice_at,
        instance_gone=a.instance_gone,
        preempted=a.preempted,
        stop_sent=a.stop_sent_at is not None,
        power_off_at=power_off_at,
        instance_launched_at=a.launched_at,
        migrated=a.end_reason == AttemptEnd.MIGRATED,
        finished=finished,
        exit_phase=phase,
        exit_error=error,
    )


__all__ = [
    "PassView",
    "Watched",
    "attempt_view",
    "current_rows",
    "finished_earlier",
    "finished_keys",
    "gang_head",
    "gang_rows",
    "gang_view",
    "power_off_at",
    "preempting",
]
