"""The checkpoints repository: what each attempt uploaded to its job's bucket, what it
restored from there, and what was pruned.

Rows come from the agents' reports (optimizer/api/agent.py): one `checkpoint` row per
attempt and checkpoint name, one `checkpoint_restore` row per attempt and restored name, so a
report the agent sends again adds nothing (and its event is not recorded twice: a row and its
event are written in one transaction). The cost ledger reads them for storage and egress.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, insert, select, update
from sqlalchemy.exc import IntegrityError

from optimizer.store.engine import Database, chunks, table
from optimizer.store.events import write_event
from optimizer.store.records import CheckpointRecord, NewEvent, RestoreRecord
from optimizer.store.tables import Checkpoint, CheckpointRestore

_CHECKPOINT = table(Checkpoint)
_RESTORE = table(CheckpointRestore)
_IDS_PER_QUERY = 5_000


class Checkpoints:
    """Checkpoints in object storage and their restores, per job and attempt."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def add_checkpoint(
        self,
        *,
        job_id: int,
        attempt_id: int,
        name: str,
        step: int | None,
        size_bytes: int,
        files: int,
        uri: str,
        provider: str,
        region: str | None,
        committed_at: datetime,
        upload_s: float,
        final: bool,
        event: NewEvent | None = None,
    ) -> bool:
        """Record a committed checkpoint, and `event` (its job_id filled in) with it; False
        when the attempt already reported this name (nothing is written)."""
        when = self._db.now(committed_at)
        values: dict[str, Any] = {
            "job_id": job_id,
            "attempt_id": attempt_id,
            "name": name,
            "step": step,
            "size_bytes": size_bytes,
            "files": files,
            "uri": uri,
            "provider": provider,
            "region": region,
            "committed_at": when,
            "upload_s": upload_s,
            "final": final,
        }
        held = select(_CHECKPOINT.c.id).where(
            _CHECKPOINT.c.attempt_id == attempt_id, _CHECKPOINT.c.name == name
        )
        if final and self._refinal(values, held, job_id, event, when):
            return True
        return self._add_once(_CHECKPOINT, values, held, job_id, event, when)

    def _refinal(
        self, values: dict[str, Any], held: Any, job_id: int, event: NewEvent | None, at: datetime
    ) -> bool:
        """A final checkpoint under a name the attempt already reported as not final: the job
        saved the same step again when it was stopped (a periodic checkpoint just before the
        stop), and this upload is its last. The row takes the new upload's figures and is
        final; True when it was so updated."""
        with self._db.begin() as conn:
            row = conn.execute(held.add_columns(_CHECKPOINT.c.final)).first()
            if row is None or row.final:
                return False
            conn.execute(
                update(_CHECKPOINT)
                .where(_CHECKPOINT.c.id == row.id)
                .values({**values, "deleted_at": None})
            )
            if event is not None:
                write_event(conn, replace(event, job_id=job_id), at)
        return True

    def add_restore(
        self,
        *,
        job_id: int,
        attempt_id: int,
        checkpoint_name: str,
        size_bytes: int,
        fetched_bytes: int,
        seconds: float,
        from_provider: str,
        from_region: str | None,
        to_provider: str,
        to_region: str,
        at: datetime,
        event: NewEvent | None = None,
    ) -> bool:
        """Record a restore, and `event` with it; False when the attempt already reported
        restoring this checkpoint."""
        when = self._db.now(at)
        values: dict[str, Any] = {
            "job_id": job_id,
            "attempt_id": attempt_id,
            "checkpoint_name": checkpoint_name,
            "size_bytes": size_bytes,
            "fetched_bytes": fetched_bytes,
            "seconds": seconds,
            "from_provider": from_provider,
            "from_region": from_region,
            "to_provider": to_provider,
            "to_region": to_region,
            "at": when,
        }
        held = select(_RESTORE.c.id).where(
            _RESTORE.c.attempt_id == attempt_id, _RESTORE.c.checkpoint_name == checkpoint_name
        )
        return self._add_once(_RESTORE, values, held, job_id, event, when)

    def _add_once(
        self,
        target: Any,
        values: dict[str, Any],
        held: Any,
        job_id: int,
        event: NewEvent | None,
        at: datetime,
    ) -> bool:
        try:
            with self._db.begin() as conn:
                if conn.execute(held).first() is not None:
                    return False
                conn.execute(insert(target).values(values))
                if event is not None:
                    write_event(conn, replace(event, job_id=job_id), at)
        except IntegrityError:  # the same report, recorded by a concurrent request
            return False
        return True

    def mark_deleted(self, job_id: int, names: Iterable[str], at: datetime) -> int:
        """Record that the job's checkpoints of these names were pruned from the bucket (those
        not already marked); returns how many rows were marked."""
        wanted = list(dict.fromkeys(names))
        marked = 0
        with self._db.begin() as conn:
            for part in chunks(wanted, _IDS_PER_QUERY):
                marked += conn.execute(
                    update(_CHECKPOINT)
                    .where(
                        _CHECKPOINT.c.job_id == job_id,
                        _CHECKPOINT.c.name.in_(part),
                        _CHECKPOINT.c.deleted_at.is_(None),
                    )
                    .values(deleted_at=self._db.now(at))
                ).rowcount
        return marked

    def checkpoints(self, job_id: int | None = None) -> list[CheckpointRecord]:
        """The job's checkpoints (every job's when None), pruned ones too, newest first."""
        query = select(_CHECKPOINT).order_by(
            _CHECKPOINT.c.committed_at.desc(), _CHECKPOINT.c.id.desc()
        )
        if job_id is not None:
            query = query.where(_CHECKPOINT.c.job_id == job_id)
        with self._db.connect() as conn:
            return [CheckpointRecord(**row._mapping) for row in conn.execute(query)]

    def restores(self, job_id: int | None = None) -> list[RestoreRecord]:
        """The job's restores (every job's when None), oldest first."""
        query = select(_RESTORE).order_by(_RESTORE.c.at, _RESTORE.c.id)
        if job_id is not None:
            query = query.where(_RESTORE.c.job_id == job_id)
        with self._db.connect() as conn:
            return [RestoreRecord(**row._mapping) for row in conn.execute(query)]

    def final_committed(self, attempt_ids: Iterable[int]) -> set[int]:
        """Which of these attempts reported their final checkpoint committed."""
        ids = list(dict.fromkeys(attempt_ids))
        found: set[int] = set()
        with self._db.connect() as conn:
            for part in chunks(ids, _IDS_PER_QUERY):
                found.update(_finals(conn, part))
        return found


def _finals(conn: Connection, ids: list[int]) -> set[int]:
    query = (
        select(_CHECKPOINT.c.attempt_id)
        .where(_CHECKPOINT.c.attempt_id.in_(ids), _CHECKPOINT.c.final.is_(True))
        .distinct()
    )
    return set(conn.execute(query).scalars())


__all__ = ["Checkpoints"]
