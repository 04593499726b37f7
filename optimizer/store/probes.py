"""The probe results repository: every probe an attempt's agent reported, and the figures the
ranking reads from them.

A result is written in the transaction that records its agent event (`Jobs.record_agent_events`
calls `write_probe_result`), so a batch the agent sends again stores it once: the event id is
the key. The row copies the attempt's place (provider, region, zone, instance type) and the
figures the ranking and `gpuopt probes list` read; `result` keeps the whole probe JSON.

Two reads serve the ranking, both per (provider, instance type):

- `figures`: the median of each figure over the last `last` usable results (status pass or
  warn), with how many there were and when the newest and oldest were taken. Results that
  are not the cloud type's own measurement (the `simulated` column: no real GPU measured, or
  measured on the daemon's own host) are left out: they describe the machine the agent ran
  on, not the type the offer sells. TFLOPS come from the last `last` usable results that
  stored TFLOPS: a handover probe stores none (short GEMM bursts, no sustained bf16 stage).
- `streaks`: how many of the last `last` results failed, simulated or not; a type whose
  probes keep failing on one provider is demoted by the ranking (docs/policies.md).

A record's `source` says where its figures come from: `measured` (a GPU of the cloud type),
`host` (a real GPU on the daemon's own host: the local cloud) or `simulated` (no GPU measured).
The `simulated` column keeps its stored meaning, "not the type's own measurement", so it is set
for `host` and `simulated` alike and `source` is told from it and the GPU model
(docs/probes.md, Where the figures come from).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, func, insert, select

from optimizer.clock import utc_text
from optimizer.common.jobnames import given_name
from optimizer.store.engine import Database, table
from optimizer.store.tables import Attempt, Job, ProbeResult

_PROBE = table(ProbeResult)
_ATTEMPT = table(Attempt)
_JOB = table(Job)

DEFAULT_LAST = 5  # results per type the figures and the failure streaks look at
USABLE = ("pass", "warn")  # verdicts whose figures the ranking may use
# The all-reduce size the probe judges bus bandwidth at (optimizer.probes.perf_rules).
_ALLREDUCE_BYTES = 1 << 30

TypeKey = tuple[str, str]  # (provider, instance type)
MEASURED, HOST, SIMULATED = "measured", "host", "simulated"  # a result's `source`
HANDOVER = "handover"  # the probe kind whose TFLOPS are not stored (module docstring)


def source_of(type_measured: bool, gpu_model: str | None) -> str:
    """A stored result's `source` (module docstring): from the `simulated` column (negated
    here) and whether a GPU model was seen."""
    if type_measured:
        return MEASURED
    return HOST if gpu_model is not None else SIMULATED


@dataclass(frozen=True, slots=True)
class ProbeRecord:
    """One stored probe result. `tflops` is per GPU by dtype; bandwidths are GB/s per GPU
    (copy: bytes read plus written; host link: pinned host-to-device and back, their median)
    and the node's all-reduce bus bandwidth at 1 GiB."""

    id: int
    attempt_id: int
    job_id: int
    job: str
    provider: str
    region: str
    zone: str | None
    instance_type: str
    gpu_model: str | None
    gpu_count: int | None
    status: str
    tflops: dict[str, float]
    copy_gbps: float | None
    host_link_gbps: float | None
    allreduce_busbw_gbps: float | None
    simulated: bool  # no GPU measured (source `simulated`)
    at: datetime
    source: str = MEASURED  # measured | host | simulated
    kind: str | None = None  # handover | quick | deep, as the probe JSON says

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["at"] = utc_text(self.at)
        return out


@dataclass(frozen=True, slots=True)
class TypeFigures:
    """A (provider, instance type)'s robust measured figures: medians over its last `n`
    usable, non-simulated results, taken between `oldest_at` and `newest_at`."""

    provider: str
    instance_type: str
    gpu_model: str | None  # the newest of those results' model
    n: int
    tflops: dict[str, float]  # per GPU, by dtype
    copy_gbps: float | None
    host_link_gbps: float | None
    allreduce_busbw_gbps: float | None
    newest_at: datetime
    oldest_at: datetime


