"""The store: gpuopt's durable state on SQLite or PostgreSQL, one repository per aggregate.

    store = Store(url)
    store.prices     offers, price history (raw and hourly tiers, their retention, read
                     whole or in a chart's buckets), latest prices, the providers' spec cache
    store.jobs       jobs, attempts, what agents report, pool cooldowns
    store.events     events and the alert outbox
    store.policies   policy versions, price-signal state, poll status
    store.replicas   the daemon processes sharing this database
    store.costs      the cost ledger's frozen lines and the attempts it prices
    store.logs       the job output agents ship, per attempt, under a cap per job
    store.telemetry  each attempt's GPU readings per minute, then per hour; summaries
    store.probes     the probe results agents report, and the ranking's per-type figures
    store.checkpoints  the checkpoints attempts uploaded to their job's bucket, restored, pruned
    store.progress   each attempt's first and newest progress report (speeds, ETAs)

The repositories share one engine and clock (`engine.Database`). Every public write is one
transaction; a write that causes events (a job transition, a policy change) records them and
their outbox rows on its own transaction through `events.write_events`. This module is the
package's face: other layers import from here, never from `tables.py` (the SQLModel tables)
or `engine.py`. The plain records are in `records.py`, the schema revisions in `migrate.py`
and `migrations/`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from types import TracebackType
from typing import Any, Self

from optimizer.store.buckets import Grid, InEffect
from optimizer.store.checkpoints import Checkpoints
from optimizer.store.costs import BilledAttempt, CostLineRecord, Costs, CostTotals, LineFilter
from optimizer.store.engine import (
    Database,
    DatabaseUrlError,
    DuplicateJobError,
    JobNotEndedError,
    StoreError,
    is_sqlite_url,
    make_engine,
    normalize_database_url,
    sqlite_file,
    utc_now,
)
from optimizer.store.events import Events
from optimizer.store.history import PricePoint, PruneBatch, Retention, Tier
from optimizer.store.jobs import AttemptRecord, Jobs, token_sha256
from optimizer.store.logs import Appended, LogChunk, Logs, NewChunk
from optimizer.store.policies import Policies
from optimizer.store.prices import OffersVersion, Prices
from optimizer.store.probes import FailureStreak, ProbeRecord, Probes, TypeFigures
from optimizer.store.progress import Progress
from optimizer.store.records import (
    CheckpointRecord,
    EventRecord,
    JobRecord,
    NewEvent,
    OutboxItem,
    PolicyVersionRecord,
    PollStatusRecord,
    ProgressRecord,
    RestoreRecord,
)
from optimizer.store.replicas import ReplicaRecord, Replicas
from optimizer.store.telemetry import GpuMinute, GpuSampleRecord, GpuSummary, Telemetry

__all__ = [
    "Appended",
    "AttemptRecord",
    "BilledAttempt",
    "CheckpointRecord",
    "Checkpoints",
    "CostLineRecord",
    "CostTotals",
    "DatabaseUrlError",
    "DuplicateJobError",
    "EventRecord",
    "FailureStreak",
    "GpuMinute",
    "GpuSampleRecord",
    "GpuSummary",
    "Grid",
    "InEffect",
    "JobNotEndedError",
    "JobRecord",
    "LineFilter",
    "LogChunk",
    "NewChunk",
    "NewEvent",
    "OffersVersion",
    "OutboxItem",
    "PolicyVersionRecord",
    "PollStatusRecord",
    "PricePoint",
    "Prices",
    "ProbeRecord",
    "Progress",
    "ProgressRecord",
    "PruneBatch",
    "ReplicaRecord",
    "RestoreRecord",
    "Retention",
    "Store",
    "StoreError",
    "Telemetry",
    "Tier",
    "TypeFigures",
    "is_sqlite_url",
    "normalize_database_url",
    "sqlite_file",
    "token_sha256",
]


class Store:
    """The daemon's durable state at `url` (SQLite or PostgreSQL; `normalize_database_url`
    says which URLs are accepted, and the daemon config which one the daemon uses).

    `schema` (PostgreSQL only) puts every table in that existing schema via `search_path`;
    `clock` supplies "now" wherever a caller does not pass a time.
    """

    def __init__(
        self,
        url: str,
        *,
        schema: str | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.url = normalize_database_url(url)
        self.schema = schema
        self.engine = make_engine(self.url, schema)
        db = Database(self.engine, clock or utc_now)
        self.prices = Prices(db)
        self.jobs = Jobs(db)
        self.events = Events(db)
        self.policies = Policies(db)
        self.replicas = Replicas(db)
        self.costs = Costs(db)
        self.logs = Logs(db)
        self.telemetry = Telemetry(db)
        self.probes = Probes(db)
        self.checkpoints = Checkpoints(db)
        self.progress = Progress(db)

    def create_all(self) -> None:
        """Create an empty database's schema at the newest revision, stamped so (a database
        already there gains any missing table; any other raises SchemaError). The daemon uses
        `optimizer.store.migrate.ensure_ready`; this is the fast path for tests and tools."""
        from optimizer.store.migrate import create_all

        create_all(self.engine)

    def dedicated_connection(self, **params: Any) -> Any:
        """A new DBAPI connection outside the pool, with the store's settings (search_path)
        plus `params` (libpq keywords for PostgreSQL). The caller owns and closes it: the
        leader election keeps its session-level lock on one such connection."""
        dialect = self.engine.dialect
        cargs, cparams = dialect.create_connect_args(self.engine.url)
        if self.schema is not None:
            cparams["options"] = f"-csearch_path={self.schema}"
        cparams.update(params)
        return dialect.connect(*cargs, **cparams)

    def close(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
