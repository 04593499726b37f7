"""The cost ledger over the store: attempts and price history in, cost lines out.

The model is pure (optimizer/costs, docs/costs.md); this module gathers its inputs and keeps
its results:

- **Usage** of an attempt: launched = the provider's launch time (`attempt.launched_at`), else
  when gpuopt started the attempt; terminated = the provider's termination time, else the
  attempt's end once its instance is gone (None while it may still bill); interrupted by the
  cloud when `terminated_by == "cloud"`; the job ran from `job_started_at` to its agent's
  `job_exited` event (open while it runs); the root volume's GiB.
- **Prices**: the pool's own series (provider, region, zone, instance type, market) and, for
  the baseline, the on-demand series of the same instance type in the same region: the
  attempt's own zone's rows where it has any (AWS and GCP list on-demand per zone, at one
  price per region), else the region's zone-less rows (the local cloud lists on-demand per
  region). No series: the baseline is unknown for a spot attempt (`baseline_known` False).
- **Freezing**: an ended attempt whose termination is known has its lines written to the
  store once (`Ledger.freeze`, run at the end of each reconcile pass by `CostFreezer`), so its
  numbers never change when price points are downsampled; frozen lines are read back in one
  indexed query. Live attempts (and ended ones still waiting for their termination) are
  priced on each query, up to now.

`Ledger.lines` is the query every surface reads (`gpuopt costs`, `GET /costs`, `GET
/jobs/{name}`, budgets); `Ledger.total` sums the same lines with the frozen part summed by the
database.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TypedDict, Unpack

from optimizer.clock import Clock, utc_now
from optimizer.costs import Cost, GroupBy, Line, Usage, billed_span, monthly, total
from optimizer.costs.ledger import Interval, PricePoints
from optimizer.costs.lines import JOB_ROLE, WARM_SPARE, Totals, merge_totals, totals_by
from optimizer.costs.state_lines import state_lines
from optimizer.jobs.context import ReconcileContext
from optimizer.jobs.gang import head_number
from optimizer.model import Market, Pool
from optimizer.store import (
    AttemptRecord,
    BilledAttempt,
    CostLineRecord,
    CostTotals,
    LineFilter,
    Store,
)

# An ended attempt whose instance is gone but whose provider never reported a termination time
# is frozen this long after it ended, with the attempt's end as its termination: long enough
# for a describe pass to bring the provider's time in, where the provider reports one.
SETTLE = timedelta(minutes=10)
# Attempts frozen per call (per reconcile pass): a store that gains the ledger with many ended
# attempts freezes them over a few passes instead of holding one pass for long.
FREEZE_BATCH = 500


class Filters(TypedDict, total=False):
    """Which lines a ledger query covers (each left out or None: any): the months that
    overlap [since, until), one job by name or id, one policy, provider or market."""

    since: datetime | None
    until: datetime | None
    job: str | None
    job_id: int | None
    policy: str | None
    provider: str | None
    market: str | None


def usage_of(billed: BilledAttempt) -> Usage:
    """An attempt's instance as billing sees it (see the module's docstring)."""
    a = billed.attempt
    terminated = a.terminated_at
    if terminated is None and a.instance_gone and a.ended_at is not None:
        terminated = a.ended_at
    running: tuple[tuple[datetime, datetime | None], ...] = ()
    if a.job_started_at is not None:
        running = ((a.job_started_at, billed.job_exited_at),)
    return Usage(
        provider=a.provider,
        market=a.market,
        launched=a.launched_at or a.started_at,
        terminated=terminated,
        launch_usd_per_hour=a.usd_per_hour,
        interrupted_by_cloud=a.terminated_by == "cloud",
        running=running,
        disk_gib=a.disk_gib or 0.0,
    )


def attempt_role(a: AttemptRecord) -> str:
    """Whose instance time the attempt's lines price: WARM_SPARE for a warm spare that has not
    taken the job over (optimizer/jobs/spares.py), else the job's (JOB_ROLE)."""
    return WARM_SPARE if a.idle_spare else JOB_ROLE


