"""The cost ledger on /metrics: cumulative spend and savings counters, and budget use.

- `gpuopt_spend_usd_total`, `gpuopt_storage_usd_total`, `gpuopt_on_demand_usd_total`,
  `gpuopt_savings_usd_total`, `gpuopt_overhead_usd_total` {policy, provider, market}: the
  ledger's cumulative totals (optimizer/jobs/counters.py says how they only grow). The
  collector also keeps each series' highest value, so the rare total that dips (savings while
  a spot price is above on-demand, a late termination report) holds the counter still instead
  of reading as a process restart.
- `gpuopt_budget_used_ratio` {policy}: month-to-date spend plus every live attempt projected
  to the end of the month at its current price (the budget model, policies/budget.py), over
  the policy's `budget.monthly_usd`; only policies with a budget.

A scrape reads the store at most once per `ttl_s` of the daemon's clock (one aggregate over
the frozen lines, and the few attempts not frozen yet); scrapes in between get the figures
computed last. When the store does not answer, the last figures are served.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from optimizer.clock import Clock
from optimizer.daemon.policies import PolicyRegistry
from optimizer.jobs import budget as job_budget
from optimizer.jobs.counters import Key, cumulative
from optimizer.store import Store
from policies import budget

log = logging.getLogger(__name__)

TTL_S = 30.0
LABELS = ["policy", "provider", "market"]
COUNTERS: dict[str, tuple[str, str]] = {
    # Cumulative field: (counter name without _total, help)
    "spend_usd": ("gpuopt_spend_usd", "What instances cost, USD, since the ledger began."),
    "storage_usd": ("gpuopt_storage_usd", "What the instances' root volumes cost, USD."),
    "on_demand_usd": (
        "gpuopt_on_demand_usd",
        "What the same instance types would have cost on-demand over the same seconds, USD "
        "(attempts with a known on-demand price).",
    ),
    "savings_usd": (
        "gpuopt_savings_usd",
        "On-demand baseline minus spend, USD (attempts with a known on-demand price).",
    ),
    "overhead_usd": (
        "gpuopt_overhead_usd",
        "Spend while the job's process was not running (provisioning, probes, handovers), USD.",
    ),
}


def budget_ratios(store: Store, registry: PolicyRegistry, now: datetime) -> dict[str, float]:
    """Each budgeted policy's month-to-date spend plus its live attempts projected to the end
    of the month, over its monthly budget (what the launch check compares with 1.0)."""
    capped = {
        name: loaded.policy.budget
        for name, loaded in sorted(registry.snapshot().items())
        if loaded.policy.budget.monthly_usd is not None
    }
    if not capped:
        return {}
    offers = store.prices.latest_offers()
    out = {}
    for name, cap in capped.items():
        spend = job_budget.committed(store, name, now, offers)
        projected = budget.projected(spend, 0.0, now, cap.hours_per_month)
        out[name] = projected / float(cap.monthly_usd or 1.0)
    return out


class CostCollector(Collector):
    """The ledger's figures at scrape time, cached for `ttl_s` of `clock`."""

    def __init__(
        self,
        store: Store,
        registry: PolicyRegistry,
        clock: Clock,
        *,
        ttl_s: float = TTL_S,
    ) -> None:
        self.store = store
        self.registry = registry
        self.clock = clock
        self.ttl = timedelta(seconds=ttl_s)
        self._lock = threading.Lock()
        self._at: datetime | None = None
        self._high: dict[tuple[str, Key], float] = {}
        self._ratios: dict[str, float] = {}

    def refresh(self, now: datetime | None = None) -> None:
        """Read the store now (a scrape does when its figures are older than the TTL)."""
        now = now or self.clock()
        totals = cumulative(self.store, now)
        ratios = budget_ratios(self.store, self.registry, now)
        with self._lock:
            for key, value in totals.items():
                for field in COUNTERS:
                    figure = max(getattr(value, field), 0.0)
                    if figure > self._high.get((field, key), 0.0):
                        self._high[(field, key)] = figure
                    else:
                        self._high.setdefault((field, key), 0.0)
            self._ratios = ratios
            self._at = now

    def _fresh(self, now: datetime) -> bool:
        return self._at is not None and self._at <= now < self._at + self.ttl

    def collect(self) -> Iterator[Metric]:
        now = self.clock()
        if not self._fresh(now):
            try:
                self.refresh(now)
            except Exception as exc:  # a scrape answers with the last figures
                log.warning("metrics: cost ledger unavailable: %s", type(exc).__name__)
        with self._lock:
            high = dict(self._high)
            ratios = dict(self._ratios)
        for field, (name, text) in COUNTERS.items():
            family = CounterMetricFamily(name, text, labels=LABELS)
            for (which, key), value in sorted(high.items()):
                if which == field:
                    family.add_metric(list(key), value)
            yield family
        ratio = GaugeMetricFamily(
            "gpuopt_budget_used_ratio",
            "Month-to-date spend plus live attempts projected to the month's end, over "
            "budget.monthly_usd (policies with a budget).",
            labels=["policy"],
        )
        for policy, value in sorted(ratios.items()):
            ratio.add_metric([policy], value)
        yield ratio


__all__ = ["COUNTERS", "TTL_S", "CostCollector", "budget_ratios"]
