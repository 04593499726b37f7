"""The costs repository: the ledger's reads of attempts and its frozen cost lines.

An ended attempt's lines (one per calendar month it billed in) are written once, when its
termination is known (`freeze`), and read back as they were (`frozen_lines`), so its numbers
never change when the price points behind them are downsampled. Attempts without frozen
lines (live, or ended with the termination not yet known) are read with what the ledger
needs to price them (`unfrozen`); the ledger (optimizer/jobs/ledger.py) computes theirs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Float,
    Integer,
    Select,
    String,
    and_,
    case,
    cast,
    func,
    literal,
    or_,
    select,
    union_all,
)

from optimizer.store.engine import Database, aware, chunks, dialect_insert, table
from optimizer.store.jobs import ATTEMPT_IDS_PER_QUERY, AttemptRecord
from optimizer.store.tables import AgentEvent, Attempt, CostLine, Job

_ATTEMPT = table(Attempt)
_JOB = table(Job)
_LINE = table(CostLine)
_AGENT_EVENT = table(AgentEvent)
_ATTEMPT_FIELDS = [f.name for f in fields(AttemptRecord)]


@dataclass(frozen=True, slots=True)
class BilledAttempt:
    """An attempt that got an instance, with what pricing it needs beyond its row: its job's
    name and policy, and when its job's process exited (the agent's `job_exited` event)."""

    attempt: AttemptRecord
    job: str
    policy: str
    job_exited_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class CostLineRecord:
    """One stored cost line: an ended attempt's cost in one calendar month (UTC), with the
    attempt's identity read back with it (job name, attempt number, instance, launch and end).
    `on_demand_usd` is None where no on-demand price of the type and region was known."""

    attempt_id: int
    job_id: int
    job: str
    policy: str
    attempt: int
    provider: str
    region: str
    zone: str | None
    instance_type: str
    market: str
    instance_id: str | None
    launched: datetime
    ended: datetime | None
    period_start: datetime
    period_end: datetime
    billed_seconds: float
    spend_usd: float
    storage_usd: float
    on_demand_usd: float | None
    overhead_seconds: float
    overhead_usd: float
    refunded: bool
    idle_spare: bool = False  # the attempt is a warm spare that never took the job over


@dataclass(frozen=True, slots=True)
class CostTotals:
    """Sums over stored lines (of one group, when grouped: `key`): each figure over all the
    lines, and `priced_*` over the `priced_lines` with an on-demand baseline (`on_demand_usd`
    is theirs alone); `attempts` with a line."""

    key: Any = None
    lines: int = 0
    attempts: int = 0
    billed_seconds: float = 0.0
    spend_usd: float = 0.0
    storage_usd: float = 0.0
    on_demand_usd: float = 0.0
    overhead_seconds: float = 0.0
    overhead_usd: float = 0.0
    priced_lines: int = 0
    priced_billed_seconds: float = 0.0
    priced_spend_usd: float = 0.0
    priced_storage_usd: float = 0.0
    priced_overhead_seconds: float = 0.0
    priced_overhead_usd: float = 0.0


PoolTotals = dict[tuple[str, str, str], CostTotals]
"""Sums keyed by (policy, provider, market)."""

# The figures `frozen_sums` adds up twice (over all lines, then over the priced ones), in order.
_SUMMED: tuple[str, ...] = tuple(
    name
    for figure in ("billed_seconds", "spend_usd", "storage_usd", "overhead_seconds", "overhead_usd")
    for name in (figure, f"priced_{figure}")
)
# What `frozen_sums` groups by: columns of the stored line (the month is its period's start).
SUM_GROUPS: tuple[str, ...] = ("policy", "provider", "market", "month")


@dataclass(frozen=True, slots=True)
class LineFilter:
    """Which lines a query wants: lines whose month overlaps [since, until), of one job (by
    id), policy, provider or market; None means any."""

    since: datetime | None = None
    until: datetime | None = None
    job_id: int | None = None
    policy: str | None = None
    provider: str | None = None
    market: str | None = None


def _attempt_record(m: Any) -> AttemptRecord:
    values = {name: m[name] for name in _ATTEMPT_FIELDS if name != "key"}
    values["key"] = m["idempotency_key"]
    values["zone"] = values["zone"] or None
    return AttemptRecord(**values)


def _where(query: Select[Any], f: LineFilter, columns: Any, policy: Any) -> Select[Any]:
    """The filter's job, policy, provider and market conditions on `columns` (a table's)."""
    conditions: list[ColumnElement[bool]] = []
    if f.job_id is not None:
        conditions.append(columns.job_id == f.job_id)
    if f.policy is not None:
        conditions.append(policy == f.policy)
    if f.provider is not None:
        conditions.append(columns.provider == f.provider)
    if f.market is not None:
        conditions.append(columns.market == f.market)
    return query.where(*conditions) if conditions else query


def _period(query: Select[Any], f: LineFilter) -> Select[Any]:
    """Stored lines whose month overlaps [since, until)."""
    if f.since is not None:
        query = query.where(_LINE.c.period_end > aware(f.since, "since"))
    if f.until is not None:
        query = query.where(_LINE.c.period_start < aware(f.until, "until"))
    return query


class Costs:
    """Frozen cost lines in and out, and the attempts the ledger still prices itself."""

    def __init__(self, db: Database) -> None:
        self._db = db

    # -- attempts the ledger prices ----------------------------------------------------------

    def unfrozen(self, f: LineFilter = LineFilter()) -> list[BilledAttempt]:
        """Attempts with an instance and no frozen line (live, or ended with the termination
        not yet known), filtered by job, policy, provider and market (not by time: the ledger
        clips them to the window once priced), in job and attempt order."""
        frozen = select(_LINE.c.id).where(_LINE.c.attempt_id == _ATTEMPT.c.id).exists()
        query = _where(self._billed_query().where(~frozen), f, _ATTEMPT.c, _JOB.c.policy)
        return self._billed(query)

    def to_freeze(
        self, now: datetime, settle: timedelta, *, limit: int | None = None
    ) -> list[BilledAttempt]:
        """Ended attempts with an instance and no frozen line whose termination is known: the
        provider reported it (`terminated_at`), or the instance is gone and `settle` has
        passed since the attempt ended without a report (its end is then the attempt's);
        at most `limit`, the oldest attempts first."""
        frozen = select(_LINE.c.id).where(_LINE.c.attempt_id == _ATTEMPT.c.id).exists()
        settled = aware(now, "now") - settle
        query = self._billed_query().where(
            ~frozen,
            _ATTEMPT.c.ended_at.is_not(None),
            or_(
                _ATTEMPT.c.terminated_at.is_not(None),
                and_(_ATTEMPT.c.instance_gone.is_(True), _ATTEMPT.c.ended_at <= settled),
            ),
        )
        if limit is not None:
            query = query.order_by(None).order_by(_ATTEMPT.c.id).limit(limit)
        return self._billed(query)

    def _billed_query(self) -> Select[Any]:
        return (
            select(_ATTEMPT, _JOB.c.name.label("job_name"), _JOB.c.policy.label("job_policy"))
            .join(_JOB, _JOB.c.id == _ATTEMPT.c.job_id)
            .where(_ATTEMPT.c.instance_id.is_not(None))
            .order_by(_ATTEMPT.c.job_id, _ATTEMPT.c.number)
        )

    def _billed(self, query: Select[Any]) -> list[BilledAttempt]:
        with self._db.connect() as conn:
            rows = [row._mapping for row in conn.execute(query)]
            records = [(_attempt_record(m), m["job_name"], m["job_policy"]) for m in rows]
            exits = self._exits(conn, [a.key for a, _, _ in records])
        return [BilledAttempt(a, job, policy, exits.get(a.key)) for a, job, policy in records]

    def exits(self, keys: Sequence[str]) -> dict[str, datetime]:
        """When each attempt's job process exited, by attempt key (attempts whose agent has
        not reported it are left out)."""
        with self._db.connect() as conn:
            return self._exits(conn, keys)

    @staticmethod
    def _exits(conn: Any, keys: Sequence[str]) -> dict[str, datetime]:
        """When each attempt's job process exited, by attempt key (its first `job_exited`)."""
        out: dict[str, datetime] = {}
        for chunk in chunks(keys, ATTEMPT_IDS_PER_QUERY):
            query = (
                select(_AGENT_EVENT.c.attempt_key, func.min(_AGENT_EVENT.c.at))
                .where(_AGENT_EVENT.c.kind == "job_exited", _AGENT_EVENT.c.attempt_key.in_(chunk))
                .group_by(_AGENT_EVENT.c.attempt_key)
            )
            # min() and coalesce() take their arguments' column type: UTC datetimes back.
            out.update((key, at) for key, at in conn.execute(query))
        return out

    # -- frozen lines ------------------------------------------------------------------------

    def freeze(self, lines: Iterable[CostLineRecord], at: datetime) -> int:
        """Store ended attempts' lines (one per attempt and month) in one transaction; a line
        already stored stays as it is (idempotent). Returns the number of rows written."""
        rows = [_line_row(line, aware(at, "at")) for line in lines]
        if not rows:
            return 0
        # RETURNING counts the rows written on both engines (an executemany's rowcount is -1
        # on psycopg); a conflicting row returns nothing.
        stmt = (
            dialect_insert(self._db.dialect, _LINE)
            .on_conflict_do_nothing(index_elements=["attempt_id", "period_start"])
            .returning(_LINE.c.id)
        )
        with self._db.begin() as conn:
            return len(conn.execute(stmt, rows).all())

    def frozen_lines(self, f: LineFilter = LineFilter()) -> list[CostLineRecord]:
        """Frozen lines whose month overlaps [since, until), filtered, oldest month first (then
        by job and attempt): one indexed query, however many attempts."""
        a, j, c = _ATTEMPT, _JOB, _LINE
        query = (
            select(
                c,
                j.c.name.label("job_name"),
                a.c.number,
                a.c.gang,
                a.c.instance_id,
                a.c.spare,
                a.c.promoted_at,
                func.coalesce(a.c.launched_at, a.c.started_at).label("launched"),
                func.coalesce(a.c.terminated_at, a.c.ended_at).label("ended"),
            )
            .join(a, a.c.id == c.c.attempt_id)
            .join(j, j.c.id == c.c.job_id)
            .order_by(c.c.period_start, c.c.job_id, a.c.number)
        )
        query = _where(_period(query, f), f, c.c, c.c.policy)
        with self._db.connect() as conn:
            return [_line(row._mapping) for row in conn.execute(query)]

    def frozen_sums(self, f: LineFilter = LineFilter(), by: Sequence[str] = ()) -> list[CostTotals]:
        """The frozen lines `frozen_lines(f)` returns, summed by the database over the lines'
        own columns (no join): one `CostTotals` per group of `by` (columns of SUM_GROUPS; its
        `key` the value, or the values' tuple for several) in key order, or one over all."""
        query = _sums_query(f, by)
        with self._db.connect() as conn:
            found = (_sums(list(row), len(by)) for row in conn.execute(query))
            return [sums for sums in found if sums is not None]

    def frozen_total(self, f: LineFilter = LineFilter()) -> CostTotals:
        """The sum of the frozen lines `frozen_lines(f)` returns, by the database."""
        return (self.frozen_sums(f) or [CostTotals()])[0]

    def counter_snapshot(self) -> tuple[PoolTotals, list[BilledAttempt]]:
        """Every frozen line summed per (policy, provider, market) by the database, and the
        attempts with an instance that have no frozen line yet, as of one instant: both come
        from one statement, so an attempt frozen meanwhile is counted in exactly one of the
        two (the cumulative counters' read). The sums need no join and no price query."""
        by = ("policy", "provider", "market")
        sums = _sums_query(LineFilter(), by).order_by(None)
        sums = sums.add_columns(literal(None, BigInteger).label("attempt_id"))
        a = _ATTEMPT
        frozen = select(_LINE.c.id).where(_LINE.c.attempt_id == a.c.id).exists()
        width = len(sums.selected_columns) - 1
        open_attempts = select(
            *(literal(None, String) for _ in by),
            *(literal(0, Integer) for _ in range(3)),
            *(literal(None, Float) for _ in range(width - len(by) - 3)),
            a.c.id,
        ).where(a.c.instance_id.is_not(None), ~frozen)
        totals: PoolTotals = {}
        ids: list[int] = []
        with self._db.connect() as conn:
            result: Any = conn.execute(union_all(sums, open_attempts))
            for row in result:
                *values, attempt_id = row
                if attempt_id is not None:
                    ids.append(int(attempt_id))
                elif (found := _sums(values, len(by))) is not None:
                    totals[found.key] = found
        attempts = []
        for chunk in chunks(ids, ATTEMPT_IDS_PER_QUERY):
            attempts += self._billed(self._billed_query().where(_ATTEMPT.c.id.in_(chunk)))
        return totals, attempts


