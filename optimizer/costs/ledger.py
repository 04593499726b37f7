"""What an attempt cost, what on-demand would have cost, and what was overhead (pure).

The model (docs/costs.md):
- Billed time: from the instance's launch to its termination as the provider reports them,
  at least the provider's minimum (`billing.BillingRule`); a live attempt accrues up to now.
- Spend: the integral of the price in effect over the billed time. Spot: the last price
  observed for the pool at or before t, and the launch price before the first observation
  after the launch. On-demand: the list price (the pool's on-demand series, else the launch
  price).
- Baseline: the on-demand series of the same type and region over the same seconds.
- Overhead: billed seconds in which the job's process was not running, priced.
- A spot instance the cloud interrupts inside its free window costs nothing (its storage
  still does); its baseline still counts, so the credit shows as savings.
- Storage: the root volume, per GiB-month prorated by the second over each month's days.
- The job's state (optimizer/costs/state_lines.py): its checkpoints at rest in object storage
  (`storage_usd`, per GB-month of 730 h) and the data a restore moved out of a cloud
  (`network_usd`); lines of their own, never an attempt's.

Every figure can be taken over a window [since, until), so months split exactly.
"""

from __future__ import annotations

import calendar
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from optimizer.costs.billing import BillingRule, rule_for

PricePoints = Sequence[tuple[datetime, float]]  # (observed_at, usd_per_hour), oldest first
Interval = tuple[datetime, datetime]


@dataclass(frozen=True, slots=True)
class Usage:
    """One attempt's instance as billing sees it."""

    provider: str
    market: str  # "spot" | "on_demand" | …
    launched: datetime
    terminated: datetime | None  # None: still running
    launch_usd_per_hour: float
    interrupted_by_cloud: bool = False
    # When the job's process ran on the instance; an open end runs to the termination.
    running: tuple[tuple[datetime, datetime | None], ...] = ()
    disk_gib: float = 0.0


@dataclass(frozen=True, slots=True)
class Cost:
    """One attempt's (or a sum of attempts') cost lines over a window, in USD and seconds."""

    billed_seconds: float = 0.0
    spend_usd: float = 0.0  # the instance
    storage_usd: float = 0.0  # its root volume
    on_demand_usd: float = 0.0  # the baseline, instance only
    overhead_seconds: float = 0.0
    overhead_usd: float = 0.0
    refunded: bool = False
    baseline_known: bool = True
    network_usd: float = 0.0  # data moved out of a cloud (a restore's egress)

    @property
    def total_usd(self) -> float:
        return self.spend_usd + self.storage_usd + self.network_usd

    @property
    def savings_usd(self) -> float:
        return self.on_demand_usd - self.spend_usd

    @property
    def savings_fraction(self) -> float | None:
        return self.savings_usd / self.on_demand_usd if self.on_demand_usd > 0 else None

    @property
    def net_savings_fraction(self) -> float | None:
        """Savings once the overhead is counted as lost (what was paid for no work)."""
        if self.on_demand_usd <= 0:
            return None
        return (self.savings_usd - self.overhead_usd) / self.on_demand_usd

    def __add__(self, other: Cost) -> Cost:
        return Cost(
            self.billed_seconds + other.billed_seconds,
            self.spend_usd + other.spend_usd,
            self.storage_usd + other.storage_usd,
            self.on_demand_usd + other.on_demand_usd,
            self.overhead_seconds + other.overhead_seconds,
            self.overhead_usd + other.overhead_usd,
            self.refunded or other.refunded,
            self.baseline_known and other.baseline_known,
            self.network_usd + other.network_usd,
        )


NONE = Cost()


def integral_usd(points: PricePoints, initial: float, start: datetime, end: datetime) -> float:
    """USD for [start, end) under a step price: the last point at or before t, else `initial`."""
    if end <= start:
        return 0.0
    price, cursor, total = initial, start, 0.0
    for at, usd_per_hour in points:
        if at <= start:
            price = usd_per_hour
            continue
        if at >= end:
            break
        total += price * (at - cursor).total_seconds()
        cursor, price = at, usd_per_hour
    total += price * (end - cursor).total_seconds()
    return total / 3600.0


def spot_points(points: PricePoints, launched: datetime) -> PricePoints:
    """The observations that set a spot attempt's price: those at or after its launch."""
    return [(at, p) for at, p in points if at >= launched]


def clip(interval: Interval, window: Interval | None) -> Interval | None:
    start, end = interval
    if window is not None:
        start, end = max(start, window[0]), min(end, window[1])
    return (start, end) if end > start else None


def gaps(span: Interval, running: Iterable[Interval]) -> list[Interval]:
    """The parts of `span` that no running interval covers, in time order."""
    out: list[Interval] = []
    cursor = span[0]
    for start, end in sorted(running):
        if end <= cursor:
            continue
        if start >= span[1]:
            break
        if start > cursor:
            out.append((cursor, start))
        cursor = max(cursor, end)
    if cursor < span[1]:
        out.append((cursor, span[1]))
    return out


