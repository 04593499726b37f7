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

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from optimizer.clock import Clock, utc_now
from optimizer.costs import Cost, Line, Usage, billed_span, monthly, total
from optimizer.costs.ledger import PricePoints
from optimizer.jobs.context import ReconcileContext
from optimizer.model import Market
from optimizer.store import BilledAttempt, CostLineRecord, LineFilter, Store

# An ended attempt whose instance is gone but whose provider never reported a termination time
# is frozen this long after it ended, with the attempt's end as its termination: long enough
# for a describe pass to bring the provider's time in, where the provider reports one.
SETTLE = timedelta(minutes=10)

Pool = tuple[str, str, str | None, str, str]


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

    def lines(
        self,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        job: str | None = None,
        job_id: int | None = None,
        policy: str | None = None,
        provider: str | None = None,
        market: str | None = None,
        now: datetime | None = None,
    ) -> list[Line]:
        """Cost lines (one attempt in one calendar month) whose month overlaps [since, until),
        of one job (by name, or by id), policy, provider or market (None: any), oldest month
        first, then by job and attempt. Frozen lines come from one query; the rest (live
        attempts, and ended ones whose termination is not known yet) are priced as of `now`
        (the clock's time when None)."""
        where = self._filter(since, until, job, job_id, policy, provider, market)
        if where is None:
            return []
        frozen = [line_of(r) for r in self.store.costs.frozen_lines(where)]
        live = self._priced(where, now)
        return sorted(
            [*frozen, *live], key=lambda line: (line.period_start, line.job_id, line.attempt)
        )

    def total(
        self,
        *,
        since: datetime | None = None,
        until: datetime | None = None,
        job: str | None = None,
        job_id: int | None = None,
        policy: str | None = None,
        provider: str | None = None,
        market: str | None = None,
        now: datetime | None = None,
    ) -> Cost:
        """The sum of `lines(...)` with the same arguments, the frozen part summed by the
        database (what a budget check or a counter needs, without building every line)."""
        where = self._filter(since, until, job, job_id, policy, provider, market)
        if where is None:
            return Cost()
        sums = self.store.costs.frozen_total(where)
        frozen = Cost(
            billed_seconds=sums.billed_seconds,
            spend_usd=sums.spend_usd,
            storage_usd=sums.storage_usd,
            on_demand_usd=sums.on_demand_usd,
            overhead_seconds=sums.overhead_seconds,
            overhead_usd=sums.overhead_usd,
            baseline_known=sums.priced_lines == sums.lines,
        )
        return frozen + total(line.cost for line in self._priced(where, now))

    def price(self, billed: BilledAttempt, now: datetime) -> list[Line]:
        """One attempt's lines, priced from the store's price history as of `now`."""
        usage = usage_of(billed)
        a = billed.attempt
        own = self._points(a.pool, usage, now)
        baseline: PricePoints = ()
        on_demand = Market.ON_DEMAND.value
        for zone in dict.fromkeys((a.zone, None)):
            baseline = self._points(
                (a.provider, a.region, zone, a.instance_type, on_demand), usage, now
            )
            if baseline:
                break
        ended = usage.terminated
        return [
            Line(
                job_id=a.job_id,
                job=billed.job,
                policy=billed.policy,
                attempt=a.number,
                provider=a.provider,
                region=a.region,
                zone=a.zone,
                instance_type=a.instance_type,
                market=a.market,
                instance_id=a.instance_id,
                launched=usage.launched,
                ended=ended,
                period_start=start,
                period_end=end,
                cost=cost,
            )
            for (start, end), cost in monthly(usage, now, prices=own, on_demand=baseline)
        ]

    # -- freezing ----------------------------------------------------------------------------

    def freeze(self, now: datetime | None = None, settle: timedelta = SETTLE) -> int:
        """Write the lines of every ended attempt whose termination is known and that has
        none stored yet; idempotent. Returns the number of lines written."""
        now = now or self.clock()
        ready = self.store.costs.to_freeze(now, settle)
        records = [
            record_of(billed.attempt.id, line)
            for billed in ready
            for line in self.price(billed, now)
        ]
        return self.store.costs.freeze(records, now) if records else 0

    # -- inside --------------------------------------------------------------------------------

    def _filter(
        self,
        since: datetime | None,
        until: datetime | None,
        job: str | None,
        job_id: int | None,
        policy: str | None,
        provider: str | None,
        market: str | None,
    ) -> LineFilter | None:
        """The store's filter; None when the job named matches no job (no lines)."""
        if job is not None:
            found = self.store.jobs.get_job(job)
            if found is None or (job_id is not None and found.id != job_id):
                return None
            job_id = found.id
        return LineFilter(since, until, job_id, policy, provider, market)

    def _priced(self, where: LineFilter, now: datetime | None) -> Iterable[Line]:
        now = now or self.clock()
        for billed in self.store.costs.unfrozen(where):
            for line in self.price(billed, now):
                if overlaps(line, where.since, where.until):
                    yield line

    def _points(self, pool: Pool, usage: Usage, now: datetime) -> PricePoints:
        """The pool's price points in effect over the attempt's billed time, across the raw
        and the hourly tier: the one in effect at its launch, then every one until its end."""
        provider, region, zone, instance_type, market = pool
        start, end = billed_span(usage, now)
        return self.store.prices.price_history(
            provider, region, zone, instance_type, market, start, end, prior=True
        )


class CostFreezer:
    """The reconcile pass's last step: freeze the lines of attempts that ended this pass (a
    `Reconciler`, optimizer/jobs/context.py). It runs where the reconciler runs, on the leader;
    a line already stored is never written twice, so a pass run twice changes nothing."""

    name = "costs"

    def __call__(self, ctx: ReconcileContext) -> None:
        Ledger(ctx.store, ctx.clock).freeze(ctx.now)


__all__ = ["SETTLE", "CostFreezer", "Ledger", "line_of", "overlaps", "record_of", "usage_of"]
