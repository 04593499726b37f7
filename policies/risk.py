"""Ranking by expected cost: a pool's interruption probability per hour, a job's restart
overhead, and the expected price that combine them (pure; the daemon gathers the inputs in
optimizer/jobs/expected.py). docs/policies.md, "Ranking by expected cost", says the same.

    expected USD/h = price x (1 + p x overhead_hours)

- **p**, interruptions per instance-hour of the pool (provider, region, zone, type, market),
  from gpuopt's own attempts there over the last `HISTORY` with a prior worth `PRIOR_HOURS`
  attempt-hours: p = (prior x PRIOR_HOURS + interruptions) / (PRIOR_HOURS + attempt-hours), a
  gamma-Poisson posterior mean, so a pool with no history has the prior and one with a long
  quiet or a busy history has its own rate. On-demand capacity is not reclaimed: p = 0.
- **The prior** of a spot pool: the AWS Spot Instance Advisor's interruption bucket for its
  type and region where the offer carries one (the frequency of interruption over the last
  month, REFERENCE.md §1.4; its bucket's midpoint as a monthly fraction f, per hour
  -ln(1 - f) / 730), else `DEFAULT_P`; then scaled by the AWS spot placement score where the
  offer carries one: x (11 - score) / 5.5 (a score of 10 halves and more, 1 nearly doubles).
  The placement score measures the odds a request is fulfilled, not interruptions; the
  scaling is gpuopt's own judgement that scarce capacity is reclaimed sooner, and the
  bucket, when both are known, is the stronger signal. The Advisor feed is not fetched yet,
  so today a bucket comes only from a catalog file's `interruption_bucket` column.
- **overhead_hours**, what a restart costs the job (optimizer/jobs/expected.py picks it): the
  cost ledger's measured overhead of the policy's relaunched attempts (billed time with the
  job not running: provisioning, probes, waiting on the old attempt) when there is any, else
  the observed times from an interruption notice to the job running again, else
  `DEFAULT_OVERHEAD_H`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from optimizer.model import Market, Offer, Pool
from policies.ranking import Candidate

HISTORY = timedelta(days=30)  # attempts older than this no longer count towards p
PRIOR_HOURS = 10.0  # the prior weighs as much as this many attempt-hours of history
# A spot pool's p with nothing known: gpuopt's assumption (one interruption per 100 hours),
# not a measured figure; replace it with history as it accrues.
DEFAULT_P = 0.01
HOURS_PER_MONTH = 730.0  # 8,760 / 12, the Advisor's month
DEFAULT_OVERHEAD_H = 0.25  # 15 minutes to relaunch, probe and resume: an assumption
RECENT = timedelta(hours=24)  # an interruption this recent is named in the candidate's reason


@dataclass(frozen=True, slots=True)
class PoolHistory:
    """What gpuopt saw of one pool within `HISTORY`: attempt-hours and interruptions."""

    hours: float = 0.0
    interruptions: int = 0
    last_interruption: datetime | None = None


@dataclass(frozen=True, slots=True)
class Risk:
    """A pool's interruption probability per hour, and where it came from, in words."""

    p: float
    source: str


@dataclass(frozen=True, slots=True)
class Overhead:
    """A job's restart overhead in hours, and where it came from."""

    hours: float
    source: str


def advisor_fraction(bucket: str | None) -> float | None:
    """The Advisor bucket as a monthly fraction: its midpoint (`<5%` 0.025, `5-10%` 0.075),
    the lower bound of an open top bucket (`>20%` 0.20); None when there is none or it is not
    a bucket."""
    if not bucket:
        return None
    text = bucket.replace(" ", "")
    if m := re.fullmatch(r"<(\d+(?:\.\d+)?)%", text):
        return float(m.group(1)) / 200
    if m := re.fullmatch(r"(\d+(?:\.\d+)?)-(\d+(?:\.\d+)?)%", text):
        return (float(m.group(1)) + float(m.group(2))) / 200
    if m := re.fullmatch(r">(\d+(?:\.\d+)?)%", text):
        return float(m.group(1)) / 100
    return None


def prior(offer: Offer) -> Risk:
    """A spot pool's p before any history of its own (module docstring)."""
    fraction = advisor_fraction(offer.interruption_bucket)
    if fraction is not None:
        p = -math.log(1 - min(fraction, 0.99)) / HOURS_PER_MONTH
        source = f"advisor {offer.interruption_bucket}"
    else:
        p, source = DEFAULT_P, "default"
    if offer.placement_score is not None:
        p *= (11 - offer.placement_score) / 5.5
        source += f", placement score {offer.placement_score:g}"
    return Risk(p, source)