def line_of(record: CostLineRecord) -> Line:
    """A stored line as the ledger's `Line`."""
    return Line(
        job_id=record.job_id,
        job=record.job,
        policy=record.policy,
        attempt=record.attempt,
        provider=record.provider,
        region=record.region,
        zone=record.zone,
        instance_type=record.instance_type,
        market=record.market,
        instance_id=record.instance_id,
        launched=record.launched,
        ended=record.ended,
        period_start=record.period_start,
        period_end=record.period_end,
        cost=Cost(
            billed_seconds=record.billed_seconds,
            spend_usd=record.spend_usd,
            storage_usd=record.storage_usd,
            on_demand_usd=record.on_demand_usd or 0.0,
            overhead_seconds=record.overhead_seconds,
            overhead_usd=record.overhead_usd,
            refunded=record.refunded,
            baseline_known=record.on_demand_usd is not None,
        ),
        frozen=True,
        role=WARM_SPARE if record.idle_spare else JOB_ROLE,
    )


def record_of(attempt_id: int, line: Line) -> CostLineRecord:
    """A line as the store keeps it."""
    c = line.cost
    return CostLineRecord(
        attempt_id=attempt_id,
        job_id=line.job_id,
        job=line.job,
        policy=line.policy,
        attempt=line.attempt,
        provider=line.provider,
        region=line.region,
        zone=line.zone,
        instance_type=line.instance_type,
        market=line.market,
        instance_id=line.instance_id,
        launched=line.launched,
        ended=line.ended,
        period_start=line.period_start,
        period_end=line.period_end,
        billed_seconds=c.billed_seconds,
        spend_usd=c.spend_usd,
        storage_usd=c.storage_usd,
        on_demand_usd=c.on_demand_usd if c.baseline_known else None,
        overhead_seconds=c.overhead_seconds,
        overhead_usd=c.overhead_usd,
        refunded=c.refunded,
        idle_spare=line.role == WARM_SPARE,
    )


def overlaps(line: Line, since: datetime | None, until: datetime | None) -> bool:
    """Whether the line's month overlaps [since, until) (the ledger's unit is a month)."""
    return (since is None or line.period_end > since) and (
        until is None or line.period_start < until
    )


