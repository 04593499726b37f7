"""What the offers page shows for a policy: the ranking the next launch under it would walk
(as GET /offers?policy= and `gpuopt offers --policy --explain`), candidates best first and
the rejections grouped by the rule that rejected them, narrowed by a text filter."""

from __future__ import annotations

from dataclasses import dataclass

from optimizer.api.state import ApiState
from optimizer.daemon.policies import LoadedPolicy
from optimizer.jobs.ranking import launch_ranking
from optimizer.model import Offer
from policies.engine import Candidate, Ranking, Rejection
from policies.schedule import window_at

CANDIDATES_SHOWN = 50
PER_RULE_SHOWN = 50


@dataclass(frozen=True, slots=True)
class RuleGroup:
    rule: str
    count: int  # rejected by this rule in all
    matching: int  # of them, those the filter keeps
    shown: list[Rejection]  # the first PER_RULE_SHOWN of those


@dataclass(frozen=True, slots=True)
class OffersPage:
    policy: LoadedPolicy
    window: str | None  # the schedule window in force, whose values the ranking used
    ranking: Ranking
    held_back: int
    query: str
    candidates: list[Candidate]
    candidate_matching: int
    groups: list[RuleGroup]


def offer_text(offer: Offer) -> str:
    """What a filter matches against: where, what and which market."""
    return " ".join(
        str(v)
        for v in (
            offer.provider,
            offer.region,
            offer.zone or "",
            offer.instance_type,
            offer.gpu_model,
            offer.market.value,
        )
    ).lower()


def matches(query: str, offer: Offer, reason: str = "") -> bool:
    """Every word of `query` appears in the offer's description or the reason."""
    text = offer_text(offer) + " " + reason.lower()
    return all(word in text for word in query.lower().split())


def offers_page(
    state: ApiState, loaded: LoadedPolicy, query: str = "", rule: str | None = None
) -> OffersPage:
    now = state.clock()
    # launch_ranking ranks the policy in force now (the schedule window's values), as /offers.
    found = launch_ranking(state.store, loaded.name, loaded.policy, now, window=state.probe_window)
    window = window_at(loaded.policy.schedule, now)
    ranking = found.ranking
    candidates = [c for c in ranking.candidates if matches(query, c.offer)]
    groups = []
    for name, count in ranking.rejection_counts().items():
        if rule and name != rule:
            continue
        kept = [r for r in ranking.rejected(name) if matches(query, r.offer, r.reason)]
        groups.append(RuleGroup(name, count, len(kept), kept[:PER_RULE_SHOWN]))
    return OffersPage(
        policy=loaded,
        window=None if window is None else window.name,
        ranking=ranking,
        held_back=found.held_back,
        query=query,
        candidates=candidates[:CANDIDATES_SHOWN],
        candidate_matching=len(candidates),
        groups=groups,
    )
