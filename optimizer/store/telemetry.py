"""The GPU telemetry repository: each attempt's GPU readings, per minute and then per hour.

Agents sample NVML every few seconds and send one aggregate per minute (`GpuMinute`); each is
stored once per (attempt, minute), so a batch sent again is taken again without a copy.
`downsample` folds the minutes of every hour wholly before a cutoff into one hourly row per
attempt (span 3600) in the same transaction that deletes them; a minute that arrives for an
hour already folded is merged into it on the next pass. `expire` drops hourly rows past their
retention. Readings injected by the local cloud for drills carry `simulated`.

Reading: `samples` (one attempt's or one job's rows since a time, oldest first), `latest`
(each attempt's newest row) and `summary` (current and average utilization, peak memory).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Row, delete, func, select

from optimizer.clock import parse_utc
from optimizer.lifecycle import TERMINAL_JOB_STATES
from optimizer.store.engine import Database, aware, dialect_insert, table
from optimizer.store.tables import Attempt, GpuSample, Job

log = logging.getLogger(__name__)

GPU_TELEMETRY = "gpu_telemetry"  # the agent event that carries spans
_SAMPLE = table(GpuSample)
_ATTEMPT = table(Attempt)
_JOB = table(Job)

MINUTE_S = 60
HOUR_S = 3600
DOWNSAMPLE_BATCH = 5_000  # minute rows one downsample call folds at most


@dataclass(frozen=True, slots=True)
class GpuMinute:
    """One span's readings of an attempt, aggregated across its GPUs (what an agent sends
    per minute). `start` is the span's start (a whole UTC minute for span 60); utilization is
    a fraction 0..1; memory in GiB (used: the highest of the span summed over the GPUs;
    total: summed over the GPUs)."""

    start: datetime
    samples: int
    gpus: int
    util_mean: float | None = None
    util_max: float | None = None
    memory_used_gib_max: float | None = None
    memory_total_gib: float | None = None
    power_w_mean: float | None = None
    temperature_c_max: float | None = None
    sm_clock_mhz_mean: float | None = None
    throttle_reasons: int = 0
    xids: tuple[int, ...] = ()
    simulated: bool = False
    span_s: int = MINUTE_S


@dataclass(frozen=True, slots=True)
class GpuSampleRecord:
    """A stored span of one attempt."""

    attempt_id: int
    start: datetime
    span_s: int
    samples: int
    gpus: int
    util_mean: float | None
    util_max: float | None
    memory_used_gib_max: float | None
    memory_total_gib: float | None
    power_w_mean: float | None
    temperature_c_max: float | None
    sm_clock_mhz_mean: float | None
    throttle_reasons: int
    xids: tuple[int, ...]
    simulated: bool

    @property
    def memory_used_ratio(self) -> float | None:
        if self.memory_used_gib_max is None or not self.memory_total_gib:
            return None
        return self.memory_used_gib_max / self.memory_total_gib


@dataclass(frozen=True, slots=True)
class GpuSummary:
    """A job's (or attempt's) telemetry over a window.

    `current_*`: the newest span (of the newest attempt that reported); `average_util`: the
    mean utilization over every span, weighted by its samples; `peak_memory_used_gib`: the
    highest memory used in any span, with that span's `memory_total_gib`; `simulated`: some
    span was injected by the local cloud."""

    attempt_id: int
    current_at: datetime
    current_util: float | None
    current_memory_used_gib: float | None
    memory_total_gib: float | None
    average_util: float | None
    peak_memory_used_gib: float | None
    spans: int
    samples: int
    first_at: datetime
    simulated: bool
    throttle_reasons: int = 0
    xids: tuple[int, ...] = field(default=())

    @property
    def peak_memory_used_ratio(self) -> float | None:
        if self.peak_memory_used_gib is None or not self.memory_total_gib:
            return None
        return self.peak_memory_used_gib / self.memory_total_gib

    @property
    def current_memory_used_ratio(self) -> float | None:
        if self.current_memory_used_gib is None or not self.memory_total_gib:
            return None
        return self.current_memory_used_gib / self.memory_total_gib


@dataclass(frozen=True, slots=True)
class Interruption:
    """An attempt the cloud interrupted: its pool, when (the notice, else the attempt's end)
    and when the job was running again on its replacement (None: not yet)."""

    provider: str
    region: str
    instance_type: str
    at: datetime | None
    running_again_at: datetime | None

    @property
    def recovery_s(self) -> float | None:
        if self.at is None or self.running_again_at is None:
            return None
        return max((self.running_again_at - self.at).total_seconds(), 0.0)


@dataclass(frozen=True, slots=True)
class Downsampled:
    """What one `downsample` call did."""

    minutes: int = 0  # minute rows folded (and deleted)
    hours: int = 0  # hourly rows written or merged into


_KEY = ("attempt_id", "start", "span_s")
_COLUMNS = (
    "attempt_id",
    "start",
    "span_s",
    "samples",
    "gpus",
    "util_mean",
    "util_max",
    "memory_used_gib_max",
    "memory_total_gib",
    "power_w_mean",
    "temperature_c_max",
    "sm_clock_mhz_mean",
    "throttle_reasons",
    "xids",
    "simulated",
)


def _record(row: Row[Any]) -> GpuSampleRecord:
    m = dict(row._mapping)
    m["xids"] = tuple(json.loads(m["xids"])) if m["xids"] else ()
    m["throttle_reasons"] = int(m["throttle_reasons"] or 0)
    m["simulated"] = bool(m["simulated"])
    return GpuSampleRecord(**{name: m[name] for name in _COLUMNS})


def _select() -> Any:
    return select(*(_SAMPLE.c[name] for name in _COLUMNS))


def floor_minute(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(second=0, microsecond=0)


def floor_hour(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def _check(m: GpuMinute) -> None:
    if m.span_s not in (MINUTE_S, HOUR_S):
        raise ValueError(f"span_s must be {MINUTE_S} or {HOUR_S}, got {m.span_s}")
    if m.samples < 1:
        raise ValueError(f"samples must be >= 1, got {m.samples}")
    if m.gpus < 0:
        raise ValueError(f"gpus must be >= 0, got {m.gpus}")
    for name in ("util_mean", "util_max"):
        v = getattr(m, name)
        if v is not None and not 0.0 <= v <= 1.0:
            raise ValueError(f"{name} must be a fraction in [0, 1], got {v}")
    for name in ("memory_used_gib_max", "memory_total_gib"):
        v = getattr(m, name)
        if v is not None and v < 0:
            raise ValueError(f"{name} must be >= 0, got {v}")


def fold(spans: Sequence[GpuSampleRecord | GpuMinute], start: datetime) -> GpuMinute:
    """One hourly span starting at `start` from `spans` (minutes, and an hourly row already
    held): means weighted by samples, maxima over all, throttle bits ORed, XIDs unioned."""

    def wmean(name: str) -> float | None:
        pairs = [(getattr(s, name), s.samples) for s in spans if getattr(s, name) is not None]
        n = sum(w for _, w in pairs)
        return sum(v * w for v, w in pairs) / n if n else None

    def vmax(name: str) -> float | None:
        values = [getattr(s, name) for s in spans if getattr(s, name) is not None]
        return max(values) if values else None

    bits = 0
    xids: set[int] = set()
    for s in spans:
        bits |= s.throttle_reasons
        xids.update(s.xids)
    return GpuMinute(
        start=start,
        span_s=HOUR_S,
        samples=sum(s.samples for s in spans),
        gpus=max(s.gpus for s in spans),
        util_mean=wmean("util_mean"),
        util_max=vmax("util_max"),
        memory_used_gib_max=vmax("memory_used_gib_max"),
        memory_total_gib=vmax("memory_total_gib"),
        power_w_mean=wmean("power_w_mean"),
        temperature_c_max=vmax("temperature_c_max"),
        sm_clock_mhz_mean=wmean("sm_clock_mhz_mean"),
        throttle_reasons=bits,
        xids=tuple(sorted(xids)),
        simulated=any(s.simulated for s in spans),
    )


def _row(attempt_id: int, m: GpuMinute) -> dict[str, Any]:
    return {
        "attempt_id": attempt_id,
        "start": m.start,
        "span_s": m.span_s,
        "samples": m.samples,
        "gpus": m.gpus,
        "util_mean": m.util_mean,
        "util_max": m.util_max,
        "memory_used_gib_max": m.memory_used_gib_max,
        "memory_total_gib": m.memory_total_gib,
        "power_w_mean": m.power_w_mean,
        "temperature_c_max": m.temperature_c_max,
        "sm_clock_mhz_mean": m.sm_clock_mhz_mean,
        "throttle_reasons": int(m.throttle_reasons),
        "xids": json.dumps(sorted(set(m.xids))) if m.xids else None,
        "simulated": bool(m.simulated),
    }


class Telemetry:
    """Add, read, downsample and expire the gpu_sample table."""

    def __init__(self, db: Database) -> None:
        self._db = db

    # -- writing ----------------------------------------------------------------------------

    def add(self, attempt_id: int, minutes: Iterable[GpuMinute]) -> int:
        """Store the spans not held yet (by attempt, start, span), and replace a held one by
        one of more samples (a minute the agent reported while it was still going, then
        whole); returns how many rows were written. A span's start is floored to its minute
        (or hour). One transaction."""
        unique: dict[tuple[datetime, int], GpuMinute] = {}
        for m in minutes:
            _check(m)
            start = aware(m.start, "start")
            start = floor_minute(start) if m.span_s == MINUTE_S else floor_hour(start)
            unique.setdefault((start, m.span_s), _replace_start(m, start))
        if not unique:
            return 0
        with self._db.begin() as conn:
            return write_spans(conn, self._db.dialect, attempt_id, unique.values())

    # -- reading ----------------------------------------------------------------------------

    def samples(
        self,
        *,
        attempt_id: int | None = None,
        job_id: int | None = None,
        since: datetime | None = None,
        limit: int = 10_000,
    ) -> list[GpuSampleRecord]:
        """The spans of one attempt or of every attempt of one job starting at or after
        `since`, oldest first (minutes and hours together), at most `limit` (the newest)."""
        query = _select()
        if (attempt_id is None) == (job_id is None):
            raise ValueError("give exactly one of attempt_id and job_id")
        if attempt_id is not None:
            query = query.where(_SAMPLE.c.attempt_id == attempt_id)
        else:
            query = query.where(
                _SAMPLE.c.attempt_id.in_(select(_ATTEMPT.c.id).where(_ATTEMPT.c.job_id == job_id))
            )
        if since is not None:
            query = query.where(_SAMPLE.c.start >= aware(since, "since"))
        query = query.order_by(_SAMPLE.c.start.desc(), _SAMPLE.c.attempt_id.desc()).limit(limit)
        with self._db.connect() as conn:
            rows = [_record(r) for r in conn.execute(query)]
        rows.reverse()
        return rows

    def ending_after(self, attempt_id: int, since: datetime) -> list[GpuSampleRecord]:
        """One attempt's spans that end after `since`, oldest first (what the utilization
        watch reads)."""
        # Spans are at most an hour (the downsampled rows): any that ends after `since` starts
        # after `since - 1 h`.
        query = (
            _select()
            .where(
                _SAMPLE.c.attempt_id == attempt_id,
                _SAMPLE.c.start > since - timedelta(hours=1),
            )
            .order_by(_SAMPLE.c.start)
        )
        with self._db.connect() as conn:
            rows = [_record(r) for r in conn.execute(query)]
        spans = []
        for row in rows:
            start = row.start if row.start.tzinfo is not None else row.start.replace(tzinfo=UTC)
            if start + timedelta(seconds=row.span_s) > since:
                spans.append(replace(row, start=start))
        return spans

    def latest(self, attempt_ids: Sequence[int]) -> dict[int, GpuSampleRecord]:
        """Each attempt's newest span (attempts with none left out)."""
        if not attempt_ids:
            return {}
        newest = (
            select(_SAMPLE.c.attempt_id, func.max(_SAMPLE.c.start).label("start"))
            .where(_SAMPLE.c.attempt_id.in_(list(attempt_ids)))
            .group_by(_SAMPLE.c.attempt_id)
            .subquery()
        )
        query = (
            _select()
            .join(
                newest,
                (newest.c.attempt_id == _SAMPLE.c.attempt_id) & (newest.c.start == _SAMPLE.c.start),
            )
            .order_by(_SAMPLE.c.span_s)
        )
        out: dict[int, GpuSampleRecord] = {}
        with self._db.connect() as conn:
            for row in conn.execute(query):
                rec = _record(row)
                out.setdefault(rec.attempt_id, rec)  # a minute before an hour starting with it
        return out

    def summary(
        self,
        *,
        attempt_id: int | None = None,
        job_id: int | None = None,
        since: datetime | None = None,
    ) -> GpuSummary | None:
        """Current and average utilization and peak memory of one attempt or job over the
        spans starting at or after `since` (all when None); None when there are none."""
        rows = self.samples(attempt_id=attempt_id, job_id=job_id, since=since, limit=1_000_000)
        return summarize(rows)

    def live_jobs_latest(self) -> dict[str, GpuSampleRecord]:
        """Each job that has not ended: its newest attempt's newest span, by job name (jobs
        whose newest attempt reported none left out)."""
        newest = (
            select(_ATTEMPT.c.job_id, func.max(_ATTEMPT.c.id).label("attempt_id"))
            .join(_JOB, _JOB.c.id == _ATTEMPT.c.job_id)
            .where(_JOB.c.state.not_in(sorted(TERMINAL_JOB_STATES)), _JOB.c.removed_at.is_(None))
            .group_by(_ATTEMPT.c.job_id)
            .subquery()
        )
        query = select(_JOB.c.name, newest.c.attempt_id).join(newest, newest.c.job_id == _JOB.c.id)
        with self._db.connect() as conn:
            names = {int(a): str(n) for n, a in conn.execute(query)}
        latest = self.latest(list(names))
        return {names[a]: rec for a, rec in latest.items()}

    def interruptions(self) -> list[Interruption]:
        """Every attempt the cloud interrupted (a notice reached its agent, or the provider
        reported it preempted), with when its job was running again on the next attempt (None
        until then); oldest first."""
        nxt = _ATTEMPT.alias("next_attempt")
        query = (
            select(
                _ATTEMPT.c.provider,
                _ATTEMPT.c.region,
                _ATTEMPT.c.instance_type,
                _ATTEMPT.c.notice_at,
                _ATTEMPT.c.ended_at,
                nxt.c.job_started_at,
            )
            .select_from(
                _ATTEMPT.outerjoin(
                    nxt,
                    (nxt.c.job_id == _ATTEMPT.c.job_id) & (nxt.c.number == _ATTEMPT.c.number + 1),
                )
            )
            .where(_ATTEMPT.c.notice_at.is_not(None) | _ATTEMPT.c.preempted.is_(True))
            .order_by(_ATTEMPT.c.id)
        )
        with self._db.connect() as conn:
            return [
                Interruption(p, r, t, notice or ended, again)
                for p, r, t, notice, ended, again in conn.execute(query)
            ]

    # -- ageing -----------------------------------------------------------------------------

    def downsample(self, *, before: datetime, limit: int = DOWNSAMPLE_BATCH) -> Downsampled:
        """Fold up to `limit` minute rows of hours wholly before `before` (floored to its hour)
        into hourly rows, merging with an hourly row already there; one transaction. Fewer
        than `limit` minutes folded: nothing more to do."""
        cutoff = floor_hour(self._db.now(before, "before"))
        ids = (
            select(_SAMPLE.c.id)
            .where(_SAMPLE.c.span_s == MINUTE_S, _SAMPLE.c.start < cutoff)
            .order_by(_SAMPLE.c.attempt_id, _SAMPLE.c.start)
            .limit(limit)
        )
        with self._db.begin() as conn:
            doomed = list(conn.execute(ids).scalars())
            if not doomed:
                return Downsampled()
            gone = [
                _record(r)
                for r in conn.execute(
                    delete(_SAMPLE)
                    .where(_SAMPLE.c.id.in_(doomed))
                    .returning(*(_SAMPLE.c[name] for name in _COLUMNS))
                )
            ]
            groups: dict[tuple[int, datetime], list[GpuSampleRecord | GpuMinute]] = {}
            for rec in gone:
                groups.setdefault((rec.attempt_id, floor_hour(rec.start)), []).append(rec)
            for (attempt, hour), spans in groups.items():
                held = _take_hour(conn, attempt, hour)
                if held is not None:
                    spans.append(held)
                conn.execute(
                    dialect_insert(self._db.dialect, _SAMPLE).values(
                        _row(attempt, fold(spans, hour))
                    )
                )
        return Downsampled(minutes=len(gone), hours=len(groups))

    def expire(self, *, before: datetime, limit: int = DOWNSAMPLE_BATCH) -> int:
        """Delete up to `limit` spans (either size) starting before `before`; how many went."""
        cutoff = self._db.now(before, "before")
        ids = (
            select(_SAMPLE.c.id).where(_SAMPLE.c.start < cutoff).order_by(_SAMPLE.c.id).limit(limit)
        )
        with self._db.begin() as conn:
            doomed = list(conn.execute(ids).scalars())
            if doomed:
                conn.execute(delete(_SAMPLE).where(_SAMPLE.c.id.in_(doomed)))
        return len(doomed)