@dataclass(frozen=True, slots=True)
class Ledger:
    """The cost ledger of one store; "now" comes from `clock` unless a call passes it."""

    store: Store
    clock: Clock = utc_now

    # -- queries -----------------------------------------------------------------------------

    def lines(self, *, now: datetime | None = None, **filters: Unpack[Filters]) -> list[Line]:
        """Cost lines (one attempt in one calendar month) whose month overlaps [since, until),
        of one job (by name, or by id), policy, provider or market (None: any), oldest month
        first, then by job and attempt. Frozen lines come from one query; the rest (live
        attempts, and ended ones whose termination is not known yet) are priced as of `now`
        (the clock's time when None)."""
        where = self._filter(**filters)
        if where is None:
            return []
        frozen = [line_of(r) for r in self.store.costs.frozen_lines(where)]
        live = self._priced(where, now)
        return sorted(
            [*frozen, *live], key=lambda line: (line.period_start, line.job_id, line.attempt)
        )

    def total(self, *, now: datetime | None = None, **filters: Unpack[Filters]) -> Cost:
        """The sum of `lines(...)` with the same arguments, the frozen part summed by the
        database (what a budget check or a counter needs, without building every line)."""
        where = self._filter(**filters)
        if where is None:
            return Cost()
        (sums,) = self.store.costs.frozen_sums(where) or [CostTotals()]
        frozen = _totals(None, sums).cost
        return frozen + total(line.cost for line in self._priced(where, now))

    def groups(
        self,
        by: GroupBy,
        *,
        markets: bool = False,
        now: datetime | None = None,
        **filters: Unpack[Filters],
    ) -> list[Totals]:
        """The sums of `lines(...)` grouped by `by`, in key order (months oldest first); with
        `markets`, each group's sums split by market too (`Totals.markets`), from the same
        reads. By policy, provider, market or month the database sums the frozen lines, so
        the answer costs one grouped query however many attempts ended; by job, the lines
        are summed."""
        where = self._filter(**filters)
        if where is None:
            return []
        if by is GroupBy.JOB:
            return totals_by(self.lines(now=now, **filters), by, markets=markets)
        live = totals_by(self._priced(where, now), by, markets=markets)
        if not markets:
            frozen = [_totals(by, s) for s in self.store.costs.frozen_sums(where, (by.value,))]
            return merge_totals(frozen, live)
        split: dict[str, list[Totals]] = {}
        for sums in self.store.costs.frozen_sums(where, (by.value, GroupBy.MARKET.value)):
            key, market = sums.key
            part = _totals(by, replace(sums, key=key))
            split.setdefault(part.key, []).append(
                replace(part, markets=(replace(part, key=str(market)),))
            )
        frozen = [sum(parts[1:], parts[0]) for parts in split.values()]
        return merge_totals(frozen, live)

    def price(self, billed: BilledAttempt, now: datetime) -> list[Line]:
        """One attempt's lines, priced from the store's price history as of `now`."""
        return self.price_all([billed], now)[0]

    def price_all(self, billed: Sequence[BilledAttempt], now: datetime) -> list[list[Line]]:
        """Attempts' lines, each attempt's in a list, priced from the store's price history as
        of `now`: one read of each pool's series over the time its attempts need, however many
        attempts share it."""
        usages = [(b, usage_of(b), billed_span(usage_of(b), now)) for b in billed]
        spans: dict[Pool, Interval] = {}
        for b, _, span in usages:
            for pool in _series_of(b.attempt):
                held = spans.get(pool)
                spans[pool] = (
                    span if held is None else (min(held[0], span[0]), max(held[1], span[1]))
                )
        windows = [(pool, *span) for pool, span in spans.items()]
        read = self.store.prices.price_histories(windows, prior=True) if windows else []
        series = {pool: _Series(points) for pool, points in zip(spans, read, strict=True)}
        out = []
        for b, usage, span in usages:
            own, *baselines = (series[pool].over(span) for pool in _series_of(b.attempt))
            baseline = next((points for points in baselines if points), [])
            out.append(_lines(b, usage, now, own, baseline))
        return out

    # -- freezing ----------------------------------------------------------------------------

    def freeze(
        self, now: datetime | None = None, settle: timedelta = SETTLE, limit: int = FREEZE_BATCH
    ) -> int:
        """Write the lines of the ended attempts whose termination is known and that have none
        stored yet, at most `limit` attempts (the oldest first; the next call takes the rest);
        idempotent. Returns the number of lines written."""
        now = now or self.clock()
        ready = self.store.costs.to_freeze(now, settle, limit=limit)
        records = [
            record_of(billed.attempt.id, line)
            for billed, lines in zip(ready, self.price_all(ready, now), strict=True)
            for line in lines
        ]
        return self.store.costs.freeze(records, now) if records else 0

    # -- inside --------------------------------------------------------------------------------

    def _filter(self, **filters: Unpack[Filters]) -> LineFilter | None:
        """The store's filter; None when the job named matches no job (no lines)."""
        job, job_id = filters.get("job"), filters.get("job_id")
        if job is not None:
            found = self.store.jobs.get_job(job)
            if found is None or (job_id is not None and found.id != job_id):
                return None
            job_id = found.id
        return LineFilter(
            filters.get("since"),
            filters.get("until"),
            job_id,
            filters.get("policy"),
            filters.get("provider"),
            filters.get("market"),
        )

    def _priced(self, where: LineFilter, now: datetime | None) -> Iterable[Line]:
        now = now or self.clock()
        unfrozen = self.store.costs.unfrozen(where)
        for lines in self.price_all(unfrozen, now):
            for line in lines:
                if overlaps(line, where.since, where.until):
                    yield line
        yield from state_lines_for(self.store, where, now)


def state_lines_for(store: Store, where: LineFilter, now: datetime) -> list[Line]:
    """The lines of the jobs' state (checkpoints at rest, restores' egress) that `where`
    selects, priced as of `now`: every surface that reads the ledger (`gpuopt costs`, GET
    /costs, the FOCUS export, budgets) gets them through `Ledger._priced`. Read from the
    store's checkpoint and restore rows (of one job where `where` names one)."""
    checkpoints = store.checkpoints.checkpoints(where.job_id)
    restores = store.checkpoints.restores(where.job_id)
    if not checkpoints and not restores:
        return []
    wanted = {c.job_id for c in checkpoints} | {r.job_id for r in restores}
    if where.job_id is not None:
        one = store.jobs.get_job_by_id(where.job_id)
        records = [] if one is None else [one]
    else:
        records = store.jobs.list_jobs()
    jobs = {j.id: (j.given_name, j.policy) for j in records if j.id in wanted}
    return state_lines(checkpoints, restores, until=now, jobs=jobs, keep=state_filter(where))