def month_windows(start: datetime, end: datetime) -> list[Interval]:
    """The calendar months (UTC) that [start, end) touches, each as [month start, next)."""
    out: list[Interval] = []
    first = start.astimezone(UTC)
    month = datetime(first.year, first.month, 1, tzinfo=UTC)
    while month < end:
        following = datetime(month.year + (month.month == 12), month.month % 12 + 1, 1, tzinfo=UTC)
        out.append((month, following))
        month = following
    return out


def storage_usd(gib: float, usd_per_gib_month: float, span: Interval) -> float:
    """A volume's charge over `span`: price x GiB x seconds / (86,400 x days in the month)."""
    if gib <= 0 or span[1] <= span[0]:
        return 0.0
    total = 0.0
    for month in month_windows(*span):
        part = clip(span, month)
        if part is None:
            continue
        days = calendar.monthrange(month[0].year, month[0].month)[1]
        total += gib * usd_per_gib_month * (part[1] - part[0]).total_seconds() / (86400 * days)
    return total


def billed_span(usage: Usage, now: datetime, rule: BillingRule | None = None) -> Interval:
    """The billed time: launch to termination (to `now` while live), at least the minimum."""
    rule = rule or rule_for(usage.provider)
    end = usage.terminated if usage.terminated is not None else now
    end = max(end, usage.launched + timedelta(seconds=rule.minimum_s))
    return usage.launched, end


def cost(
    usage: Usage,
    now: datetime,
    *,
    prices: PricePoints = (),
    on_demand: PricePoints = (),
    window: Interval | None = None,
    rule: BillingRule | None = None,
) -> Cost:
    """The attempt's cost lines inside `window` (all of it when None), as of `now`.

    `prices` is the pool's own series (its market); `on_demand` the on-demand series of the
    same instance type and region, for the baseline (empty: unknown, unless the attempt is
    itself on-demand).
    """
    rule = rule or rule_for(usage.provider)
    billed = billed_span(usage, now, rule)
    end = max(usage.terminated if usage.terminated is not None else now, usage.launched)
    refunded = (
        usage.market == "spot"
        and usage.interrupted_by_cloud
        and usage.terminated is not None
        and rule.interrupted_free_s is not None
        and (usage.terminated - usage.launched).total_seconds() < rule.interrupted_free_s
    )
    own = spot_points(prices, usage.launched) if usage.market == "spot" else (prices or on_demand)
    baseline_points = on_demand if usage.market == "spot" else (on_demand or prices)
    baseline_initial = baseline_points[0][1] if baseline_points else usage.launch_usd_per_hour
    baseline_known = bool(baseline_points) or usage.market != "spot"

    span = clip(billed, window)
    storage = storage_usd(usage.disk_gib, rule.disk_usd_per_gib_month, span) if span else 0.0
    # The baseline prices what ran, with on-demand's own minimum, even when the cloud's
    # credit made the spot attempt free: the credit is a saving.
    baseline_span = clip(billed, window)
    baseline = (
        integral_usd(baseline_points, baseline_initial, *baseline_span)
        if baseline_span and baseline_known
        else 0.0
    )
    if span is None:
        return Cost(storage_usd=storage, on_demand_usd=baseline, baseline_known=baseline_known)
    if refunded:
        return Cost(
            storage_usd=storage,
            on_demand_usd=baseline,
            refunded=True,
            baseline_known=baseline_known,
        )
    spend = integral_usd(own, usage.launch_usd_per_hour, *span)
    running = [(s, e if e is not None else end) for s, e in usage.running]
    idle = gaps(span, running)
    overhead_s = sum((e - s).total_seconds() for s, e in idle)
    overhead = sum(integral_usd(own, usage.launch_usd_per_hour, s, e) for s, e in idle)
    return Cost(
        billed_seconds=(span[1] - span[0]).total_seconds(),
        spend_usd=spend,
        storage_usd=storage,
        on_demand_usd=baseline,
        overhead_seconds=overhead_s,
        overhead_usd=overhead,
        baseline_known=baseline_known,
    )


def total(costs: Iterable[Cost]) -> Cost:
    out = NONE
    for c in costs:
        out = out + c
    return out


def monthly(
    usage: Usage,
    now: datetime,
    *,
    prices: PricePoints = (),
    on_demand: PricePoints = (),
    rule: BillingRule | None = None,
) -> list[tuple[Interval, Cost]]:
    """The attempt's cost in each calendar month (UTC) its billed time touches, oldest first."""
    rule = rule or rule_for(usage.provider)
    return [
        (month, cost(usage, now, prices=prices, on_demand=on_demand, window=month, rule=rule))
        for month in month_windows(*billed_span(usage, now, rule))
    ]
