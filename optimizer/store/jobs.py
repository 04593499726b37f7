"""Store methods for managed jobs: attempts, what agents report, pool cooldowns, transitions.

An attempt row is written before its launch call, so a daemon killed mid-launch retries with
the same idempotency key and the provider returns the same instance.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, insert, select, update

from optimizer.model import Offer
from optimizer.store.engine import JOB, StoreBase, chunks, inserted_id, job_record, table
from optimizer.store.tables import AgentEvent, Attempt, JobRecord, NewEvent, PoolCooldown

_ATTEMPT = table(Attempt)
_AGENT_EVENT = table(AgentEvent)
_COOLDOWN = table(PoolCooldown)
# Job ids per IN (...) list: well under SQLite's 32,766 bound parameters.
ATTEMPT_IDS_PER_QUERY = 5_000

Pool = tuple[str, str, str | None, str, str]


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

    @property
    def pool(self) -> Pool:
        return (self.provider, self.region, self.zone, self.instance_type, self.market)

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


class JobsMixin(StoreBase):
    """Attempts and their reports, cooldowns, and job transitions with their events."""

    def create_attempt(
        self, job_id: int, number: int, key: str, offer: Offer, token_sha256: str, at: datetime
    ) -> AttemptRecord:
        """Record an attempt before launching it (or return the one with this key)."""
        values = {
            "job_id": job_id,
            "number": number,
            "idempotency_key": key,
            "provider": offer.provider,
            "region": offer.region,
            "zone": offer.zone or "",
            "instance_type": offer.instance_type,
            "market": offer.market.value,
            "usd_per_hour": offer.usd_per_hour,
            "state": "launching",
            "started_at": self._now(at),
            "token_sha256": token_sha256,
        }
        with self.engine.begin() as conn:
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
        with self.engine.begin() as conn:
            conn.execute(update(_ATTEMPT).where(_ATTEMPT.c.idempotency_key == key).values(**values))

    def get_job_by_id(self, job_id: int) -> JobRecord | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(JOB).where(JOB.c.id == job_id)).first()
        return None if row is None else job_record(row)

    def attempt(self, key: str) -> AttemptRecord | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(_ATTEMPT).where(_ATTEMPT.c.idempotency_key == key)).first()
        return None if row is None else _attempt(row)

    def attempts(self, job_id: int) -> list[AttemptRecord]:
        """One job's attempts in number order."""
        return self.attempts_of([job_id]).get(job_id, [])

    def attempts_of(self, job_ids: Iterable[int]) -> dict[int, list[AttemptRecord]]:
        """Every listed job's attempts in number order, in a few queries (a reconcile pass
        reads all live jobs' attempts at once instead of one query per job)."""
        out: dict[int, list[AttemptRecord]] = {}
        with self.engine.connect() as conn:
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
        """Attempts of the policy's jobs that ran at some point after `since`."""
        query = (
            select(_ATTEMPT)
            .join(JOB, JOB.c.id == _ATTEMPT.c.job_id)
            .where(JOB.c.policy == policy, _ATTEMPT.c.instance_id.is_not(None))
            .where((_ATTEMPT.c.ended_at.is_(None)) | (_ATTEMPT.c.ended_at > since))
        )
        with self.engine.connect() as conn:
            return [_attempt(r) for r in conn.execute(query).all()]

    def open_attempts(self) -> list[AttemptRecord]:
        """Attempts whose instance may still run (not known gone), any job state."""
        query = select(_ATTEMPT).where(_ATTEMPT.c.instance_gone.is_(False))
        with self.engine.connect() as conn:
            return [_attempt(r) for r in conn.execute(query).all()]

    def record_agent_events(
        self, key: str, events: Iterable[Mapping[str, Any]], at: datetime
    ) -> list[str]:
        """Record new events (by id) and fold them into the attempt; return every id seen."""
        acked: list[str] = []
        with self.engine.begin() as conn:
            for event in events:
                event_id = str(event["id"])
                acked.append(event_id)
                seen = conn.execute(
                    select(_AGENT_EVENT.c.id).where(_AGENT_EVENT.c.id == event_id)
                ).first()
                if seen is not None:
                    continue
                when = _event_time(event, at)
                data = dict(event.get("data") or {})
                conn.execute(
                    insert(_AGENT_EVENT).values(
                        id=event_id,
                        attempt_key=key,
                        kind=str(event["kind"]),
                        at=when,
                        data=json.dumps(data, sort_keys=True),
                    )
                )
                changes = _fold(str(event["kind"]), data, when)
                if changes:
                    conn.execute(
                        update(_ATTEMPT).where(_ATTEMPT.c.idempotency_key == key).values(**changes)
                    )
        return acked

    def agent_events(self, key: str) -> list[dict[str, Any]]:
        query = (
            select(_AGENT_EVENT)
            .where(_AGENT_EVENT.c.attempt_key == key)
            .order_by(_AGENT_EVENT.c.at)
        )
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        return [
            {"id": r.id, "kind": r.kind, "at": r.at, "data": json.loads(r.data or "{}")}
            for r in rows
        ]

    def add_cooldown(self, pool: Pool, until: datetime, reason: str) -> None:
        provider, region, zone, kind, market = pool
        with self.engine.begin() as conn:
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

    def cooled_pools(self, now: datetime) -> set[Pool]:
        query = select(_COOLDOWN).where(_COOLDOWN.c.until > now)
        with self.engine.connect() as conn:
            rows = conn.execute(query).all()
        return {(r.provider, r.region, r.zone or None, r.instance_type, r.market) for r in rows}

    def transition_job(
        self,
        job_id: int,
        *,
        state: str,
        reason: str,
        restarts: int | None = None,
        events: Iterable[NewEvent] = (),
        at: datetime,
    ) -> JobRecord:
        """Move a job to `state`, recording the events (with their alerts) in one transaction."""
        values: dict[str, Any] = {"state": state, "reason": reason, "updated_at": at}
        if restarts is not None:
            values["restarts"] = restarts
        with self.engine.begin() as conn:
            conn.execute(update(JOB).where(JOB.c.id == job_id).values(**values))
            for event in events:
                self._insert_event(conn, replace(event, job_id=job_id), at)
            row = conn.execute(select(JOB).where(JOB.c.id == job_id)).one()
        return job_record(row)

    def record_events(self, events: Iterable[NewEvent], at: datetime) -> None:
        with self.engine.begin() as conn:
            self._record(conn, events, at)

    def _record(self, conn: Connection, events: Iterable[NewEvent], at: datetime) -> None:
        for event in events:
            self._insert_event(conn, event, at)


def _event_time(event: Mapping[str, Any], default: datetime) -> datetime:
    raw = event.get("at")
    if isinstance(raw, str):
        try:
            parsed = datetime.fromisoformat(raw.replace("Z", "+00:00"))
        except ValueError:
            return default
        return parsed if parsed.tzinfo else default
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
    return {}
