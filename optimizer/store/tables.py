"""The store's tables (SQLModel) and their UTC time type; the plain records read back from them
are in `records.py`.

Key columns hold zone as '' rather than NULL: NULLs are distinct in unique indexes on both
SQLite and PostgreSQL, so a NULL zone would let one regional pool get many "latest" rows.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    DateTime,
    Dialect,
    Index,
    Integer,
    Text,
    UniqueConstraint,
    false,
)
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
    fabric: str = Field(default="none", sa_column_kwargs={"server_default": "none"})
    fabric_interfaces: int = Field(default=0, sa_column_kwargs={"server_default": "0"})


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
    # When a cancel was asked for (the API); the reconciler decides it and moves the job to
    # `cancelled` (optimizer.jobs.machine is the only writer of job states).
    cancel_requested_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    # When `gpuopt jobs rm` took the ended job off the lists; the row stays (its attempts,
    # events and costs point at its id) and its name is freed (the store renames it).
    removed_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


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
    # What the agent and the provider reported (folded in as reports arrive); the agent's
    # token is looked up on every /agent/ request (indexed, revision 0010).
    token_sha256: str = Field(default="", index=True)
    registered_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    probe_status: str | None = None
    job_started_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    exit_code: int | None = None
    notice_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    stop_sent_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    instance_gone: bool = False
    preempted: bool = False
    # The job output its agent shipped (job_log): bytes held now, and bytes dropped to keep
    # the job under its cap (optimizer/store/logs.py keeps both as it writes).
    log_bytes: int = Field(default=0, sa_type=BigInteger, sa_column_kwargs={"server_default": "0"})
    log_dropped_bytes: int = Field(
        default=0, sa_type=BigInteger, sa_column_kwargs={"server_default": "0"}
    )
    # Billing facts (the cost ledger): the instance's launch and termination as the provider
    # reports them, who ended it (`cloud` | `gpuopt`) and the root volume's size.
    launched_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    terminated_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    terminated_by: str | None = None
    disk_gib: float | None = None
    # A multi-node attempt is one row per node: `gang` is the number of its rank-0 row (None
    # for a single node), `nodes` its size; `address` is where the other nodes reach this one.
    gang: int | None = None
    node_rank: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    nodes: int = Field(default=1, sa_column_kwargs={"server_default": "1"})
    address: str | None = None
    internode_status: str | None = None  # the inter-node probe's verdict: pass | warn | fail
    internode_reason: str | None = Field(default=None, sa_type=Text)
    # When the gang's placement (AWS cluster placement group, GCP compact resource policy)
    # was deleted, on every row of the gang; None while it may still exist.
    placement_released_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    # A warm spare (a job with `warm_spare: true`, optimizer/jobs/spares.py): launched to idle
    # beside the job's attempt, booted, registered and probed; `promoted_at` is when it took
    # the job over (None: still a spare, or never one).
    spare: bool = Field(default=False, sa_column_kwargs={"server_default": false()})
    promoted_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class AgentEvent(SQLModel, table=True):
    """An agent's report, kept once per id so a retried batch is recorded once."""

    __tablename__ = "agent_event"

    id: str = Field(primary_key=True)
    attempt_key: str = Field(index=True)
    kind: str
    at: datetime = Field(sa_type=UTCDateTime)
    data: str | None = Field(default=None, sa_type=Text)


class JobLog(SQLModel, table=True):
    """A chunk of an attempt's job output (stdout or stderr), as its agent shipped it.

    `seq` numbers the attempt's chunks from 0; it is unique with the attempt, so a retried
    batch is stored once. `nbytes` is the chunk's size in UTF-8, for the per-job cap.
    """

    __tablename__ = "job_log"
    __table_args__ = (
        UniqueConstraint("attempt_id", "seq", name="uq_job_log_attempt_seq"),
        Index("ix_job_log_job_id", "job_id", "id"),
    )

    id: int | None = Field(
        default=None, primary_key=True, sa_type=BigInteger().with_variant(Integer, "sqlite")
    )
    job_id: int = Field(foreign_key="job.id")
    attempt_id: int = Field(foreign_key="attempt.id")
    seq: int
    stream: str  # stdout | stderr
    at: datetime = Field(sa_type=UTCDateTime)
    text: str = Field(sa_type=Text)
    nbytes: int