def write_spans(conn: Connection, dialect: str, attempt_id: int, spans: Iterable[GpuMinute]) -> int:
    """Insert `spans` (checked, starts floored) on `conn`; a span already held is replaced
    only by one of more samples. Rows written."""
    rows = [_row(attempt_id, m) for m in spans]
    if not rows:
        return 0
    stmt = dialect_insert(dialect, _SAMPLE).values(rows)
    excluded = stmt.excluded
    upsert = stmt.on_conflict_do_update(
        index_elements=["attempt_id", "start", "span_s"],
        set_={name: excluded[name] for name in _COLUMNS if name not in _KEY},
        where=excluded.samples > _SAMPLE.c.samples,
    ).returning(_SAMPLE.c.id)
    return len(list(conn.execute(upsert).scalars()))


def write_telemetry(
    conn: Connection, dialect: str, attempt_key: str, data: Mapping[str, Any]
) -> dict[str, Any]:
    """Store a `gpu_telemetry` event's spans for the attempt keyed `attempt_key`, on `conn`.
    A span that does not parse is skipped (and counted), never failing the batch. Returns
    what the agent event row keeps: the counts, and `available`/`reason` when the agent said
    it has no GPU readings."""
    kept: dict[str, Any] = {k: data[k] for k in ("available", "reason", "simulated") if k in data}
    raw = data.get("minutes")
    if not isinstance(raw, list):
        return kept
    spans: dict[tuple[datetime, int], GpuMinute] = {}
    bad: list[str] = []
    for item in raw:
        try:
            if not isinstance(item, Mapping):
                raise ValueError("a span must be an object")
            span = parse_span(item)
        except ValueError as exc:
            bad.append(str(exc))
            continue
        held = spans.get((span.start, span.span_s))
        if held is None or span.samples > held.samples:
            spans[(span.start, span.span_s)] = span
    attempt_id = conn.execute(
        select(_ATTEMPT.c.id).where(_ATTEMPT.c.idempotency_key == attempt_key)
    ).scalar_one_or_none()
    if attempt_id is not None and spans:
        write_spans(conn, dialect, int(attempt_id), spans.values())
    if bad:
        log.warning(
            "attempt %s: %d GPU telemetry span(s) skipped: %s", attempt_key, len(bad), bad[0]
        )
    kept.update({"minutes": len(spans), "skipped": len(bad)})
    if bad:
        kept["error"] = bad[0][:200]
    return kept


