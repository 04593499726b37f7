"""Total cost of ownership over a horizon of years (pure; docs/tco.md has every formula).

The same capacity (`gpus` of one model) used `hours_per_month` hours each month for `years`,
bought five ways: on-demand, spot (with its overhead and an on-demand fallback share), a
1- or 3-year commitment (paid for every hour of its term), the cheapest spot + commitment
mix, and on-premises servers (capex, power, operations, depreciation, resale). Every cloud
option's total is affine in the usage, `fixed_usd + usd_per_usage_hour x hours_per_month`,
so the break-even usage between two options is where their lines cross.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from optimizer.costs.tco_assumptions import Assumptions
from optimizer.model import HOURS_PER_YEAR, Market, Offer, PaymentOption

HOURS_PER_MONTH = HOURS_PER_YEAR / 12  # 730: an average month, as the terms count hours
_EPS = 1e-9


class TcoError(ValueError):
    """Inputs the model cannot compare (no usage, no capacity)."""


class Kind(StrEnum):
    ON_DEMAND = "on_demand"
    SPOT = "spot"
    COMMITTED = "committed"
    MIX = "mix"
    ON_PREM = "on_prem"


@dataclass(frozen=True, slots=True)
class Usage:
    """What is compared: `gpus` GPUs of one model, `hours_per_month` each month, `years`."""

    gpu_model: str
    gpus: int
    hours_per_month: float
    years: int

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise TcoError(f"gpus must be >= 1, got {self.gpus}")
        if not 0 <= self.hours_per_month <= HOURS_PER_MONTH:
            raise TcoError(
                f"hours per month must be within 0..{HOURS_PER_MONTH:g}, got {self.hours_per_month}"
            )
        if self.years < 1:
            raise TcoError(f"years must be >= 1, got {self.years}")

    @property
    def months(self) -> int:
        return 12 * self.years


@dataclass(frozen=True, slots=True)
class CloudPrice:
    """The capacity's price in one market: `instances` of `offer`, and a note when the price
    is estimated from the assumptions rather than offered."""

    offer: Offer
    instances: int
    usd_per_hour: float  # the whole capacity: instances x the offer's price
    estimate: str | None = None

    @property
    def where(self) -> str:
        return (
            f"{self.instances}x {self.offer.instance_type} ({self.offer.provider} "
            f"{self.offer.region})"
        )


@dataclass(frozen=True, slots=True)
class CommitPrice:
    """A commitment for the capacity: effective USD/h and upfront USD per term, for all of it."""

    term_years: int
    payment_option: PaymentOption
    price: CloudPrice  # usd_per_hour: the effective rate for the whole capacity
    upfront_usd: float  # for the whole capacity, paid at the start of each term

    @property
    def label(self) -> str:
        return f"committed {self.term_years}y {self.payment_option.value.replace('_', ' ')}"

    @property
    def term_usd(self) -> float:
        """What one term costs: the effective rate for every hour of it."""
        return self.price.usd_per_hour * HOURS_PER_YEAR * self.term_years


@dataclass(frozen=True, slots=True)
class Option:
    """One way to buy the capacity, priced over the horizon.

    `total(h) = fixed_usd + usd_per_usage_hour x h` for a usage of h hours a month;
    `cumulative_usd[m]` is the spend by the end of month m at the stated usage (index 0: at
    the start, upfront fees paid), its last value the total; `parts` splits the total."""

    name: str
    kind: Kind
    fixed_usd: float
    usd_per_usage_hour: float
    cumulative_usd: tuple[float, ...]
    parts: dict[str, float]
    where: str = ""
    notes: tuple[str, ...] = ()
    affine: bool = True  # False for the mix, whose best split changes with the usage

    def total(self, hours_per_month: float) -> float:
        return self.fixed_usd + self.usd_per_usage_hour * hours_per_month

    def to_dict(self, usage: Usage) -> dict[str, Any]:
        total = self.total(usage.hours_per_month)
        return {
            "name": self.name,
            "kind": self.kind.value,
            "where": self.where,
            "total_usd": round(total, 2),
            "monthly_usd": round(total / usage.months, 2),
            "usd_per_gpu_hour": _per_gpu_hour(total, usage),
            "fixed_usd": round(self.fixed_usd, 2),
            "usd_per_usage_hour": round(self.usd_per_usage_hour, 6),
            "parts": {k: round(v, 2) for k, v in self.parts.items()},
            "cumulative_usd": [round(v, 2) for v in self.cumulative_usd],
            "notes": list(self.notes),
        }


def _per_gpu_hour(total: float, usage: Usage) -> float | None:
    used = usage.gpus * usage.hours_per_month * usage.months
    return round(total / used, 4) if used else None


# --- the options --------------------------------------------------------------------------


def on_demand(usage: Usage, price: CloudPrice) -> Option:
    """Pay the on-demand price for the hours used."""
    slope = price.usd_per_hour * usage.months
    monthly = price.usd_per_hour * usage.hours_per_month
    return Option(
        "on-demand",
        Kind.ON_DEMAND,
        0.0,
        slope,
        _ramp(0.0, monthly, usage.months),
        {"compute": slope * usage.hours_per_month},
        price.where,
        _notes(price),
    )


def spot_rate(spot: CloudPrice, fallback: CloudPrice, a: Assumptions) -> dict[str, float]:
    """USD per hour of use on spot, by part: the spot hours, their overhead (billed hours
    doing no work), and the on-demand fallback for the share spot capacity is missing."""
    share = a.spot.on_demand_share
    return {
        "spot": (1 - share) * spot.usd_per_hour,
        "overhead": (1 - share) * spot.usd_per_hour * a.spot.overhead_fraction,
        "on_demand_fallback": share * fallback.usd_per_hour,
    }


def spot(usage: Usage, price: CloudPrice, fallback: CloudPrice, a: Assumptions) -> Option:
    """Spot for the hours it is there (plus its overhead), on-demand for the rest."""
    rate = spot_rate(price, fallback, a)
    per_hour = sum(rate.values())
    slope = per_hour * usage.months
    notes = (
        *_notes(price),
        f"{a.spot.on_demand_share:.0%} of the hours on the on-demand fallback "
        f"({fallback.where}); {a.spot.overhead_fraction:.0%} overhead on the spot hours",
    )
    return Option(
        "spot",
        Kind.SPOT,
        0.0,
        slope,
        _ramp(0.0, per_hour * usage.hours_per_month, usage.months),
        {k: v * usage.hours_per_month * usage.months for k, v in rate.items()},
        price.where,
        notes,
    )


def terms_needed(usage: Usage, term_years: int) -> int:
    """Back-to-back terms that cover the horizon (the last one may outlast it)."""
    return math.ceil(usage.years / term_years)


def committed(usage: Usage, commit: CommitPrice) -> Option:
    """Every hour of every term is paid, used or not; terms renew back to back until the
    horizon is covered, and a last term that outlasts it is still paid in full."""
    terms = terms_needed(usage, commit.term_years)
    total = commit.term_usd * terms
    paid_hours = HOURS_PER_YEAR * commit.term_years * terms
    used_hours = usage.hours_per_month * usage.months
    upfront = commit.upfront_usd * terms
    notes = list(_notes(commit.price))
    if commit.term_years * terms > usage.years:
        notes.append(
            f"the {commit.term_years}-year term outlasts the {usage.years}-year horizon and is "
            "paid in full"
        )
    return Option(
        commit.label,
        Kind.COMMITTED,
        total,
        0.0,
        _commit_ramp(commit, usage, terms),
        {
            "upfront": upfront,
            "hourly_fees": total - upfront,
            "unused_hours": total * (1 - used_hours / paid_hours),
        },
        commit.price.where,
        tuple(notes),
    )


def mix(
    usage: Usage, spot_option: Option, commits: Sequence[tuple[CommitPrice, Option]], instances: int
) -> Option | None:
    """The cheapest split of the capacity's `instances` between one commitment and spot.

    Each instance costs its share of the commitment, or of spot, so the total is linear in
    the committed count k and the best k is 0 or all of them at one usage figure (docs/tco.md
    says why); the option still names the split and what it saves over the next best."""
    if not commits or instances < 1:
        return None
    h = usage.hours_per_month
    best: tuple[float, int, CommitPrice, Option] | None = None
    for commit, option in commits:
        for k in range(instances + 1):
            share = k / instances
            cost = share * option.total(h) + (1 - share) * spot_option.total(h)
            if best is None or cost < best[0] - _EPS:
                best = (cost, k, commit, option)
    assert best is not None
    _, k, commit, option = best
    share = k / instances
    cumulative = tuple(
        share * c + (1 - share) * s
        for c, s in zip(option.cumulative_usd, spot_option.cumulative_usd, strict=True)
    )
    parts = {f"committed_{n}": share * v for n, v in option.parts.items()}
    parts.update({f"spot_{n}": (1 - share) * v for n, v in spot_option.parts.items()})
    if k == 0:
        split = "all spot (no commitment pays at this usage)"
    elif k == instances:
        split = f"all on {commit.label} (spot costs more at this usage)"
    else:
        split = f"{k} of {instances} instance(s) on {commit.label}, {instances - k} on spot"
    return Option(
        "spot + committed",
        Kind.MIX,
        share * option.fixed_usd + (1 - share) * spot_option.fixed_usd,
        share * option.usd_per_usage_hour + (1 - share) * spot_option.usd_per_usage_hour,
        cumulative,
        parts,
        split,
        (f"best split at {h:g} h/month over {instances} instance(s)",),
        affine=False,
    )


@dataclass(frozen=True, slots=True)
class OnPremPlan:
    """The on-premises side: how many servers, what they cost and draw."""

    servers: int
    capex_usd: float
    busy_kw: float  # at the wall, before PUE: GPUs x TDP + servers x host power
    idle_kw: float


def on_prem_plan(usage: Usage, tdp_w: float, server_usd: float, a: Assumptions) -> OnPremPlan:
    p = a.on_prem
    servers = math.ceil(usage.gpus / p.gpus_per_server)
    capex = servers * (server_usd + p.networking_usd_per_server)
    busy_kw = (usage.gpus * tdp_w + servers * p.host_power_w) / 1000
    return OnPremPlan(servers, capex, busy_kw, busy_kw * p.idle_power_fraction)


def on_prem(usage: Usage, plan: OnPremPlan, a: Assumptions) -> Option:
    """Capex written off straight-line, operations as a yearly share of it, power for the
    busy and the idle hours (x PUE x price per kWh), less resale within the horizon."""
    p = a.on_prem
    years = usage.years
    dep_years = p.depreciation_years or float(years)
    depreciation = plan.capex_usd * min(years, dep_years) / dep_years
    resold = years >= dep_years - _EPS
    resale = plan.capex_usd * p.resale_fraction if resold else 0.0
    ops = plan.capex_usd * p.ops_fraction_per_year * years
    kwh_usd = p.pue * p.usd_per_kwh
    busy_usd_h = plan.busy_kw * kwh_usd
    idle_usd_h = plan.idle_kw * kwh_usd
    h, months = usage.hours_per_month, usage.months
    idle_power = idle_usd_h * HOURS_PER_MONTH * months
    fixed = depreciation - resale + ops + idle_power
    slope = (busy_usd_h - idle_usd_h) * months
    power_month = busy_usd_h * h + idle_usd_h * (HOURS_PER_MONTH - h)
    dep_months = dep_years * 12
    cumulative = []
    for m in range(months + 1):
        spent = plan.capex_usd * min(m, dep_months) / dep_months
        spent += (plan.capex_usd * p.ops_fraction_per_year / 12 + power_month) * m
        if resold and m >= round(dep_months):
            spent -= resale
        cumulative.append(spent)
    notes = [
        f"{plan.servers} server(s), {plan.busy_kw:.2f} kW busy and {plan.idle_kw:.2f} kW idle "
        f"at the wall, PUE {p.pue:g}, ${p.usd_per_kwh:g}/kWh"
    ]
    if not resold:
        notes.append(
            f"written off over {dep_years:g} years: {1 - years / dep_years:.0%} of the capex is "
            "still owned at the end and not counted"
        )
    return Option(
        "on-premises",
        Kind.ON_PREM,
        fixed,
        slope,
        tuple(cumulative),
        {
            "depreciation": depreciation,
            "resale": -resale,
            "operations": ops,
            "power_busy": busy_usd_h * h * months,
            "power_idle": idle_power - idle_usd_h * h * months,
        },
        f"{plan.servers}x {p.gpus_per_server}-GPU server(s)",
        tuple(notes),
    )


def _notes(price: CloudPrice) -> tuple[str, ...]:
    return (price.estimate,) if price.estimate else ()


def _ramp(start: float, monthly: float, months: int) -> tuple[float, ...]:
    return tuple(start + monthly * m for m in range(months + 1))


def _commit_ramp(commit: CommitPrice, usage: Usage, terms: int) -> tuple[float, ...]:
    """Upfront at each term's start, the hourly fee for every hour; what the last term owes
    past the horizon falls due at its end (it is owed whatever happens)."""
    term_months = 12 * commit.term_years
    fee_month = (commit.term_usd - commit.upfront_usd) / term_months
    out = []
    for m in range(usage.months + 1):
        started = min(terms, m // term_months + 1)
        out.append(commit.upfront_usd * started + fee_month * m)
    owed_months = term_months * terms - usage.months
    out[-1] += fee_month * owed_months
    return tuple(out)


# --- comparing them ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BreakEven:
    """Where two options cost the same; `hours_per_month` None when they never cross within
    0..730 h/month (then `cheaper` is cheaper at every usage)."""

    a: str
    b: str
    hours_per_month: float | None
    below: str | None  # cheaper under the break-even usage
    above: str | None  # cheaper over it
    cheaper: str | None = None  # when they never cross

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "hours_per_month": None
            if self.hours_per_month is None
            else round(self.hours_per_month, 2),
            "cheaper_below": self.below,
            "cheaper_above": self.above,
            "cheaper_always": self.cheaper,
        }


def break_even(a: Option, b: Option) -> BreakEven:
    """The usage where two affine options' totals meet."""
    slope = a.usd_per_usage_hour - b.usd_per_usage_hour
    if abs(slope) > _EPS:
        h = (b.fixed_usd - a.fixed_usd) / slope
        if _EPS < h < HOURS_PER_MONTH - _EPS:
            # The steeper line starts lower: it is the cheaper one below the crossing.
            flat, steep = (a, b) if a.usd_per_usage_hour < b.usd_per_usage_hour else (b, a)
            return BreakEven(a.name, b.name, h, steep.name, flat.name)
    mid = HOURS_PER_MONTH / 2
    diff = a.total(mid) - b.total(mid)
    cheaper = None if abs(diff) < 1e-6 else (a.name if diff < 0 else b.name)
    return BreakEven(a.name, b.name, None, None, None, cheaper)


