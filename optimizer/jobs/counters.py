"""The ledger's cumulative totals per (policy, provider, market), for Prometheus counters.

A counter must never go down, and Prometheus reads any drop as a restart of the process. The
totals are built so that they only grow, from the store alone (so a restarted daemon, or
another replica, starts from the same figures):

- **Frozen lines** (ended attempts, optimizer/jobs/ledger.py) never change once written:
  summed by the database in one aggregate, in the same statement that lists the attempts
  not frozen yet (`Costs.counter_snapshot`), so an attempt frozen during the read is counted
  once, never in both or neither.
- **Attempts not frozen yet** (live, or ended with the termination not known yet) count what
  they have *settled*, a figure their frozen lines can only exceed:
  - an attempt whose provider reported its termination counts its final cost (what freezing
    will write, at the same price points);
  - otherwise it counts its billed time up to a horizon `SETTLE` (10 minutes) behind now (or
    behind its end, once gpuopt saw it end): a termination the provider reports later, an
    agent's late report that the job was running, or a poll that writes a point observed a
    little earlier all land after the horizon, where they cannot lower what was counted;
  - a spot attempt that the cloud's interruption credit could still make free (AWS: the
    first hour, GCP: the first minute; optimizer/costs/billing.py) counts nothing until the
    horizon is past that window, then its whole billed time to the horizon.
- **Savings** are baseline minus spend over lines whose on-demand baseline is known (as
  every ledger surface counts them); lines without a baseline add spend only.

What can still lower a computed total, and what the collector does about it
(optimizer/daemon/spend.py keeps each series' highest value, so the exposed counter holds
still until the total passes it again):
- savings of an attempt while its spot price is above the on-demand price (savings < 0);
- a live attempt older than the raw price retention, whose oldest points are downsampled to
  hourly medians while it runs (its frozen line then uses the medians too);
- a termination or an interruption reported more than `SETTLE` after it happened.
A job removed (`gpuopt jobs rm`) keeps its attempts and lines: its spend stays counted.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from optimizer.costs import rule_for
from optimizer.costs.lines import Line
from optimizer.jobs.ledger import SETTLE, Ledger
from optimizer.model import Market
from optimizer.store import BilledAttempt, CostTotals, Store

Key = tuple[str, str, str]
"""(policy, provider, market)"""


@dataclass(frozen=True, slots=True)
class Cumulative:
    """Cumulative USD of one (policy, provider, market): instance spend, root-volume storage,
    the on-demand baseline and the savings against it (over lines with a known baseline),
    and the overhead (billed while the job's process was not running)."""

    spend_usd: float = 0.0
    storage_usd: float = 0.0
    on_demand_usd: float = 0.0
    savings_usd: float = 0.0
    overhead_usd: float = 0.0

    def __add__(self, other: Cumulative) -> Cumulative:
        return Cumulative(
            self.spend_usd + other.spend_usd,
            self.storage_usd + other.storage_usd,
            self.on_demand_usd + other.on_demand_usd,
            self.savings_usd + other.savings_usd,
            self.overhead_usd + other.overhead_usd,
        )

    @classmethod
    def of_frozen(cls, sums: CostTotals) -> Cumulative:
        return cls(
            spend_usd=sums.spend_usd,
            storage_usd=sums.storage_usd,
            on_demand_usd=sums.on_demand_usd,
            savings_usd=sums.on_demand_usd - sums.priced_spend_usd,
            overhead_usd=sums.overhead_usd,
        )

    @classmethod
    def of_line(cls, line: Line) -> Cumulative:
        c = line.cost
        known = c.baseline_known
        return cls(
            spend_usd=c.spend_usd,
            storage_usd=c.storage_usd,
            on_demand_usd=c.on_demand_usd if known else 0.0,
            savings_usd=c.savings_usd if known else 0.0,
            overhead_usd=c.overhead_usd,
        )


def settled(
    billed: BilledAttempt, now: datetime, settle: timedelta = SETTLE
) -> tuple[BilledAttempt, datetime] | None:
    """The attempt as the counters price it, and the "now" to price it at; None while it
    counts nothing yet (see the module's docstring)."""
    a = billed.attempt
    if a.terminated_at is not None:
        return billed, now
    end = now if a.ended_at is None else min(now, a.ended_at)
    horizon = end - settle
    launched = a.launched_at or a.started_at
    if horizon <= launched:
        return None
    credit = rule_for(a.provider).interrupted_free_s
    in_credit = credit is not None and horizon < launched + timedelta(seconds=credit)
    if a.market == Market.SPOT.value and in_credit:
        return None
    running = replace(a, ended_at=None, instance_gone=False, terminated_at=None)
    return replace(billed, attempt=running), horizon


def cumulative(store: Store, now: datetime, settle: timedelta = SETTLE) -> dict[Key, Cumulative]:
    """Every attempt's cost so far per (policy, provider, market): the frozen lines summed by
    the database, plus what each attempt not frozen yet has settled (priced together, each
    pool's series read once: there are only as many as attempts live or just ended)."""
    frozen, unfrozen = store.costs.counter_snapshot()
    out = {key: Cumulative.of_frozen(sums) for key, sums in frozen.items()}
    by_horizon: dict[datetime, list[BilledAttempt]] = {}
    for billed in unfrozen:
        found = settled(billed, now, settle)
        if found is not None:
            by_horizon.setdefault(found[1], []).append(found[0])
    ledger = Ledger(store)
    for at, attempts in by_horizon.items():  # mostly one: live attempts share theirs
        for lines in ledger.price_all(attempts, at):
            for line in lines:
                key = (line.policy, line.provider, line.market)
                out[key] = out.get(key, Cumulative()) + Cumulative.of_line(line)
    return out


__all__ = ["Cumulative", "Key", "cumulative", "settled"]