@dataclass(frozen=True, slots=True)
class FailureStreak:
    """How a type's last `of` probe results on one provider went: `failed` of them failed.
    `since` is when the oldest failure among them was taken (what names the streak)."""

    provider: str
    instance_type: str
    failed: int
    of: int
    since: datetime
    latest_at: datetime


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _number(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok else None


def extract(result: Mapping[str, Any]) -> dict[str, Any]:
    """The columns a probe JSON (schema `gpuopt.probe`, docs/probes.md) fills; a result that
    is only `{"error": …}` fills none of them."""
    runs = [r for r in result.get("runs") or () if isinstance(r, Mapping) and r.get("ok")]
    gpu_runs = [r for r in runs if r.get("device") == "cuda"]
    used = gpu_runs or runs
    tflops: dict[str, float] = {}
    measured = result.get("measured_tflops")
    if isinstance(measured, Mapping):
        for figures in measured.values():
            if isinstance(figures, Mapping):
                for dtype, value in figures.items():
                    number = _number(value)
                    if number is not None:
                        tflops.setdefault(str(dtype), number)
    copies = [v for r in used if (v := _number(r.get("copy_gbps"))) is not None]
    links = [
        v
        for r in used
        for key in ("h2d_gbps", "d2h_gbps")
        if (v := _number(r.get(key))) is not None
    ]
    node = result.get("node")
    busbw = None
    if isinstance(node, Mapping):
        points = [p for p in node.get("points") or () if isinstance(p, Mapping)]
        judged = [p for p in points if p.get("nbytes") == _ALLREDUCE_BYTES]
        if judged:
            busbw = _number(judged[0].get("busbw_gbps"))
    model = result.get("gpu_model")
    return {
        "gpu_model": str(model) if isinstance(model, str) else None,
        "gpu_count": len(gpu_runs) or None,
        "tflops": tflops,
        "copy_gbps": _median(copies),
        "host_link_gbps": _median(links),
        "allreduce_busbw_gbps": busbw,
        # No CUDA device measured: the figures are a CPU's, or there are none.
        "simulated": result.get("backend") != "cuda",
    }


def write_probe_result(
    conn: Connection, attempt_key: str, data: Mapping[str, Any], at: datetime, *, on_host: bool
) -> None:
    """Store the probe an agent reported for an attempt (a `probe_result` event's `data`), on
    the caller's transaction. `on_host`: the attempt's instance runs on the daemon's own host
    (the local cloud), so its figures are the host's, not the type's: simulated."""
    attempt = conn.execute(
        select(
            _ATTEMPT.c.id,
            _ATTEMPT.c.job_id,
            _ATTEMPT.c.provider,
            _ATTEMPT.c.region,
            _ATTEMPT.c.zone,
            _ATTEMPT.c.instance_type,
        ).where(_ATTEMPT.c.idempotency_key == attempt_key)
    ).first()
    if attempt is None:
        return
    raw = data.get("result")
    result: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    status = str(data.get("status", "fail"))
    figures = extract(result)
    tflops = figures.pop("tflops")
    if result.get("kind") == HANDOVER:  # burst GEMMs only: not the type's TFLOPS (docstring)
        tflops = {}
    conn.execute(
        insert(_PROBE).values(
            attempt_id=attempt.id,
            job_id=attempt.job_id,
            provider=attempt.provider,
            region=attempt.region,
            zone=attempt.zone or "",
            instance_type=attempt.instance_type,
            status=status if status in ("pass", "warn", "fail") else "fail",
            tflops=json.dumps(tflops, sort_keys=True) if tflops else None,
            at=at,
            result=json.dumps(result, sort_keys=True) if result else None,
            **{**figures, "simulated": figures["simulated"] or on_host},
        )
    )


def _kind(raw: str | None) -> str | None:
    try:
        kind = json.loads(raw).get("kind") if raw else None
    except (ValueError, AttributeError):
        return None
    return kind if isinstance(kind, str) else None


def _record(row: Any, job: str) -> ProbeRecord:
    source = source_of(not row.simulated, row.gpu_model)
    return ProbeRecord(
        id=row.id,
        attempt_id=row.attempt_id,
        job_id=row.job_id,
        job=job,
        provider=row.provider,
        region=row.region,
        zone=row.zone or None,
        instance_type=row.instance_type,
        gpu_model=row.gpu_model,
        gpu_count=row.gpu_count,
        status=row.status,
        tflops=json.loads(row.tflops) if row.tflops else {},
        copy_gbps=row.copy_gbps,
        host_link_gbps=row.host_link_gbps,
        allreduce_busbw_gbps=row.allreduce_busbw_gbps,
        simulated=source == SIMULATED,
        at=row.at,
        source=source,
        kind=_kind(row.result),
    )


class Probes:
    """Read the probe_result table: the history, and the ranking's per-type figures."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def page(
        self,
        *,
        instance_type: str | None = None,
        provider: str | None = None,
        before_id: int | None = None,
        limit: int = 100,
    ) -> list[ProbeRecord]:
        """Results newest first, optionally of one type or provider; page with `before_id`."""
        query = (
            select(_PROBE, _JOB.c.name.label("job_name"))
            .join(_JOB, _JOB.c.id == _PROBE.c.job_id)
            .order_by(_PROBE.c.id.desc())
            .limit(limit)
        )
        if instance_type is not None:
            query = query.where(_PROBE.c.instance_type == instance_type)
        if provider is not None:
            query = query.where(_PROBE.c.provider == provider)
        if before_id is not None:
            query = query.where(_PROBE.c.id < before_id)
        with self._db.connect() as conn:
            return [_record(r, given_name(r.job_name)) for r in conn.execute(query)]

    def result_json(self, probe_id: int) -> dict[str, Any] | None:
        """The whole probe JSON a result was stored with (None: none, or no such result)."""
        with self._db.connect() as conn:
            raw = conn.execute(select(_PROBE.c.result).where(_PROBE.c.id == probe_id)).scalar()
        return json.loads(raw) if raw else None

    def probed_in_full(self, provider: str, instance_type: str, *, any_source: bool) -> bool:
        """Whether the type has a usable full (quick or deep) result with TFLOPS: measured on
        a GPU, or with `any_source` (the local cloud, whose every instance is this host) also
        a simulated one. What makes an attempt's `quick` a `handover` (optimizer.probes)."""
        query = (
            select(_PROBE.c.id)
            .where(
                _PROBE.c.provider == provider,
                _PROBE.c.instance_type == instance_type,
                _PROBE.c.status.in_(USABLE),
                _PROBE.c.tflops.is_not(None),
            )
            .limit(1)
        )
        if not any_source:
            query = query.where(_PROBE.c.gpu_model.is_not(None))
        with self._db.connect() as conn:
            return conn.execute(query).first() is not None

    def _recent(
        self, conn: Connection, last: int, *, usable: bool, with_tflops: bool = False
    ) -> dict[TypeKey, list[Any]]:
        """Each (provider, type)'s newest `last` rows, newest first (usable, non-simulated
        ones only with `usable`; only those that stored TFLOPS with `with_tflops`)."""
        rank = (
            func.row_number()
            .over(
                partition_by=(_PROBE.c.provider, _PROBE.c.instance_type),
                order_by=(_PROBE.c.at.desc(), _PROBE.c.id.desc()),
            )
            .label("n")
        )
        inner = select(_PROBE, rank)
        if usable:
            inner = inner.where(_PROBE.c.status.in_(USABLE), _PROBE.c.simulated.is_(False))
        if with_tflops:
            inner = inner.where(_PROBE.c.tflops.is_not(None))
        sub = inner.subquery()
        query = select(sub).where(sub.c.n <= last).order_by(sub.c.n)
        out: dict[TypeKey, list[Any]] = {}
        for row in conn.execute(query):
            out.setdefault((row.provider, row.instance_type), []).append(row)
        return out

    def figures(self, *, last: int = DEFAULT_LAST) -> dict[TypeKey, TypeFigures]:
        """Each (provider, instance type)'s medians over its last `last` usable results
        (module docstring); types with none are left out."""
        with self._db.connect() as conn:
            recent = self._recent(conn, last, usable=True)
            with_tflops = self._recent(conn, last, usable=True, with_tflops=True)
        out: dict[TypeKey, TypeFigures] = {}
        for (provider, kind), rows in recent.items():
            pooled: dict[str, list[float]] = {}
            for row in with_tflops.get((provider, kind), ()):
                for dtype, value in (json.loads(row.tflops) if row.tflops else {}).items():
                    pooled.setdefault(dtype, []).append(float(value))

            def median_of(column: str, rows: list[Any] = rows) -> float | None:
                return _median([v for r in rows if (v := getattr(r, column)) is not None])

            out[(provider, kind)] = TypeFigures(
                provider=provider,
                instance_type=kind,
                gpu_model=rows[0].gpu_model,
                n=len(rows),
                tflops={d: statistics.median(v) for d, v in sorted(pooled.items())},
                copy_gbps=median_of("copy_gbps"),
                host_link_gbps=median_of("host_link_gbps"),
                allreduce_busbw_gbps=median_of("allreduce_busbw_gbps"),
                newest_at=rows[0].at,
                oldest_at=rows[-1].at,
            )
        return out

    def streaks(self, *, last: int = DEFAULT_LAST) -> dict[TypeKey, FailureStreak]:
        """Each (provider, instance type)'s failures among its last `last` results (any
        verdict, simulated too); types with no failure among them are left out."""
        with self._db.connect() as conn:
            recent = self._recent(conn, last, usable=False)
        out: dict[TypeKey, FailureStreak] = {}
        for (provider, kind), rows in recent.items():
            failed = [r for r in rows if r.status not in USABLE]
            if failed:
                out[(provider, kind)] = FailureStreak(
                    provider=provider,
                    instance_type=kind,
                    failed=len(failed),
                    of=len(rows),
                    since=failed[-1].at,
                    latest_at=rows[0].at,
                )
        return out