class CostLine(SQLModel, table=True):
    """An ended attempt's cost in one calendar month, frozen when the attempt ends.

    `on_demand_usd` is None when no on-demand price of the type and region was known.
    """

    __tablename__ = "cost_line"
    __table_args__ = (
        UniqueConstraint("attempt_id", "period_start", name="uq_cost_line_attempt_period"),
        Index("ix_cost_line_period", "period_start"),
    )

    id: int | None = Field(
        default=None, primary_key=True, sa_type=BigInteger().with_variant(Integer, "sqlite")
    )
    attempt_id: int = Field(foreign_key="attempt.id")
    job_id: int = Field(foreign_key="job.id")
    policy: str
    provider: str
    region: str
    zone: str = ""
    instance_type: str
    market: str
    period_start: datetime = Field(sa_type=UTCDateTime)
    period_end: datetime = Field(sa_type=UTCDateTime)
    billed_seconds: float
    spend_usd: float
    storage_usd: float
    on_demand_usd: float | None = None
    overhead_seconds: float
    overhead_usd: float
    refunded: bool = False
    frozen_at: datetime = Field(sa_type=UTCDateTime)


class PriceHourly(SQLModel, table=True):
    """Price history past the raw retention: one pool's points in one hour, summarized."""

    __tablename__ = "price_hourly"
    __table_args__ = (UniqueConstraint(*POOL_COLUMNS, "hour", name="uq_price_hourly_pool_hour"),)

    id: int | None = Field(
        default=None, primary_key=True, sa_type=BigInteger().with_variant(Integer, "sqlite")
    )
    provider: str
    region: str
    zone: str = ""
    instance_type: str
    market: str
    hour: datetime = Field(sa_type=UTCDateTime)
    min_usd: float
    median_usd: float
    max_usd: float
    points: int


class ProbeResult(SQLModel, table=True):
    """One probe an attempt's agent reported, with the figures the ranking reads.

    `tflops` is JSON: per-GPU TFLOPS by dtype (`{"bf16": 912.0, …}`); bandwidths in GB/s.
    `simulated` marks results that are not the cloud type's own measurement: no real GPU
    measured, or measured on the daemon's own host (the local cloud); `store.probes` tells the
    two apart as the sources `simulated` and `host`.
    """

    __tablename__ = "probe_result"
    __table_args__ = (
        Index("ix_probe_result_type", "provider", "instance_type", "at"),
        Index("ix_probe_result_attempt", "attempt_id"),
    )

    id: int | None = Field(
        default=None, primary_key=True, sa_type=BigInteger().with_variant(Integer, "sqlite")
    )
    attempt_id: int = Field(foreign_key="attempt.id")
    job_id: int = Field(foreign_key="job.id")
    provider: str
    region: str
    zone: str = ""
    instance_type: str
    gpu_model: str | None = None
    gpu_count: int | None = None
    status: str  # pass | warn | fail
    tflops: str | None = Field(default=None, sa_type=Text)
    copy_gbps: float | None = None
    host_link_gbps: float | None = None
    allreduce_busbw_gbps: float | None = None
    simulated: bool = False
    at: datetime = Field(sa_type=UTCDateTime)
    result: str | None = Field(default=None, sa_type=Text)