def _sums_query(f: LineFilter, by: Sequence[str]) -> Select[Any]:
    """`frozen_sums`' statement: the keys of `by`, the line, attempt and priced-line counts,
    the baseline, then each of _SUMMED."""
    c = _LINE
    priced = c.c.on_demand_usd.is_not(None)

    def both(column: Any) -> list[Any]:
        return [
            func.coalesce(func.sum(column), 0.0),
            func.coalesce(func.sum(case((priced, column), else_=0.0)), 0.0),
        ]

    unknown = [name for name in by if name not in SUM_GROUPS]
    if unknown:
        raise ValueError(f"cannot sum cost lines by {', '.join(unknown)}")
    keys = [c.c.period_start if name == "month" else c.c[name] for name in by]
    # Attempts as people count them: the nodes of a multi-node attempt (one row each, with
    # the gang's number) are one attempt.
    a = _ATTEMPT
    number = func.coalesce(a.c.gang, a.c.number)
    attempt = cast(c.c.job_id, String) + literal("-") + cast(number, String)
    query: Select[Any] = select(
        *keys,
        func.count(),
        func.count(func.distinct(attempt)),
        func.count(c.c.on_demand_usd),
        func.coalesce(func.sum(c.c.on_demand_usd), 0.0),
        *(total for figure in _SUMMED[::2] for total in both(c.c[figure])),
    )
    query = query.select_from(c.join(a, a.c.id == c.c.attempt_id))
    query = _where(_period(query, f), f, c.c, c.c.policy)
    if keys:
        query = query.group_by(*keys).order_by(*keys)
    return query