def break_evens(options: Sequence[Option]) -> list[BreakEven]:
    """Every pair of affine options (the mix is the lower envelope of spot and a commitment,
    so its crossings are theirs)."""
    lines = [o for o in options if o.affine]
    return [break_even(a, b) for i, a in enumerate(lines) for b in lines[i + 1 :]]


def affordable_hours(option: Option, budget_usd_per_month: float, usage: Usage) -> float:
    """The most hours a month the budget pays for with this option (0..730)."""
    budget = budget_usd_per_month * usage.months
    if option.fixed_usd > budget + 1e-6:
        return 0.0
    if option.usd_per_usage_hour <= _EPS:
        return HOURS_PER_MONTH
    return max(0.0, min(HOURS_PER_MONTH, (budget - option.fixed_usd) / option.usd_per_usage_hour))


@dataclass(frozen=True, slots=True)
class Comparison:
    usage: Usage
    options: list[Option]
    break_evens: list[BreakEven]
    cheapest: Option
    recommendation: str
    budget_usd_per_month: float | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        u = self.usage
        out: dict[str, Any] = {
            "gpu_model": u.gpu_model,
            "gpus": u.gpus,
            "hours_per_month": u.hours_per_month,
            "years": u.years,
            "options": [o.to_dict(u) for o in self.options],
            "break_evens": [b.to_dict() for b in self.break_evens],
            "cheapest": self.cheapest.name,
            "recommendation": self.recommendation,
            "notes": self.notes,
        }
        if self.budget_usd_per_month is not None:
            out["budget_usd_per_month"] = self.budget_usd_per_month
            out["affordable_hours_per_month"] = {
                o.name: round(affordable_hours(o, self.budget_usd_per_month, u), 2)
                for o in self.options
            }
        return out