class Checkpoint(SQLModel, table=True):
    """A checkpoint an attempt's agent uploaded to the job's bucket (manifest written last).

    `uri` is the checkpoint's folder in the bucket, `provider`/`region` the bucket's (what
    storage and moving it cost); `deleted_at` is set once it was pruned from the bucket.
    One row per attempt and name: a report sent twice is kept once.
    """

    __tablename__ = "checkpoint"
    __table_args__ = (
        UniqueConstraint("attempt_id", "name", name="uq_checkpoint_attempt_name"),
        Index("ix_checkpoint_job", "job_id", "committed_at"),
    )

    id: int | None = Field(
        default=None, primary_key=True, sa_type=BigInteger().with_variant(Integer, "sqlite")
    )
    job_id: int = Field(foreign_key="job.id")
    attempt_id: int = Field(foreign_key="attempt.id")
    name: str
    step: int | None = Field(default=None, sa_type=BigInteger)
    size_bytes: int = Field(sa_type=BigInteger)
    files: int
    uri: str = Field(sa_type=Text)
    provider: str
    region: str | None = None
    committed_at: datetime = Field(sa_type=UTCDateTime)
    upload_s: float
    final: bool = False
    deleted_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class CheckpointRestore(SQLModel, table=True):
    """A checkpoint an attempt's agent fetched before starting the job: from the bucket's
    provider and region to the attempt's (what moving it cost)."""

    __tablename__ = "checkpoint_restore"
    __table_args__ = (
        UniqueConstraint("attempt_id", "checkpoint_name", name="uq_checkpoint_restore_attempt"),
        Index("ix_checkpoint_restore_job", "job_id"),
    )

    id: int | None = Field(
        default=None, primary_key=True, sa_type=BigInteger().with_variant(Integer, "sqlite")
    )
    job_id: int = Field(foreign_key="job.id")
    attempt_id: int = Field(foreign_key="attempt.id")
    checkpoint_name: str
    size_bytes: int = Field(sa_type=BigInteger)
    fetched_bytes: int = Field(sa_type=BigInteger)
    seconds: float
    from_provider: str
    from_region: str | None = None
    to_provider: str
    to_region: str
    at: datetime = Field(sa_type=UTCDateTime)


class AttemptProgress(SQLModel, table=True):
    """What an attempt's job reported of its progress (docs/progress.md): the first report
    the daemon took (`first_step` at `first_at`, where the attempt's speed is measured from,
    so its start-up does not count) and the newest (`step` at `at`), the run's total steps
    where the job gave them, and the attempt's instance type. One row per attempt."""

    __tablename__ = "attempt_progress"
    __table_args__ = (Index("ix_attempt_progress_job", "job_id"),)

    attempt_id: int = Field(
        primary_key=True,
        foreign_key="attempt.id",
        sa_type=Integer,
        sa_column_kwargs={"autoincrement": False},
    )
    job_id: int = Field(foreign_key="job.id")
    instance_type: str
    first_step: int = Field(sa_type=BigInteger)
    first_at: datetime = Field(sa_type=UTCDateTime)
    step: int = Field(sa_type=BigInteger)
    at: datetime = Field(sa_type=UTCDateTime)
    total: int | None = Field(default=None, sa_type=BigInteger)
    reports: int = 1


class GpuSample(SQLModel, table=True):
    """An attempt's GPU readings over one span, aggregated across its GPUs.

    `span_s` is 60 for the per-minute aggregates agents send and 3600 once downsampled;
    `throttle_reasons` ORs NVML's clock-event bits; `xids` is a JSON list of XID codes seen.
    """

    __tablename__ = "gpu_sample"
    __table_args__ = (UniqueConstraint("attempt_id", "start", "span_s", name="uq_gpu_sample_span"),)

    id: int | None = Field(
        default=None, primary_key=True, sa_type=BigInteger().with_variant(Integer, "sqlite")
    )
    attempt_id: int = Field(foreign_key="attempt.id")
    start: datetime = Field(sa_type=UTCDateTime)
    span_s: int
    samples: int
    gpus: int
    util_mean: float | None = None
    util_max: float | None = None
    memory_used_gib_max: float | None = None
    memory_total_gib: float | None = None
    power_w_mean: float | None = None
    temperature_c_max: float | None = None
    sm_clock_mhz_mean: float | None = None
    throttle_reasons: int = Field(default=0, sa_type=BigInteger)
    xids: str | None = Field(default=None, sa_type=Text)
    simulated: bool = False