def _sums(values: list[Any], keys: int) -> CostTotals | None:
    """One row of `_sums_query` with `keys` key columns; None for a group with no line."""
    key = values[0] if keys == 1 else tuple(values[:keys]) or None
    n, attempts, priced_n, baseline, *sums = values[keys:]
    if not n:
        return None
    figures = dict(zip(_SUMMED, (float(x) for x in sums), strict=True))
    return CostTotals(
        key=key,
        lines=int(n),
        attempts=int(attempts),
        on_demand_usd=float(baseline),
        priced_lines=int(priced_n),
        **figures,
    )


def _line_row(line: CostLineRecord, at: datetime) -> dict[str, Any]:
    return {
        "attempt_id": line.attempt_id,
        "job_id": line.job_id,
        "policy": line.policy,
        "provider": line.provider,
        "region": line.region,
        "zone": line.zone or "",
        "instance_type": line.instance_type,
        "market": line.market,
        "period_start": aware(line.period_start, "period_start"),
        "period_end": aware(line.period_end, "period_end"),
        "billed_seconds": line.billed_seconds,
        "spend_usd": line.spend_usd,
        "storage_usd": line.storage_usd,
        "on_demand_usd": line.on_demand_usd,
        "overhead_seconds": line.overhead_seconds,
        "overhead_usd": line.overhead_usd,
        "refunded": line.refunded,
        "frozen_at": at,
    }


def _line(m: Any) -> CostLineRecord:
    return CostLineRecord(
        attempt_id=m["attempt_id"],
        job_id=m["job_id"],
        job=m["job_name"],
        policy=m["policy"],
        attempt=m["gang"] or m["number"],  # a multi-node attempt is one, of N instances
        provider=m["provider"],
        region=m["region"],
        zone=m["zone"] or None,
        instance_type=m["instance_type"],
        market=m["market"],
        instance_id=m["instance_id"],
        launched=m["launched"],
        ended=m["ended"],
        period_start=m["period_start"],
        period_end=m["period_end"],
        billed_seconds=m["billed_seconds"],
        spend_usd=m["spend_usd"],
        storage_usd=m["storage_usd"],
        on_demand_usd=m["on_demand_usd"],
        overhead_seconds=m["overhead_seconds"],
        overhead_usd=m["overhead_usd"],
        refunded=bool(m["refunded"]),
        idle_spare=bool(m["spare"]) and m["promoted_at"] is None,
    )
