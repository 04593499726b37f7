"""The store's tables (SQLModel), their UTC time type, and the records read back from them.

Key columns hold zone as '' rather than NULL: NULLs are distinct in unique indexes on both
SQLite and PostgreSQL, so a NULL zone would let one regional pool get many "latest" rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, Dialect, Index, Integer, Text, UniqueConstraint
from sqlalchemy.types import TypeDecorator
from sqlmodel import Field, SQLModel

POOL_COLUMNS: tuple[str, ...] = ("provider", "region", "zone", "instance_type", "market")


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes in and out, on every engine.

    PostgreSQL stores `timestamptz` and returns it in the session's zone; SQLite has no
    time zones and drops tzinfo, so we write naive UTC there and put UTC back on read.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store; pass a timezone-aware UTC time")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class PriceHistory(SQLModel, table=True):
    """Every price observation, append-only."""

    __tablename__ = "price_history"
    __table_args__ = (Index("ix_price_history_pool_time", *POOL_COLUMNS, "observed_at"),)

    # 64-bit on PostgreSQL: a few thousand pools polled every few minutes passes 2**31 in
    # years, not decades. SQLite only auto-numbers a column declared exactly INTEGER.
    id: int | None = Field(
        default=None, primary_key=True, sa_type=BigInteger().with_variant(Integer, "sqlite")
    )
    provider: str
    region: str
    zone: str = ""
    instance_type: str
    market: str
    usd_per_hour: float
    observed_at: datetime = Field(sa_type=UTCDateTime)
    source: str = ""


class LatestPrice(SQLModel, table=True):
    """The newest observation of each pool, with every Offer field."""

    __tablename__ = "latest_price"
    __table_args__ = (UniqueConstraint(*POOL_COLUMNS, name="uq_latest_price_pool"),)

    id: int | None = Field(default=None, primary_key=True)
    provider: str
    region: str
    zone: str = ""
    instance_type: str
    gpu_model: str
    gpu_count: int
    gpu_memory_gib: float
    vcpus: int
    ram_gib: float
    interconnect: str
    market: str
    usd_per_hour: float
    observed_at: datetime = Field(sa_type=UTCDateTime)
    placement_score: float | None = None
    interruption_bucket: str | None = None
    source: str = ""


class Job(SQLModel, table=True):
    """A managed job: a command plus a policy; `spec` is JSON text."""

    __tablename__ = "job"

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(unique=True)
    policy: str
    spec: str = Field(sa_type=Text)
    state: str = "pending"
    reason: str | None = None
    restarts: int = 0
    created_at: datetime = Field(sa_type=UTCDateTime)
    updated_at: datetime = Field(sa_type=UTCDateTime)


class Attempt(SQLModel, table=True):
    """One placement of a job; the idempotency key makes a retried launch harmless."""

    __tablename__ = "attempt"
    __table_args__ = (UniqueConstraint("job_id", "number", name="uq_attempt_job_number"),)

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="job.id")
    number: int
    idempotency_key: str = Field(unique=True)
    provider: str
    region: str
    zone: str = ""
    instance_type: str
    market: str
    usd_per_hour: float
    instance_id: str | None = None
    state: str
    end_reason: str | None = None
    started_at: datetime = Field(sa_type=UTCDateTime)
    ended_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class Event(SQLModel, table=True):
    """Something that happened, for people and alerts; `data` is JSON text."""

    __tablename__ = "event"

    id: int | None = Field(default=None, primary_key=True)
    at: datetime = Field(sa_type=UTCDateTime, index=True)
    kind: str
    severity: str = "info"
    job_id: int | None = Field(default=None, foreign_key="job.id", index=True)
    policy: str | None = None
    message: str = Field(sa_type=Text)
    data: str | None = Field(default=None, sa_type=Text)


class SpecCacheEntry(SQLModel, table=True):
    """Slow-changing provider facts (instance specs) kept between polls; `value` is JSON."""

    __tablename__ = "spec_cache"

    provider: str = Field(primary_key=True)
    key: str = Field(primary_key=True)
    fetched_at: datetime = Field(sa_type=UTCDateTime)
    value: str = Field(sa_type=Text)


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