def parse_span(raw: Mapping[str, Any]) -> GpuMinute:
    """One span in the agent's wire form (docs/agent-protocol.md, `gpu_telemetry`), checked;
    ValueError naming the field otherwise."""

    def num(name: str) -> float | None:
        v = raw.get(name)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ValueError(f"{name} must be a number, got {v!r}")
        return float(v)

    def whole(name: str, default: int | None = None) -> int:
        v = raw.get(name, default)
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{name} must be an integer, got {v!r}")
        return v

    start_raw = raw.get("start")
    if not isinstance(start_raw, str):
        raise ValueError(f"start must be an ISO time, got {start_raw!r}")
    try:
        start = parse_utc(start_raw)
    except ValueError:
        raise ValueError(f"start must be an ISO time, got {start_raw!r}") from None
    xids = raw.get("xids") or []
    if not isinstance(xids, list) or not all(
        isinstance(x, int) and not isinstance(x, bool) for x in xids
    ):
        raise ValueError(f"xids must be a list of integers, got {xids!r}")
    span = GpuMinute(
        start=aware(start, "start"),
        span_s=whole("span_s", MINUTE_S),
        samples=whole("samples"),
        gpus=whole("gpus", 0),
        util_mean=num("util_mean"),
        util_max=num("util_max"),
        memory_used_gib_max=num("memory_used_gib_max"),
        memory_total_gib=num("memory_total_gib"),
        power_w_mean=num("power_w_mean"),
        temperature_c_max=num("temperature_c_max"),
        sm_clock_mhz_mean=num("sm_clock_mhz_mean"),
        throttle_reasons=whole("throttle_reasons", 0),
        xids=tuple(xids),
        simulated=bool(raw.get("simulated", False)),
    )
    _check(span)
    start = floor_minute(span.start) if span.span_s == MINUTE_S else floor_hour(span.start)
    return _replace_start(span, start)