class PoolCooldown(SQLModel, table=True):
    """A capacity pool gpuopt avoids until `until` (after an interruption or a launch error)."""

    __tablename__ = "pool_cooldown"

    id: int | None = Field(default=None, primary_key=True)
    provider: str
    region: str
    zone: str = ""
    instance_type: str
    market: str
    until: datetime = Field(sa_type=UTCDateTime, index=True)
    reason: str = Field(sa_type=Text)


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


class AlertOutbox(SQLModel, table=True):
    """One alert for one channel, written in the event's transaction and sent by `deliver`.

    `dedupe_key` is unique: raising the same alert twice keeps one row. Only the channel's
    name is stored; its URL and secret stay in the daemon's config.
    """

    __tablename__ = "alert_outbox"
    __table_args__ = (Index("ix_alert_outbox_due", "state", "next_attempt_at"),)

    id: int | None = Field(default=None, primary_key=True)
    event_id: int = Field(foreign_key="event.id", index=True)
    channel: str
    dedupe_key: str = Field(unique=True)
    state: str = "pending"  # pending | delivered | failed
    attempts: int = 0
    next_attempt_at: datetime = Field(sa_type=UTCDateTime)
    last_error: str | None = Field(default=None, sa_type=Text)
    created_at: datetime = Field(sa_type=UTCDateTime)
    updated_at: datetime = Field(sa_type=UTCDateTime)
    delivered_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class PolicyVersion(SQLModel, table=True):
    """What the policy watcher saw in a file: a version it loaded, rejected or retired.

    Loaded versions keep their text, so a restart can put the last good version back in
    force when the file on disk is broken or gone.
    """

    __tablename__ = "policy_version"
    __table_args__ = (Index("ix_policy_version_path", "path", "id"),)

    id: int | None = Field(default=None, primary_key=True)
    path: str
    name: str | None = Field(default=None, index=True)
    sha256: str
    outcome: str  # loaded | rejected | removed
    text: str | None = Field(default=None, sa_type=Text)
    problems: str | None = Field(default=None, sa_type=Text)  # JSON list of located lines
    at: datetime = Field(sa_type=UTCDateTime)


class PriceSignal(SQLModel, table=True):
    """Per policy, what the last price evaluation saw: the best pool and the bid-cap sides."""

    __tablename__ = "price_signal"

    policy: str = Field(primary_key=True)
    state: str = Field(sa_type=Text)  # JSON, see optimizer.daemon.prices.PriceState
    updated_at: datetime = Field(sa_type=UTCDateTime)


class PollStatus(SQLModel, table=True):
    """The last poll of one provider, region ('*' = all) and market."""

    __tablename__ = "poll_status"

    provider: str = Field(primary_key=True)
    region: str = Field(primary_key=True)
    market: str = Field(primary_key=True)
    last_run_at: datetime = Field(sa_type=UTCDateTime)
    last_ok_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    duration_s: float = 0.0
    offers: int = 0
    failures: int = 0  # consecutive
    last_error: str | None = Field(default=None, sa_type=Text)


class Replica(SQLModel, table=True):
    """One running daemon process: what it is, whether it leads, when it last said so.

    Leadership itself is the PostgreSQL advisory lock (or the SQLite file lock); this table
    only reports it, so `gpuopt status` and the API can say who leads. Rows whose heartbeat
    is older than a few intervals belong to replicas that are gone and are pruned.
    """

    __tablename__ = "replica"

    id: str = Field(primary_key=True)  # host:pid:random, fixed for the process's life
    host: str
    pid: int
    version: str
    role: str  # "leader" or "follower"
    api_url: str | None = Field(default=None, sa_type=Text)
    started_at: datetime = Field(sa_type=UTCDateTime)
    leader_since: datetime | None = Field(default=None, sa_type=UTCDateTime)
    heartbeat_at: datetime = Field(sa_type=UTCDateTime, index=True)
