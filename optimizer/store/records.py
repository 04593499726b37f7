"""The plain records the store hands out and takes in: frozen values every layer may read.

They carry no database machinery (the tables are in `tables.py`); `optimizer.store` exports
them as part of its face, and other layers import them from there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from optimizer.common.jobnames import given_name
from optimizer.model import EventKind


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A job as stored; `spec` is the decoded JSON."""

    id: int
    name: str
    policy: str
    spec: dict[str, Any]
    state: str
    reason: str | None
    restarts: int
    created_at: datetime
    updated_at: datetime
    cancel_requested_at: datetime | None = None
    removed_at: datetime | None = None

    @property
    def given_name(self) -> str:
        """The name the job was submitted under (a removed job's row is renamed)."""
        return given_name(self.name)


@dataclass(frozen=True, slots=True)
class EventRecord:
    """An event as stored; `data` is the decoded JSON, or None."""

    id: int
    at: datetime
    kind: str
    severity: str
    job_id: int | None
    policy: str | None
    message: str
    data: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event to record, with the alert channels it goes to (routing decided them).

    `dedupe_key` names the fact behind the alert; each channel's outbox row gets
    `<dedupe_key>#<channel>`, and a key already in the outbox is not raised again.
    """

    kind: EventKind
    message: str
    severity: str = "info"
    job_id: int | None = None
    policy: str | None = None
    data: Mapping[str, Any] | None = None
    alerts: tuple[str, ...] = ()
    dedupe_key: str | None = None


@dataclass(frozen=True, slots=True)
class OutboxItem:
    """A due alert: its outbox row, the event it reports and the job's name, if any."""

    id: int
    channel: str
    dedupe_key: str
    attempts: int
    created_at: datetime
    event: EventRecord
    job_name: str | None


@dataclass(frozen=True, slots=True)
class PolicyVersionRecord:
    id: int
    path: str
    name: str | None
    sha256: str
    outcome: str
    text: str | None
    problems: list[str]
    at: datetime


@dataclass(frozen=True, slots=True)
class PollStatusRecord:
    provider: str
    region: str
    market: str
    last_run_at: datetime
    last_ok_at: datetime | None
    duration_s: float
    offers: int
    failures: int
    last_error: str | None


@dataclass(frozen=True, slots=True)
class CheckpointRecord:
    """A checkpoint an attempt uploaded to its job's bucket: `uri` is its folder there,
    `provider`/`region` the bucket's (region None: unknown), `upload_s` the upload's time,
    `final` whether it was the one written at the attempt's stop, `deleted_at` when it was
    pruned from the bucket (None: still there)."""

    id: int
    job_id: int
    attempt_id: int
    name: str
    step: int | None
    size_bytes: int
    files: int
    uri: str
    provider: str
    region: str | None
    committed_at: datetime
    upload_s: float
    final: bool
    deleted_at: datetime | None


@dataclass(frozen=True, slots=True)
class ProgressRecord:
    """An attempt's progress (docs/progress.md): the first report the daemon took and the
    newest, as (step, time), the run's total steps where known, and the attempt's instance
    type; `reports` how many reports were taken."""

    attempt_id: int
    job_id: int
    instance_type: str
    first_step: int
    first_at: datetime
    step: int
    at: datetime
    total: int | None
    reports: int


@dataclass(frozen=True, slots=True)
class RestoreRecord:
    """A checkpoint an attempt fetched before starting its job: `size_bytes` in all, of which
    `fetched_bytes` came over the network (the rest was already on the disk), from the bucket's
    provider and region to the attempt's."""

    id: int
    job_id: int
    attempt_id: int
    checkpoint_name: str
    size_bytes: int
    fetched_bytes: int
    seconds: float
    from_provider: str
    from_region: str | None
    to_provider: str
    to_region: str
    at: datetime