def interruption_risk(offer: Offer, history: PoolHistory | None) -> Risk:
    """The pool's p per hour: 0 on demand; else the prior updated with its history."""
    if offer.market is not Market.SPOT:
        return Risk(0.0, "on-demand")
    base = prior(offer)
    if history is None or (history.hours <= 0 and history.interruptions == 0):
        return Risk(base.p, f"prior ({base.source})")
    p = (base.p * PRIOR_HOURS + history.interruptions) / (PRIOR_HOURS + history.hours)
    return Risk(
        min(p, 1.0),
        f"history ({history.interruptions} in {history.hours:.1f} h) + prior ({base.source})",
    )


def _mean(values: Iterable[float]) -> float | None:
    found = [v for v in values if v >= 0]
    return sum(found) / len(found) if found else None


def restart_overhead(ledger_hours: Sequence[float], observed_hours: Sequence[float]) -> Overhead:
    """The overhead to rank with: the ledger's mean over relaunched attempts, else the mean
    notice-to-running time, else the default."""
    ledger = _mean(ledger_hours)
    if ledger is not None:
        return Overhead(ledger, f"cost ledger (mean of {len(ledger_hours)} relaunches)")
    observed = _mean(observed_hours)
    if observed is not None:
        return Overhead(observed, f"notice to running (mean of {len(observed_hours)})")
    return Overhead(DEFAULT_OVERHEAD_H, "default")


def expected_usd_per_hour(price: float, p: float, overhead_hours: float) -> float:
    """price x (1 + p x overhead_hours)."""
    return price * (1 + p * overhead_hours)


def _reason(history: PoolHistory | None, now: datetime) -> str | None:
    last = history.last_interruption if history is not None else None
    if history is None or last is None or now - last > RECENT:
        return None
    hours = (now - last).total_seconds() / 3600
    return (
        f"interrupted {history.interruptions} time(s) in the last {HISTORY.days} days, "
        f"last {hours:.1f} h ago"
    )


def annotate(
    candidate: Candidate,
    history: PoolHistory | None,
    overhead: Overhead,
    now: datetime,
) -> Candidate:
    """The candidate with its p, p's source, its expected USD/h and, after a recent
    interruption in its pool, a reason a person can read."""
    risk = interruption_risk(candidate.offer, history)
    expected = expected_usd_per_hour(candidate.offer.usd_per_hour, risk.p, overhead.hours)
    return candidate._replace(
        interruption_p=risk.p,
        interruption_source=risk.source,
        expected_usd_per_hour=expected,
        overhead_hours=overhead.hours,
        risk=_reason(history, now),
    )


def by_expected_cost(candidates: Iterable[Candidate]) -> list[Candidate]:
    """Annotated candidates re-ranked by expected USD/h (their score then), the engine's order
    breaking ties; types demoted for failing probes stay after the rest."""

    def cost(c: Candidate) -> float:
        found = c.offer.usd_per_hour if c.expected_usd_per_hour is None else c.expected_usd_per_hour
        # A job with state pays its move on top, spread over the run (policies/data_rules.py).
        return found if c.move_usd_per_hour is None else found + c.move_usd_per_hour

    ordered = sorted(candidates, key=lambda c: (c.probe_failures is not None, cost(c), c.rank))
    return [c._replace(rank=i, score=cost(c)) for i, c in enumerate(ordered, start=1)]


def annotate_all(
    candidates: Iterable[Candidate],
    histories: Mapping[Pool, PoolHistory],
    overhead: Overhead,
    now: datetime,
) -> list[Candidate]:
    """`annotate` for each candidate, its pool's history looked up (or its regional pool)."""
    out = []
    for c in candidates:
        o = c.offer
        found = histories.get(o.pool)
        out.append(annotate(c, found, overhead, now))
    return out


__all__ = [
    "DEFAULT_OVERHEAD_H",
    "DEFAULT_P",
    "HISTORY",
    "PRIOR_HOURS",
    "Overhead",
    "PoolHistory",
    "Risk",
    "advisor_fraction",
    "annotate",
    "annotate_all",
    "by_expected_cost",
    "expected_usd_per_hour",
    "interruption_risk",
    "prior",
    "restart_overhead",
]
