"""From offers and assumptions to the TCO options (pure): which prices each option uses.

On-demand and spot take the cheapest capacity among the offers for the GPU model (whole
instances; a policy has already filtered them where one is given). Where no spot price is
offered, spot is estimated from the on-demand price and `spot.discount`; where no committed
offer exists for a term, that term is estimated from on-demand and `commitment.discount_*`
(no upfront, as GCP bills CUDs monthly). Each estimate says so in the option's notes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from optimizer.costs.tco import (
    CloudPrice,
    CommitPrice,
    Comparison,
    Option,
    TcoError,
    Usage,
    capacity_price,
    cheapest,
    committed,
    compare,
    mix,
    on_demand,
    on_prem,
    on_prem_plan,
    spot,
)
from optimizer.costs.tco_assumptions import SERVER_USD, Assumptions
from optimizer.model import Market, Offer, PaymentOption

TERMS = (1, 3)


def spot_price(offers: Sequence[Offer], usage: Usage, od: CloudPrice, a: Assumptions) -> CloudPrice:
    found = cheapest(offers, usage.gpus, Market.SPOT)
    if found is not None:
        return found
    estimate = replace(
        od.offer, market=Market.SPOT, usd_per_hour=od.offer.usd_per_hour * (1 - a.spot.discount)
    )
    return capacity_price(
        estimate,
        usage.gpus,
        f"spot estimated at {a.spot.discount:.0%} under on-demand (spot.discount): no spot "
        "price offered",
    )


def commit_prices(
    offers: Sequence[Offer], usage: Usage, od: CloudPrice | None, a: Assumptions
) -> list[CommitPrice]:
    """The cheapest committed capacity per (term, payment option) offered, and an estimate
    for each term with no offer at all (when there is an on-demand price to estimate from)."""
    best: dict[tuple[int, PaymentOption], CloudPrice] = {}
    for offer in offers:
        if offer.market is not Market.COMMITTED or not offer.gpu_count:
            continue
        assert offer.term_years is not None and offer.payment_option is not None
        price = capacity_price(offer, usage.gpus)
        key = (offer.term_years, offer.payment_option)
        held = best.get(key)
        if held is None or price.usd_per_hour < held.usd_per_hour:
            best[key] = price
    out = [
        CommitPrice(term, option, price, price.instances * (price.offer.upfront_usd or 0.0))
        for (term, option), price in sorted(best.items())
    ]
    offered = {term for term, _ in best}
    for term in TERMS:
        if term in offered or od is None:
            continue
        discount = a.commitment.discount_1y if term == 1 else a.commitment.discount_3y
        rate = od.offer.usd_per_hour * (1 - discount)
        estimate = replace(
            od.offer,
            market=Market.COMMITTED,
            usd_per_hour=rate,
            term_years=term,
            payment_option=PaymentOption.NO_UPFRONT,
            upfront_usd=0.0,
        )
        price = capacity_price(
            estimate,
            usage.gpus,
            f"{term}-year rate estimated at {discount:.1%} under on-demand "
            f"(commitment.discount_{term}y): no committed offer",
        )
        out.append(CommitPrice(term, PaymentOption.NO_UPFRONT, price, 0.0))
    return sorted(out, key=lambda c: (c.term_years, c.payment_option.value))


def plan(
    usage: Usage,
    offers: Sequence[Offer],
    a: Assumptions,
    *,
    tdp_w: float | None,
    budget_usd_per_month: float | None = None,
) -> Comparison:
    """Every option the offers and assumptions allow, compared at the stated usage."""
    mine = [o for o in offers if o.gpu_model == usage.gpu_model]
    notes: list[str] = []
    options: list[Option] = []
    od = cheapest(mine, usage.gpus, Market.ON_DEMAND)
    spot_option = None
    if od is None:
        notes.append(f"no on-demand price for {usage.gpu_model}: no cloud option but commitments")
    else:
        options.append(on_demand(usage, od))
        spot_option = spot(usage, spot_price(mine, usage, od, a), od, a)
        options.append(spot_option)
    commits = [(c, committed(usage, c)) for c in commit_prices(mine, usage, od, a)]
    options.extend(option for _, option in commits)
    if spot_option is not None and commits:
        instances = {c.price.instances for c, _ in commits} | {od.instances if od else 0}
        best_mix = mix(usage, spot_option, commits, max(instances))
        if best_mix is not None:
            options.append(best_mix)
    server_usd = a.on_prem.server_usd
    if server_usd is None:
        server_usd = SERVER_USD.get(usage.gpu_model)
    if server_usd is None:
        notes.append(
            f"no on-premises option: no server price for {usage.gpu_model} "
            "(set on_prem.server_usd in the assumptions file)"
        )
    elif tdp_w is None:
        notes.append(f"no on-premises option: the hardware table has no TDP for {usage.gpu_model}")
    else:
        options.append(on_prem(usage, on_prem_plan(usage, tdp_w, server_usd, a), a))
    if not options:
        raise TcoError(
            f"nothing to compare for {usage.gpu_model}: no offer and no on-premises server price"
        )
    return compare(usage, options, budget_usd_per_month, notes)


def plan_within_budget(
    usage: Usage,
    offers: Sequence[Offer],
    a: Assumptions,
    *,
    tdp_w: float | None,
    budget_usd_per_month: float,
) -> Comparison:
    """With a budget and no usage: the comparison at the most hours a month any option's
    cost keeps within the budget (`usage.hours_per_month` is ignored)."""
    from optimizer.costs.tco import HOURS_PER_MONTH, affordable_hours

    full = replace(usage, hours_per_month=HOURS_PER_MONTH)
    first = plan(full, offers, a, tdp_w=tdp_w, budget_usd_per_month=budget_usd_per_month)
    hours = max(affordable_hours(o, budget_usd_per_month, full) for o in first.options)
    return plan(
        replace(usage, hours_per_month=math.floor(hours * 100) / 100),
        offers,
        a,
        tdp_w=tdp_w,
        budget_usd_per_month=budget_usd_per_month,
    )
