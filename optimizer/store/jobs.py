"""The jobs repository: jobs, their attempts, what agents report, pool cooldowns.

An attempt row is written before its launch call, so a daemon killed mid-launch retries with
the same idempotency key and the provider returns the same instance. A job's changes commit
with the events they cause (events.write_events on the same transaction).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from optimizer.clock import parse_utc
from optimizer.common.jobnames import REMOVED_MARK
from optimizer.lifecycle import TERMINAL_JOB_STATES, AttemptState
from optimizer.model import Offer, Pool
from optimizer.store.engine import (
    Database,
    DuplicateJobError,
    JobNotEndedError,
    chunks,
    inserted_id,
    job_record,
    table,
)
from optimizer.store.events import commit_time, write_event, write_events
from optimizer.store.probes import write_probe_result
from optimizer.store.records import JobRecord, NewEvent
from optimizer.store.tables import AgentEvent, Attempt, Job, PoolCooldown
from optimizer.store.telemetry import GPU_TELEMETRY, write_telemetry

_JOB = table(Job)
_ATTEMPT = table(Attempt)
_AGENT_EVENT = table(AgentEvent)
_COOLDOWN = table(PoolCooldown)
log = logging.getLogger(__name__)
_TERMINAL_STATES = sorted(TERMINAL_JOB_STATES)
# Job ids per IN (...) list: well under SQLite's 32,766 bound parameters.
ATTEMPT_IDS_PER_QUERY = 5_000

# What an attempt keeps of its agent's reports (docs/agent-protocol.md, Events): the newest of
# these kinds only, the first of those, and at most this many rows in all. An honest agent
# sends a handful of reports besides its heartbeats and telemetry; past the cap, events are
# acknowledged and not kept (a 429 would have the agent send them again for ever).
# The newest `progress` report is kept as an event too; the attempt's first and newest are
# in `attempt_progress` (store/progress.py).
LATEST_ONLY = frozenset({"heartbeat", GPU_TELEMETRY, "progress"})
ONCE_PER_ATTEMPT = frozenset({"job_started", "job_exited"})
MAX_AGENT_EVENTS_PER_ATTEMPT = 1_000
# An event's data kept past this is replaced by its size (its effects are still folded in): an
# honest report is a few KiB at most (a notice's raw payload is cut to 2 KiB by the agent).
MAX_KEPT_DATA_CHARS = 16 * 1024
PRUNE_AGENT_EVENTS = 5_000  # agent events one retention batch deletes at most


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    id: int
    job_id: int
    number: int
    key: str
    provider: str
    region: str
    zone: str | None
    instance_type: str
    market: str
    usd_per_hour: float
    instance_id: str | None
    state: str
    end_reason: str | None
    started_at: datetime
    ended_at: datetime | None
    token_sha256: str
    registered_at: datetime | None
    probe_status: str | None
    job_started_at: datetime | None
    exit_code: int | None
    notice_at: datetime | None
    stop_sent_at: datetime | None
    instance_gone: bool
    preempted: bool
    launched_at: datetime | None = None
    terminated_at: datetime | None = None
    terminated_by: str | None = None
    disk_gib: float | None = None
    log_bytes: int = 0  # the job output held for this attempt (job_log), in bytes
    log_dropped_bytes: int = 0  # and what the per-job cap dropped of it
    gang: int | None = None  # a multi-node attempt: its rank-0 row's number
    node_rank: int = 0
    nodes: int = 1
    address: str | None = None  # where the other nodes reach this one
    internode_status: str | None = None
    internode_reason: str | None = None
    placement_released_at: datetime | None = None  # a gang's placement deleted (every row)
    spare: bool = False  # launched as the job's warm spare (optimizer/jobs/spares.py)
    promoted_at: datetime | None = None  # when the spare took the job over

    @property
    def idle_spare(self) -> bool:
        """A warm spare that has not taken the job over: it never runs the job."""
        return self.spare and self.promoted_at is None

    @property
    def pool(self) -> Pool:
        return Pool(self.provider, self.region, self.zone, self.instance_type, self.market)

    @property
    def ended(self) -> bool:
        return self.ended_at is not None


def token_sha256(token: str) -> str:
    """What the store keeps of an agent's per-instance token."""
    return hashlib.sha256(token.encode()).hexdigest()


