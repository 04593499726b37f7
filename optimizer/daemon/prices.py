"""Price signals: after each poll, each policy's ranking is compared with the last one.

Events: `best_offer.changed` (the top candidate is another pool), `price.dropped` (the same pool
got more than `drop_fraction` cheaper than its reference price: the price when last
reported, raised whenever it rises), `best_offer.lost` (nothing satisfies the policy any
more), and `bid_cap.crossed` (spot pools whose price moved across the policy's bid cap, one
event per direction per poll). The first evaluation of a policy sets the baseline and raises
nothing; the first of a new version of it starts a new baseline too, except that losing
every candidate (or finding one again) is raised at once. `price_signals` is pure;
`PriceWatch` reads and writes the store. The daemon ranks after every poll once each poll
has run, and whenever the policies in force change.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from optimizer.alerts.outbox import Emitter
from optimizer.daemon.policies import PolicyRegistry
from optimizer.jobs.measured import DEFAULT_WINDOW, ProbeWindow, measured
from optimizer.jobs.offer_table import latest_table
from optimizer.model import EventKind, Market, Offer
from optimizer.store import NewEvent, Store
from policies.engine import OfferTable, Ranking, evaluate
from policies.measured import Measured
from policies.rulebook import any_bid_cap, around_bid_caps
from policies.schedule import effective, window_at
from policies.schema import Policy

log = logging.getLogger(__name__)

UNDER, OVER = "under", "over"
_LISTED = 10  # pools named in a bid-cap message; the event's data lists them all


def pool_key(offer: Offer) -> str:
    return str(offer.pool)


def describe(offer: Offer) -> str:
    where = f"{offer.region} ({offer.zone})" if offer.zone else offer.region
    return f"{offer.provider} {where} {offer.instance_type} {offer.market.value}"


def _usd(value: float) -> str:
    return f"${value:,.4f}/h"


@dataclass(frozen=True, slots=True)
class PriceState:
    """What a policy's last evaluation saw (kept in the store as JSON)."""

    sha256: str  # the policy version this state belongs to
    best_pool: str | None = None
    best_usd: float | None = None
    reference_usd: float | None = None  # what "got cheaper" is measured against
    caps: dict[str, tuple[str, float]] = field(default_factory=dict)  # pool → (side, USD/h)

    def to_json(self) -> dict[str, Any]:
        return {
            "sha256": self.sha256,
            "best_pool": self.best_pool,
            "best_usd": self.best_usd,
            "reference_usd": self.reference_usd,
            "caps": {pool: [side, usd] for pool, (side, usd) in sorted(self.caps.items())},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PriceState:
        caps = {pool: (str(v[0]), float(v[1])) for pool, v in data.get("caps", {}).items()}
        return cls(
            sha256=str(data.get("sha256", "")),
            best_pool=data.get("best_pool"),
            best_usd=data.get("best_usd"),
            reference_usd=data.get("reference_usd"),
            caps=caps,
        )


@dataclass(frozen=True, slots=True)
class Signal:
    kind: EventKind
    severity: str
    message: str
    data: dict[str, Any]
    dedupe_key: str


def has_bid_cap(policy: Policy) -> bool:
    """Whether the policy sets any bid cap (`policies.rulebook`'s)."""
    return any_bid_cap(policy.bid)


def cap_sides(ranking: Ranking) -> dict[str, tuple[str, float]]:
    """Spot pools on each side of the bid cap: rejected by a bid rule (over), or passing
    them (a candidate, or rejected only by a rule checked after them, the budget: under)."""
    sides: dict[str, tuple[str, float]] = {}
    for candidate in ranking.candidates:
        offer = candidate.offer
        if offer.market is Market.SPOT:
            sides[pool_key(offer)] = (UNDER, offer.usd_per_hour)
    # Only the bid rules' and the later rules' rejections: the ranking builds no record for
    # the (many) offers the other rules rejected.
    caps, later = around_bid_caps()
    for rule in ranking.rejection_counts():
        if rule in caps:
            side = OVER
        elif rule in later:
            side = UNDER
        else:
            continue
        for rejection in ranking.rejected(rule):
            offer = rejection.offer
            if offer.market is Market.SPOT:
                sides[pool_key(offer)] = (side, offer.usd_per_hour)
    return sides


def price_signals(
    name: str,
    sha256: str,
    ranking: Ranking,
    previous: PriceState | None,
    *,
    drop_fraction: float,
    capped: bool,
) -> tuple[list[Signal], PriceState]:
    """The events one evaluation raises, and the state to keep for the next one."""
    best = ranking.best
    offer = best.offer if best is not None else None
    pool = pool_key(offer) if offer is not None else None
    usd = offer.usd_per_hour if offer is not None else None
    caps = cap_sides(ranking) if capped else {}
    baseline = PriceState(sha256, pool, usd, usd, caps)
    if previous is None:
        return [], baseline
    stamp = f"{name}:{sha256[:12]}"
    if previous.sha256 != sha256:
        # A new version of the policy starts its own baseline (best pool, reference price,
        # bid-cap sides: an edit moves them, not the market), but whether anything satisfies
        # the policy carries over: an edit that leaves no candidate is a loss, at once.
        if offer is None and previous.best_pool is not None:
            return [_lost(name, stamp, previous, ranking, edited=True)], baseline
        if offer is not None and previous.best_pool is None:
            return [_changed(name, stamp, previous, offer)], baseline
        return [], baseline

    signals: list[Signal] = []
    reference = previous.reference_usd
    if offer is None or usd is None:
        if previous.best_pool is not None:
            signals.append(_lost(name, stamp, previous, ranking))
        reference = None
    elif pool != previous.best_pool:
        signals.append(_changed(name, stamp, previous, offer))
        reference = usd
    else:
        reference = max(reference or usd, usd)
        if usd <= (1 - drop_fraction) * reference:
            signals.append(
                Signal(
                    EventKind.PRICE_DROPPED,
                    "info",
                    f"policy {name}: best offer {describe(offer)} is {1 - usd / reference:.0%} "
                    f"cheaper: {_usd(reference)} → {_usd(usd)}",
                    {
                        "pool_after": pool,
                        "price_before": reference,
                        "price_after": usd,
                        "offer": offer.to_dict(),
                    },
                    f"drop:{stamp}:{pool}:{usd}:{offer.observed_at.isoformat()}",
                )
            )
            reference = usd

    for side, direction, severity in ((OVER, "above", "warning"), (UNDER, "below", "info")):
        crossed = sorted(
            (p, previous.caps[p][1], now_usd)
            for p, (now_side, now_usd) in caps.items()
            if now_side == side and p in previous.caps and previous.caps[p][0] != side
        )
        if crossed:
            signals.append(_crossing(name, stamp, direction, severity, crossed, ranking))
    return signals, PriceState(sha256, pool, usd, reference, caps)


def _lost(
    name: str, stamp: str, previous: PriceState, ranking: Ranking, *, edited: bool = False
) -> Signal:
    why = "since its edit" if edited else "any more"
    return Signal(
        EventKind.BEST_OFFER_LOST,
        "warning",
        f"policy {name}: no offer satisfies it {why} "
        f"(best was {previous.best_pool} at {_usd(previous.best_usd or 0)})",
        {"pool_before": previous.best_pool, "price_before": previous.best_usd},
        f"no-candidates:{stamp}:{ranking.evaluated_at.isoformat()}",
    )


def _changed(name: str, stamp: str, previous: PriceState, offer: Offer) -> Signal:
    pool, usd, before = pool_key(offer), offer.usd_per_hour, previous.best_usd
    change = f", {(usd - before) / before:+.1%}" if before else ""
    was = f" (was {previous.best_pool} at {_usd(before)}{change})" if before else ""
    return Signal(
        EventKind.BEST_OFFER_CHANGED,
        "info",
        f"policy {name}: best offer is now {describe(offer)} at {_usd(usd)}{was}",
        {
            "pool_before": previous.best_pool,
            "pool_after": pool,
            "price_before": before,
            "price_after": usd,
            "offer": offer.to_dict(),
        },
        f"best:{stamp}:{pool}:{usd}:{offer.observed_at.isoformat()}",
    )


def _crossing(
    name: str,
    stamp: str,
    direction: str,
    severity: str,
    crossed: list[tuple[str, float, float]],
    ranking: Ranking,
) -> Signal:
    listed = "; ".join(f"{p} {_usd(a)} → {_usd(b)}" for p, a, b in crossed[:_LISTED])
    more = f" and {len(crossed) - _LISTED} more" if len(crossed) > _LISTED else ""
    count = f"{len(crossed)} spot pool{'s' if len(crossed) != 1 else ''}"
    first = crossed[0]
    return Signal(
        EventKind.BID_CAP_CROSSED,
        severity,
        f"policy {name}: {count} moved {direction} the bid cap: {listed}{more}",
        {
            "direction": direction,
            "pools": [{"pool": p, "price_before": a, "price_after": b} for p, a, b in crossed],
            "price_before": first[1],
            "price_after": first[2],
        },
        f"cap-{direction}:{stamp}:{ranking.evaluated_at.isoformat()}",
    )


class PriceWatch:
    """Evaluates every policy in force over the latest offers and records what changed."""

    def __init__(
        self,
        store: Store,
        registry: PolicyRegistry,
        emitter: Emitter,
        *,
        drop_fraction: float = 0.20,
        probe_window: ProbeWindow = DEFAULT_WINDOW,
    ) -> None:
        self.store = store
        self.registry = registry
        self.emitter = emitter
        self.drop_fraction = drop_fraction
        self.probe_window = probe_window  # which probe results the ranking reads
        self._lock = threading.Lock()  # polls of several providers may finish together

    def evaluate(self, now: datetime) -> int:
        """One evaluation of every policy; returns the number of events raised."""
        with self._lock:
            policies = self.registry.snapshot()
            stored = self.store.policies.price_signals()
            raised = 0
            if policies:
                # One table for every policy, built once per change of the offers and kept for
                # the launches and GET /offers that rank them next (optimizer/jobs/
                # offer_table.py). With no policy in force nothing reads it, and an idle
                # daemon does not pay for it (a large table loads pyarrow for its text columns).
                offers = latest_table(self.store)
                found = measured(self.store, self.probe_window)
            for name, loaded in sorted(policies.items()):
                # Ranked as the policy in force now; a window change counts as an edit (the
                # bid-cap sides move because the policy did, not the market).
                window = window_at(loaded.policy.schedule, now)
                version = loaded.sha256
                if window is not None:
                    version = hashlib.sha256(f"{version}:{window.name}".encode()).hexdigest()
                try:
                    raised += self._one(
                        name, version, effective(loaded.policy, now), offers, stored, now, found
                    )
                except Exception:
                    log.exception("price signals for policy %s failed", name)
            for name in sorted(set(stored) - set(policies)):
                self.store.policies.save_price_signal(name, None)
            return raised

    def _one(
        self,
        name: str,
        sha256: str,
        policy: Policy,
        offers: OfferTable,
        stored: Mapping[str, Mapping[str, Any]],
        now: datetime,
        found: Measured | None = None,
    ) -> int:
        ranking = evaluate(policy, offers, now, measured=found)
        raw = stored.get(name)
        previous = PriceState.from_json(raw) if raw is not None else None
        signals, state = price_signals(
            name,
            sha256,
            ranking,
            previous,
            drop_fraction=self.drop_fraction,
            capped=has_bid_cap(policy),
        )
        if not signals and previous == state:
            return 0
        events: list[NewEvent] = [
            self.emitter.draft(
                s.kind,
                s.message,
                severity=s.severity,
                policy=name,
                data=s.data,
                dedupe_key=s.dedupe_key,
            )
            for s in signals
        ]
        self.store.policies.save_price_signal(name, state.to_json(), events, at=now)
        return len(events)