def state_filter(where: LineFilter) -> Callable[[Line], bool]:
    """Whether a state line is one `where` selects (window, job, policy, provider; a market
    filter selects them by their kind: checkpoint-storage, egress)."""

    def keep(line: Line) -> bool:
        return (
            overlaps(line, where.since, where.until)
            and (where.job_id is None or line.job_id == where.job_id)
            and (where.policy is None or line.policy == where.policy)
            and (where.provider is None or line.provider == where.provider)
            and (where.market is None or line.market == where.market)
        )

    return keep


class _Series:
    """One pool's price points, cut to the part in effect over any interval inside them."""

    def __init__(self, points: PricePoints) -> None:
        self.points = points
        self.times = [at for at, _ in points]

    def over(self, span: Interval) -> PricePoints:
        """The point in effect at the span's start, then every one before its end."""
        first = max(bisect_right(self.times, span[0]) - 1, 0)
        return self.points[first : bisect_left(self.times, span[1])]


def _series_of(a: AttemptRecord) -> list[Pool]:
    """The series an attempt is priced from: its pool's own, then the on-demand series of its
    type and region, its zone's first, then the region's zone-less one (see the module)."""
    on_demand = Market.ON_DEMAND.value
    zones = dict.fromkeys((a.zone, None))
    return [a.pool, *(Pool(a.provider, a.region, z, a.instance_type, on_demand) for z in zones)]


def _lines(
    billed: BilledAttempt, usage: Usage, now: datetime, own: PricePoints, baseline: PricePoints
) -> list[Line]:
    """One attempt's lines, a month each, from its series."""
    a = billed.attempt
    return [
        Line(
            job_id=a.job_id,
            job=billed.job,
            policy=billed.policy,
            attempt=head_number(a.number, a.gang),  # a gang's nodes: one attempt
            provider=a.provider,
            region=a.region,
            zone=a.zone,
            instance_type=a.instance_type,
            market=a.market,
            instance_id=a.instance_id,
            launched=usage.launched,
            ended=usage.terminated,
            period_start=start,
            period_end=end,
            cost=cost,
            role=attempt_role(a),
        )
        for (start, end), cost in monthly(usage, now, prices=own, on_demand=baseline)
    ]


def _totals(by: GroupBy | None, sums: CostTotals) -> Totals:
    """A store's sums as the ledger's `Totals` (a month's key is its `YYYY-MM`)."""
    key = sums.key
    if isinstance(key, datetime):
        key = f"{key.year:04d}-{key.month:02d}"
    every = Cost(
        billed_seconds=sums.billed_seconds,
        spend_usd=sums.spend_usd,
        storage_usd=sums.storage_usd,
        overhead_seconds=sums.overhead_seconds,
        overhead_usd=sums.overhead_usd,
        on_demand_usd=sums.on_demand_usd,
        baseline_known=sums.priced_lines == sums.lines,
    )
    priced = Cost(
        billed_seconds=sums.priced_billed_seconds,
        spend_usd=sums.priced_spend_usd,
        storage_usd=sums.priced_storage_usd,
        overhead_seconds=sums.priced_overhead_seconds,
        overhead_usd=sums.priced_overhead_usd,
        on_demand_usd=sums.on_demand_usd,
    )
    return Totals(str(key or ""), every, priced, sums.attempts)


class CostFreezer:
    """The reconcile pass's last step: freeze the lines of attempts that ended this pass (a
    `Reconciler`, optimizer/jobs/context.py). It runs where the reconciler runs, on the leader;
    a line already stored is never written twice, so a pass run twice changes nothing."""

    name = "costs"

    def __call__(self, ctx: ReconcileContext) -> None:
        Ledger(ctx.store, ctx.clock).freeze(ctx.now)


__all__ = [
    "FREEZE_BATCH",
    "SETTLE",
    "CostFreezer",
    "Ledger",
    "line_of",
    "overlaps",
    "record_of",
    "usage_of",
]
