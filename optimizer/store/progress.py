"""The progress repository: per attempt, the first and the newest progress report its job
made (docs/progress.md), from which the jobs layer works out speeds and ETAs
(optimizer/jobs/progress.py).

Rows come from the agents' `progress` events (optimizer/api/agent.py). A report older than
the row's newest changes nothing (an agent that sends one again, or late); a report of fewer
steps than the newest (the job went back to an earlier checkpoint within the attempt) starts
the attempt's measurement again from it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime

from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError

from optimizer.store.engine import Database, chunks, table
from optimizer.store.records import ProgressRecord
from optimizer.store.tables import AttemptProgress

_PROGRESS = table(AttemptProgress)
_IDS_PER_QUERY = 5_000


class Progress:
    """Each attempt's first and newest progress report."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def record(
        self,
        *,
        job_id: int,
        attempt_id: int,
        instance_type: str,
        step: int,
        total: int | None,
        at: datetime,
    ) -> ProgressRecord | None:
        """Fold one report into the attempt's row (module docstring); the row as it is now,
        None when the report was older than the newest held (nothing changed). A report
        without `total` keeps the total given before."""
        when = self._db.now(at)
        for _ in range(2):  # a concurrent first report inserts first: update it instead
            try:
                return self._record(job_id, attempt_id, instance_type, step, total, when)
            except IntegrityError:
                continue
        return None

    def _record(
        self,
        job_id: int,
        attempt_id: int,
        instance_type: str,
        step: int,
        total: int | None,
        at: datetime,
    ) -> ProgressRecord | None:
        with self._db.begin() as conn:
            row = conn.execute(
                select(_PROGRESS).where(_PROGRESS.c.attempt_id == attempt_id)
            ).first()
            if row is None:
                first = ProgressRecord(
                    attempt_id, job_id, instance_type, step, at, step, at, total, reports=1
                )
                conn.execute(
                    insert(_PROGRESS).values(
                        {n: getattr(first, n) for n in ProgressRecord.__dataclass_fields__}
                    )
                )
                return first
            held = ProgressRecord(**row._mapping)
            if at <= held.at:
                return None
            restart = step < held.step  # back to an earlier checkpoint: measure from here
            now = replace(
                held,
                step=step,
                at=at,
                total=total if total is not None else held.total,
                reports=held.reports + 1,
                first_step=step if restart else held.first_step,
                first_at=at if restart else held.first_at,
            )
            changes = {
                name: getattr(now, name)
                for name in ("step", "at", "total", "reports", "first_step", "first_at")
            }
            conn.execute(
                update(_PROGRESS).where(_PROGRESS.c.attempt_id == attempt_id).values(changes)
            )
        return now

    def of_job(self, job_id: int) -> list[ProgressRecord]:
        """The job's attempts' progress, oldest first (by first report)."""
        return self.of_jobs([job_id]).get(job_id, [])

    def of_jobs(self, job_ids: Iterable[int]) -> dict[int, list[ProgressRecord]]:
        """Each job's attempts' progress, oldest first; a job without any is left out."""
        ids = list(dict.fromkeys(job_ids))
        out: dict[int, list[ProgressRecord]] = {}
        with self._db.connect() as conn:
            for part in chunks(ids, _IDS_PER_QUERY):
                query = (
                    select(_PROGRESS)
                    .where(_PROGRESS.c.job_id.in_(part))
                    .order_by(_PROGRESS.c.first_at, _PROGRESS.c.attempt_id)
                )
                for row in conn.execute(query):
                    found = ProgressRecord(**row._mapping)
                    out.setdefault(found.job_id, []).append(found)
        return out


__all__ = ["Progress"]