def compare(
    usage: Usage,
    options: Sequence[Option],
    budget_usd_per_month: float | None = None,
    notes: Sequence[str] = (),
) -> Comparison:
    """Rank the options at the stated usage, their break-evens, and what to buy and why."""
    if not options:
        raise TcoError("nothing to compare: no price for this GPU and no on-premises capex")
    h = usage.hours_per_month
    ranked = sorted(options, key=lambda o: o.total(h))
    cheapest = ranked[0]
    return Comparison(
        usage,
        list(options),
        break_evens(options),
        cheapest,
        recommend(usage, ranked, budget_usd_per_month),
        budget_usd_per_month,
        list(notes),
    )


def recommend(usage: Usage, ranked: Sequence[Option], budget: float | None) -> str:
    """One paragraph: the cheapest option at the stated usage and why, against the runner-up
    and the budget."""
    h, months = usage.hours_per_month, usage.months
    best = ranked[0]
    text = (
        f"{best.name} is cheapest at {h:g} h/month for {usage.gpus}x {usage.gpu_model}: "
        f"${best.total(h):,.0f} over {usage.years} year(s) (${best.total(h) / months:,.0f}/month)"
    )
    # The runner-up: the next option that costs more (a mix that is all spot ties with spot,
    # and is said to tie).
    ties = [o.name for o in ranked[1:] if o.total(h) - best.total(h) < 0.5]
    if ties:
        text += f" ({', '.join(ties)} {'ties' if len(ties) == 1 else 'tie'} with it)"
    others = [o for o in ranked[1:] if o.total(h) - best.total(h) >= 0.5]
    if others:
        second = others[0]
        text += f", ${second.total(h) - best.total(h):,.0f} less than {second.name}"
        if best.affine and second.affine:
            cross = break_even(best, second)
            if cross.hours_per_month is not None:
                side = "below" if cross.hours_per_month < h else "above"
                text += f"; {second.name} would win {side} {cross.hours_per_month:,.0f} h/month"
    text += "."
    if budget is not None:
        buys = ", ".join(
            f"{affordable_hours(o, budget, usage):,.0f} h on {o.name}"
            for o in sorted(ranked, key=lambda o: -affordable_hours(o, budget, usage))
            if o.affine
        )
        text += f" ${budget:,.0f}/month buys at most {buys} a month."
        fits = [o for o in ranked if o.total(h) / months <= budget + 1e-6]
        if best in fits:
            text += f" It fits the ${budget:,.0f}/month budget."
        else:
            most = max(ranked, key=lambda o: affordable_hours(o, budget, usage))
            hours = affordable_hours(most, budget, usage)
            if fits:
                text += (
                    f" It is over the ${budget:,.0f}/month budget; within it, {fits[0].name} "
                    f"costs ${fits[0].total(h) / months:,.0f}/month."
                )
            else:
                text += (
                    f" No option fits ${budget:,.0f}/month at {h:g} h/month; the budget buys at "
                    f"most {hours:,.0f} h/month, with {most.name}."
                )
    return text


def capacity_price(offer: Offer, gpus: int, estimate: str | None = None) -> CloudPrice:
    """Enough instances of `offer` for `gpus` GPUs."""
    instances = math.ceil(gpus / offer.gpu_count)
    return CloudPrice(offer, instances, instances * offer.usd_per_hour, estimate)


def cheapest(offers: Sequence[Offer], gpus: int, market: Market) -> CloudPrice | None:
    """The cheapest capacity for `gpus` GPUs in one market (whole instances), or None."""
    prices = [capacity_price(o, gpus) for o in offers if o.market is market and o.gpu_count]
    if not prices:
        return None
    return min(
        prices,
        key=lambda p: (p.usd_per_hour, p.offer.provider, p.offer.region, p.offer.instance_type),
    )