def _take_hour(conn: Connection, attempt_id: int, hour: datetime) -> GpuSampleRecord | None:
    """Remove and return the attempt's hourly row for `hour`, if any (to merge into)."""
    rows = conn.execute(
        delete(_SAMPLE)
        .where(
            _SAMPLE.c.attempt_id == attempt_id,
            _SAMPLE.c.start == hour,
            _SAMPLE.c.span_s == HOUR_S,
        )
        .returning(*(_SAMPLE.c[name] for name in _COLUMNS))
    ).all()
    return _record(rows[0]) if rows else None


def _replace_start(m: GpuMinute, start: datetime) -> GpuMinute:
    return m if m.start == start else replace(m, start=start)


def summarize(rows: Sequence[GpuSampleRecord]) -> GpuSummary | None:
    """`GpuSummary` of spans given oldest first; None when empty."""
    if not rows:
        return None
    last = rows[-1]
    weighted = [(r.util_mean, r.samples) for r in rows if r.util_mean is not None]
    n = sum(w for _, w in weighted)
    peak_row = max(
        (r for r in rows if r.memory_used_gib_max is not None),
        key=lambda r: r.memory_used_gib_max or 0.0,
        default=None,
    )
    bits = 0
    xids: set[int] = set()
    for r in rows:
        bits |= r.throttle_reasons
        xids.update(r.xids)
    return GpuSummary(
        attempt_id=last.attempt_id,
        current_at=last.start,
        current_util=last.util_mean,
        current_memory_used_gib=last.memory_used_gib_max,
        memory_total_gib=(
            peak_row.memory_total_gib if peak_row is not None else last.memory_total_gib
        ),
        average_util=sum(v * w for v, w in weighted) / n if n else None,
        peak_memory_used_gib=peak_row.memory_used_gib_max if peak_row is not None else None,
        spans=len(rows),
        samples=sum(r.samples for r in rows),
        first_at=rows[0].start,
        simulated=any(r.simulated for r in rows),
        throttle_reasons=bits,
        xids=tuple(sorted(xids)),
    )


__all__ = [
    "DOWNSAMPLE_BATCH",
    "GPU_TELEMETRY",
    "Downsampled",
    "GpuMinute",
    "GpuSampleRecord",
    "GpuSummary",
    "Interruption",
    "Telemetry",
    "fold",
    "parse_span",
    "summarize",
    "write_spans",
    "write_telemetry",
]