def _attempt(row: Any) -> AttemptRecord:
    m = dict(row._mapping)
    m["key"] = m.pop("idempotency_key")
    m["zone"] = m["zone"] or None
    return AttemptRecord(**m)


class Jobs:
    """Jobs and their transitions with their events, attempts and their reports, cooldowns."""

    def __init__(self, db: Database) -> None:
        self._db = db

    # -- jobs ------------------------------------------------------------------------------

    def add_job(
        self,
        name: str,
        policy: str,
        spec: Mapping[str, Any],
        *,
        at: datetime | None = None,
        event: NewEvent | None = None,
    ) -> int:
        """Create a pending job and return its id; raise DuplicateJobError if the name is taken.

        `event` (its job_id filled in here) is recorded with its alerts in the same transaction.
        """
        now = self._db.now(at)
        values = {
            "name": name,
            "policy": policy,
            "spec": json.dumps(dict(spec), sort_keys=True),
            "state": "pending",
            "restarts": 0,
            "created_at": now,
            "updated_at": now,
        }
        try:
            with self._db.begin() as conn:
                job_id = inserted_id(conn.execute(insert(_JOB).values(values)))
                if event is not None:
                    write_event(conn, replace(event, job_id=job_id), now)
        except IntegrityError as err:
            held = self.get_job(name)
            if held is not None:
                raise DuplicateJobError(name, held.state) from err
            raise
        return job_id

    def get_job(self, name: str) -> JobRecord | None:
        """The job with this name, or None (a removed job has given its name up)."""
        query = select(_JOB).where(_JOB.c.name == name, _JOB.c.removed_at.is_(None))
        with self._db.connect() as conn:
            row = conn.execute(query).first()
        return None if row is None else job_record(row)

    def get_job_by_id(self, job_id: int) -> JobRecord | None:
        with self._db.connect() as conn:
            row = conn.execute(select(_JOB).where(_JOB.c.id == job_id)).first()
        return None if row is None else job_record(row)

    def list_jobs(self) -> list[JobRecord]:
        """Every job not removed, oldest first."""
        query = select(_JOB).where(_JOB.c.removed_at.is_(None)).order_by(_JOB.c.id)
        with self._db.connect() as conn:
            return [job_record(row) for row in conn.execute(query)]

    def live_jobs(self) -> list[JobRecord]:
        """Jobs not yet succeeded, failed or cancelled, oldest first."""
        query = select(_JOB).where(_JOB.c.state.not_in(_TERMINAL_STATES)).order_by(_JOB.c.id)
        with self._db.connect() as conn:
            return [job_record(row) for row in conn.execute(query)]

    def jobs_page(
        self,
        *,
        state: str | None = None,
        before_id: int | None = None,
        limit: int = 100,
        live: bool = False,
    ) -> list[JobRecord]:
        """Jobs not removed, newest first, optionally in one state or only those that have
        not ended (`live`); page with `before_id`."""
        query = (
            select(_JOB).where(_JOB.c.removed_at.is_(None)).order_by(_JOB.c.id.desc()).limit(limit)
        )
        if state is not None:
            query = query.where(_JOB.c.state == state)
        if live:
            query = query.where(_JOB.c.state.not_in(_TERMINAL_STATES))
        if before_id is not None:
            query = query.where(_JOB.c.id < before_id)
        with self._db.connect() as conn:
            return [job_record(row) for row in conn.execute(query)]

    def job_counts(self) -> dict[str, int]:
        """Jobs not removed, per state (states with no job left out)."""
        query = (
            select(_JOB.c.state, func.count())
            .where(_JOB.c.removed_at.is_(None))
            .group_by(_JOB.c.state)
        )
        with self._db.connect() as conn:
            return {state: int(n) for state, n in conn.execute(query)}

    def policies_in_use(self) -> set[str]:
        """Policy names that live jobs run under."""
        query = select(_JOB.c.policy).where(_JOB.c.state.not_in(_TERMINAL_STATES)).distinct()
        with self._db.connect() as conn:
            return set(conn.execute(query).scalars())

    def request_cancel(
        self, name: str, *, at: datetime | None = None
    ) -> tuple[JobRecord | None, bool]:
        """Record a cancel request on a job that has not ended: (the job after, whether this
        call recorded it). The state stays as it is: the reconciler decides the request
        (optimizer.jobs.machine), terminates the job's instance and moves it to `cancelled`.
        A second request, or one for a job that already ended, changes nothing."""
        now = self._db.now(at)
        with self._db.begin() as conn:
            changed = conn.execute(
                update(_JOB)
                .where(
                    _JOB.c.name == name,
                    _JOB.c.state.not_in(_TERMINAL_STATES),
                    _JOB.c.cancel_requested_at.is_(None),
                )
                .values(cancel_requested_at=now, updated_at=now)
            ).rowcount
            row = conn.execute(select(_JOB).where(_JOB.c.name == name)).first()
        if row is None:
            return None, False
        return job_record(row), bool(changed)

    def remove_job(
        self, name: str, *, at: datetime | None = None, event: NewEvent | None = None
    ) -> JobRecord | None:
        """Take an ended job off the lists and free its name: one compare-and-set on its
        state being an ended one, which renames the row `<name>~removed~<id>`, sets
        `removed_at` and records `event` (its job_id filled in here) in the same
        transaction. The row stays: its attempts, events and costs keep pointing at its id.

        Returns the removed job, or None when no job has this name; raises JobNotEndedError
        (naming its state) for a job that has not ended.
        """
        now = self._db.now(at)
        with self._db.begin() as conn:
            row = conn.execute(
                select(_JOB).where(_JOB.c.name == name, _JOB.c.removed_at.is_(None))
            ).first()
            if row is None:
                return None
            job_id = row.id
            moved = conn.execute(
                update(_JOB)
                .where(
                    _JOB.c.id == job_id,
                    _JOB.c.removed_at.is_(None),
                    _JOB.c.state.in_(_TERMINAL_STATES),
                )
                .values(name=f"{name}{REMOVED_MARK}{job_id}", removed_at=now, updated_at=now)
            ).rowcount
            if not moved:
                # Not ended (a job never leaves an ended state, so the state read is current),
                # or removed by a concurrent call since the read.
                again = conn.execute(select(_JOB).where(_JOB.c.id == job_id)).one()
                if again.removed_at is not None:
                    return None
                raise JobNotEndedError(name, again.state)
            if event is not None:
                write_event(conn, replace(event, job_id=job_id), now)
            removed = conn.execute(select(_JOB).where(_JOB.c.id == job_id)).one()
        return job_record(removed)

    def transition_job(
        self,
        job_id: int,
        *,
        expected: str,
        state: str,
        reason: str,
        restarts: int | None = None,
        events: Iterable[NewEvent] = (),
        at: datetime,
        attempts: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> JobRecord | None:
        """Move a job from `expected` (the state its caller read) to `state`, recording the
        events (with their alerts) in one transaction. Compare-and-set: when the job is no
        longer in `expected`, nothing is written and None is returned (the caller lost a race;
        the next pass decides again from what is stored). `attempts` (attempt key -> columns,
        as `update_attempt`) are written in the same transaction: an attempt the transition
        ends is ended exactly when its events are recorded (a column set to `at` takes the
        events' time, which may come out later: see `events.commit_time`)."""
        values: dict[str, Any] = {"state": state, "reason": reason, "updated_at": at}
        if restarts is not None:
            values["restarts"] = restarts
        with self._db.begin() as conn:
            moved = conn.execute(
                update(_JOB).where(_JOB.c.id == job_id, _JOB.c.state == expected).values(**values)
            ).rowcount
            if not moved:
                return None
            when = commit_time(conn, at) if events else at
            for key, columns in (attempts or {}).items():
                timed = {name: when if value == at else value for name, value in columns.items()}
                conn.execute(
                    update(_ATTEMPT).where(_ATTEMPT.c.idempotency_key == key).values(**timed)
                )
            write_events(conn, (replace(event, job_id=job_id) for event in events), when)
            row = conn.execute(select(_JOB).where(_JOB.c.id == job_id)).one()
        return job_record(row)

    # -- attempts --------------------------------------------------------------------------

    def create_attempt(
        self,
        job_id: int,
        number: int,
        key: str,
        offer: Offer,
        token_sha256: str,
        at: datetime,
        *,
        gang: int | None = None,
        node_rank: int = 0,
        nodes: int = 1,
        spare: bool = False,
    ) -> AttemptRecord:
        """Record an attempt before launching it (or return the one with this key); a node of a
        multi-node attempt names its gang (the rank-0 row's number), rank and the gang's size;
        `spare`: the job's warm spare."""
        values = {
            "spare": spare,
            "gang": gang,
            "node_rank": node_rank,
            "nodes": nodes,
            "job_id": job_id,
            "number": number,
            "idempotency_key": key,
            "provider": offer.provider,
            "region": offer.region,
            "zone": offer.zone or "",
            "instance_type": offer.instance_type,
            "market": offer.market.value,
            "usd_per_hour": offer.usd_per_hour,
            "state": AttemptState.LAUNCHING,
            "started_at": self._db.now(at),
            "token_sha256": token_sha256,
        }
        with self._db.begin() as conn:
            found = conn.execute(select(_ATTEMPT).where(_ATTEMPT.c.idempotency_key == key)).first()
            if found is None:
                inserted_id(conn.execute(insert(_ATTEMPT).values(values)))
                found = conn.execute(
                    select(_ATTEMPT).where(_ATTEMPT.c.idempotency_key == key)
                ).first()
        return _attempt(found)

    def update_attempt(self, key: str, **values: Any) -> None:
        if "zone" in values:
            values["zone"] = values["zone"] or ""
        with self._db.begin() as conn:
            conn.execute(update(_ATTEMPT).where(_ATTEMPT.c.idempotency_key == key).values(**values))

    def record_billing(
        self,
        key: str,
        *,
        launched_at: datetime | None = None,
        terminated_at: datetime | None = None,
        terminated_by: str | None = None,
        **values: Any,
    ) -> None:
        """Record an attempt's billing facts where they are still unknown, with `values`
        (plain columns, as `update_attempt`) in the same transaction.

        Each of `launched_at`, `terminated_at` and `terminated_by` is written only where the
        row has none yet (compare-and-set on NULL): the first known value stays, and a None
        here never erases one. Writing the termination with who ended it in one transaction
        means no reader (the ledger freezing an ended attempt's cost) sees one without the
        other."""
        facts = {
            "launched_at": launched_at,
            "terminated_at": terminated_at,
            "terminated_by": terminated_by,
        }
        if "zone" in values:
            values["zone"] = values["zone"] or ""
        with self._db.begin() as conn:
            if values:
                conn.execute(
                    update(_ATTEMPT).where(_ATTEMPT.c.idempotency_key == key).values(**values)
                )
            for name, value in facts.items():
                if value is None:
                    continue
                column = _ATTEMPT.c[name]
                conn.execute(
                    update(_ATTEMPT)
                    .where(_ATTEMPT.c.idempotency_key == key, column.is_(None))
                    .values({name: value})
                )

    def attempt(self, key: str) -> AttemptRecord | None:
        with self._db.connect() as conn:
            row = conn.execute(select(_ATTEMPT).where(_ATTEMPT.c.idempotency_key == key)).first()
        return None if row is None else _attempt(row)

    def attempt_by_token(self, sha256: str) -> AttemptRecord | None:
        """The attempt whose agent token has this SHA-256 (agents are authenticated by it
        before their request is read)."""
        if not sha256:
            return None
        with self._db.connect() as conn:
            row = conn.execute(
                select(_ATTEMPT).where(_ATTEMPT.c.token_sha256 == sha256).limit(1)
            ).first()
        return None if row is None else _attempt(row)

    def attempts(self, job_id: int) -> list[AttemptRecord]:
        """One job's attempts in number order."""
        return self.attempts_of([job_id]).get(job_id, [])

    def attempts_of(self, job_ids: Iterable[int]) -> dict[int, list[AttemptRecord]]:
        """Every listed job's attempts in number order, in a few queries (a reconcile pass
        reads all live jobs' attempts at once instead of one query per job)."""
        out: dict[int, list[AttemptRecord]] = {}
        with self._db.connect() as conn:
            for chunk in chunks(dict.fromkeys(job_ids), ATTEMPT_IDS_PER_QUERY):
                query = (
                    select(_ATTEMPT)
                    .where(_ATTEMPT.c.job_id.in_(chunk))
                    .order_by(_ATTEMPT.c.job_id, _ATTEMPT.c.number)
                )
                for row in conn.execute(query):
                    record = _attempt(row)
                    out.setdefault(record.job_id, []).append(record)
        return out

    def policy_attempts(self, policy: str, since: datetime) -> list[AttemptRecord]:
        """Attempts of the policy's jobs that ran at some point after `since`, and those not
        ended (a launch under way counts before its instance is known)."""
        query = (
            select(_ATTEMPT)
            .join(_JOB, _JOB.c.id == _ATTEMPT.c.job_id)
            .where(_JOB.c.policy == policy)
            .where(
                _ATTEMPT.c.ended_at.is_(None)
                | (_ATTEMPT.c.instance_id.is_not(None) & (_ATTEMPT.c.ended_at > since))
            )
        )
        with self._db.connect() as conn:
            return [_attempt(r) for r in conn.execute(query).all()]

    def attempts_since(self, since: datetime) -> list[AttemptRecord]:
        """Every job's attempts that had an instance and had not ended by `since` (the
        history expected-cost ranking reads per pool), oldest first."""
        query = (
            select(_ATTEMPT)
            .where(_ATTEMPT.c.instance_id.is_not(None))
            .where(_ATTEMPT.c.ended_at.is_(None) | (_ATTEMPT.c.ended_at > since))
            .order_by(_ATTEMPT.c.id)
        )
        with self._db.connect() as conn:
            return [_attempt(r) for r in conn.execute(query).all()]

    def unreleased_gangs(self, providers: Iterable[str]) -> list[list[AttemptRecord]]:
        """The rows of every gang on `providers` whose placement is not known deleted, one
        list per gang in rank order (gangs in attempt order)."""
        names = list(providers)
        if not names:
            return []
        query = (
            select(_ATTEMPT)
            .where(_ATTEMPT.c.gang.is_not(None), _ATTEMPT.c.placement_released_at.is_(None))
            .where(_ATTEMPT.c.provider.in_(names))
            .order_by(_ATTEMPT.c.id)
        )
        gangs: dict[tuple[int, int], list[AttemptRecord]] = {}
        with self._db.connect() as conn:
            for row in conn.execute(query).all():
                a = _attempt(row)
                gangs.setdefault((a.job_id, a.gang or 0), []).append(a)
        return [sorted(rows, key=lambda a: a.node_rank) for rows in gangs.values()]

    def mark_placement_released(self, job_id: int, gang: int, at: datetime) -> None:
        """Record on every row of the gang that its placement is deleted."""
        with self._db.begin() as conn:
            conn.execute(
                update(_ATTEMPT)
                .where(_ATTEMPT.c.job_id == job_id, _ATTEMPT.c.gang == gang)
                .values(placement_released_at=self._db.now(at))
            )

    def open_attempts(self) -> list[AttemptRecord]:
        """Attempts whose instance may still run (not known gone), any job state."""
        query = select(_ATTEMPT).where(_ATTEMPT.c.instance_gone.is_(False))
        with self._db.connect() as conn:
            return [_attempt(r) for r in conn.execute(query).all()]

    # -- what agents report ------------------------------------------------------------------

    def record_agent_events(
        self,
        key: str,
        events: Iterable[Mapping[str, Any]],
        at: datetime,
        *,
        on_host: bool = False,
    ) -> list[str]:
        """Record new events (by id) and fold them into the attempt; return every id seen.

        A new `probe_result` is also stored as a probe result (`store.probes`), and a new
        `gpu_telemetry` as the attempt's GPU spans (`store.telemetry`; the event keeps only
        their count), on the same transaction; `on_host` marks the attempt's instance as one
        on the daemon's own host (the local cloud), whose probe figures are the host's, not
        the type's (`store.probes`: source `host`, or `simulated` without a GPU).

        What an attempt keeps is bounded: only its newest `heartbeat` and `gpu_telemetry` (a
        newer one replaces the row; the spans are stored per minute anyway), its first
        `job_started` and `job_exited` (a later one, under another id, changes nothing), and
        an event of any other kind only while it holds fewer than MAX_AGENT_EVENTS_PER_ATTEMPT
        rows (past that it is neither kept nor folded in). Bar those two, a row's data
        is at most MAX_KEPT_DATA_CHARS. Every event is acknowledged, kept or not, so an agent
        never sends one again for ever."""
        acked: list[str] = []
        dropped = 0
        with self._db.begin() as conn:
            held: int | None = None
            for event in events:
                event_id = str(event["id"])
                acked.append(event_id)
                seen = conn.execute(
                    select(_AGENT_EVENT.c.id).where(_AGENT_EVENT.c.id == event_id)
                ).first()
                if seen is not None:
                    continue
                kind = str(event["kind"])
                when = _event_time(event, at)
                data = dict(event.get("data") or {})
                if kind in LATEST_ONLY:
                    if not _replace_latest(conn, key, kind, when):
                        continue
                elif kind not in ONCE_PER_ATTEMPT:
                    if held is None:
                        held = _held(conn, key)
                    if held >= MAX_AGENT_EVENTS_PER_ATTEMPT:
                        dropped += 1
                        continue
                    held += 1
                changes = _fold(kind, data, when)
                if kind in ONCE_PER_ATTEMPT:
                    # Compare-and-set on the attempt's column: the first report wins, even
                    # against a concurrent request.
                    column = next(iter(changes))
                    first = conn.execute(
                        update(_ATTEMPT)
                        .where(_ATTEMPT.c.idempotency_key == key, _ATTEMPT.c[column].is_(None))
                        .values(**changes)
                    ).rowcount
                    if not first:
                        continue
                    changes = {}
                kept = data
                if kind == GPU_TELEMETRY:
                    kept = write_telemetry(conn, self._db.dialect, key, data)
                text = json.dumps(kept, sort_keys=True)
                if len(text) > MAX_KEPT_DATA_CHARS and kind not in ONCE_PER_ATTEMPT:
                    text = json.dumps({"dropped_chars": len(text)})
                conn.execute(
                    insert(_AGENT_EVENT).values(
                        id=event_id, attempt_key=key, kind=kind, at=when, data=text
                    )
                )
                if kind == "probe_result":
                    write_probe_result(conn, key, data, when, on_host=on_host)
                if changes:
                    conn.execute(
                        update(_ATTEMPT).where(_ATTEMPT.c.idempotency_key == key).values(**changes)
                    )
        if dropped:
            log.warning(
                "attempt %s: %d agent event(s) acknowledged but not kept: it holds the most "
                "an attempt may (%d)",
                key,
                dropped,
                MAX_AGENT_EVENTS_PER_ATTEMPT,
            )
        return acked

    def seen_agent_events(self, ids: Iterable[str]) -> set[str]:
        """Which of these agent event ids are recorded already."""
        found: set[str] = set()
        with self._db.connect() as conn:
            for part in chunks(dict.fromkeys(ids), ATTEMPT_IDS_PER_QUERY):
                query = select(_AGENT_EVENT.c.id).where(_AGENT_EVENT.c.id.in_(part))
                found.update(conn.execute(query).scalars())
        return found

    def prune_agent_events(self, *, ended_before: datetime, limit: int = PRUNE_AGENT_EVENTS) -> int:
        """Delete up to `limit` agent events of attempts that ended before `ended_before` with
        their instance gone; returns how many went (fewer than `limit`: nothing more to prune).
        Their `job_exited` stays (one row an attempt): the cost ledger reads when the job
        exited."""
        cutoff = self._db.now(ended_before, "ended_before")
        old = select(_ATTEMPT.c.idempotency_key).where(
            _ATTEMPT.c.ended_at < cutoff, _ATTEMPT.c.instance_gone.is_(True)
        )
        ids = (
            select(_AGENT_EVENT.c.id)
            .where(_AGENT_EVENT.c.attempt_key.in_(old), _AGENT_EVENT.c.kind != "job_exited")
            .limit(limit)
        )
        with self._db.begin() as conn:
            doomed = list(conn.execute(ids).scalars())
            for part in chunks(doomed, ATTEMPT_IDS_PER_QUERY):
                conn.execute(delete(_AGENT_EVENT).where(_AGENT_EVENT.c.id.in_(part)))
        return len(doomed)

    def agent_events(self, key: str) -> list[dict[str, Any]]:
        query = (
            select(_AGENT_EVENT)
            .where(_AGENT_EVENT.c.attempt_key == key)
            .order_by(_AGENT_EVENT.c.at)
        )
        with self._db.connect() as conn:
            rows = conn.execute(query).all()
        return [
            {"id": r.id, "kind": r.kind, "at": r.at, "data": json.loads(r.data or "{}")}
            for r in rows
        ]

    def exit_reports(self, keys: Iterable[str]) -> dict[str, dict[str, Any]]:
        """The `data` of each attempt's `job_exited` report, by attempt key (attempts whose
        agent has not reported one are left out)."""
        out: dict[str, dict[str, Any]] = {}
        with self._db.connect() as conn:
            for part in chunks(dict.fromkeys(keys), ATTEMPT_IDS_PER_QUERY):
                query = select(_AGENT_EVENT.c.attempt_key, _AGENT_EVENT.c.data).where(
                    _AGENT_EVENT.c.attempt_key.in_(part), _AGENT_EVENT.c.kind == "job_exited"
                )
                for key, data in conn.execute(query):
                    out[key] = json.loads(data or "{}")
        return out

    # -- pool cooldowns ----------------------------------------------------------------------

    def add_cooldown(self, pool: Pool, until: datetime, reason: str) -> None:
        provider, region, zone, kind, market = pool
        with self._db.begin() as conn:
            conn.execute(
                insert(_COOLDOWN).values(
                    provider=provider,
                    region=region,
                    zone=zone or "",
                    instance_type=kind,
                    market=market,
                    until=until,
                    reason=reason,
                )
            )

    def end_cooldowns(self, provider: str, now: datetime) -> int:
        """End now every cooldown of `provider`'s pools still running at `now` (its capacity
        came back: an owned machine freed GPUs); how many were ended."""
        with self._db.begin() as conn:
            done = conn.execute(
                update(_COOLDOWN)
                .where(_COOLDOWN.c.provider == provider, _COOLDOWN.c.until > now)
                .values(until=now)
            )
        return int(done.rowcount or 0)

    def cooldown_ends(self, since: datetime) -> dict[Pool, datetime]:
        """Each pool's latest cooldown end, for pools whose cooldown ends after `since`
        (whether it is over by now or not): when each became, or becomes, available again."""
        t = _COOLDOWN
        query = (
            select(
                t.c.provider,
                t.c.region,
                t.c.zone,
                t.c.instance_type,
                t.c.market,
                func.max(t.c.until),
            )
            .where(t.c.until > since)
            .group_by(t.c.provider, t.c.region, t.c.zone, t.c.instance_type, t.c.market)
        )
        with self._db.connect() as conn:
            rows = conn.execute(query).all()
        return {
            Pool(p, r, z or None, k, m): until if until.tzinfo else until.replace(tzinfo=UTC)
            for p, r, z, k, m, until in rows
        }

    def cooled_pools(self, now: datetime) -> set[Pool]:
        query = select(_COOLDOWN).where(_COOLDOWN.c.until > now)
        with self._db.connect() as conn:
            rows = conn.execute(query).all()
        return {Pool(r.provider, r.region, r.zone or None, r.instance_type, r.market) for r in rows}


def _replace_latest(conn: Connection, key: str, kind: str, at: datetime) -> bool:
    """Make room for an attempt's newest event of a kind it keeps one of: delete the rows
    held of it unless one is newer than `at` (then False: keep that one, store nothing)."""
    newest = conn.execute(
        select(func.max(_AGENT_EVENT.c.at)).where(
            _AGENT_EVENT.c.attempt_key == key, _AGENT_EVENT.c.kind == kind
        )
    ).scalar_one_or_none()
    if newest is not None and (newest if newest.tzinfo else newest.replace(tzinfo=UTC)) > at:
        return False
    conn.execute(
        delete(_AGENT_EVENT).where(_AGENT_EVENT.c.attempt_key == key, _AGENT_EVENT.c.kind == kind)
    )
    return True


def _held(conn: Connection, key: str) -> int:
    """How many agent events the attempt holds."""
    query = select(func.count()).select_from(_AGENT_EVENT).where(_AGENT_EVENT.c.attempt_key == key)
    return int(conn.execute(query).scalar_one())


def _event_time(event: Mapping[str, Any], default: datetime) -> datetime:
    """The agent's time for an event, when it is an ISO time with a zone that is a UTC time
    the store can hold; else `default` (when it arrived)."""
    raw = event.get("at")
    if isinstance(raw, str):
        try:
            parsed = parse_utc(raw)
            # At the calendar's edge a zone's offset can carry a time past year 9999 in UTC.
            return parsed.astimezone(UTC) if parsed.tzinfo else default
        except (ValueError, OverflowError):
            return default
    return default


def _fold(kind: str, data: Mapping[str, Any], at: datetime) -> dict[str, Any]:
    """What an agent event changes on its attempt row."""
    if kind == "probe_result":
        status = str(data.get("status", "fail"))
        return {"probe_status": status if status in ("pass", "warn", "fail") else "fail"}
    if kind == "job_started":
        return {"job_started_at": at}
    if kind == "job_exited":
        code = data.get("exit_code")
        return {
            "exit_code": int(code) if isinstance(code, int) else 128 + int(data.get("signal") or 9)
        }
    if kind == "interruption_notice":
        return {"notice_at": at}
    if kind == "internode_probe":
        status = str(data.get("status", "fail"))
        return {
            "internode_status": status if status in ("pass", "warn", "fail") else "fail",
            "internode_reason": str(data.get("reason") or "")[:2000] or None,
        }
    return {}
