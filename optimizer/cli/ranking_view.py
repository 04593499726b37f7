"""A policy's ranking as the CLI shows it (`gpuopt offers --policy`), whether the engine ranked
here or the daemon answered: the table and the JSON output are made from a `RankingView`."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from optimizer.model import Offer
from optimizer.offers import OfferQuery
from policies.engine import Candidate, Ranking, Rejection


@dataclass(frozen=True, slots=True)
class RankingView:
    """A ranking as the CLI shows it, from the engine here or from the daemon's answer.

    `candidates` and `rejections` hold what was fetched (all the candidates, or the first
    ones; every rejection, or none when they are not shown); the counts are always whole.
    """

    policy_name: str
    evaluated_at: str
    dtype: str
    candidates: tuple[Candidate, ...]
    candidate_count: int
    rejection_counts: Mapping[str, int]
    rejections: tuple[Rejection, ...]
    cooling_down: int = 0  # offers left out because their pool is in cooldown (daemon only)
    at: str | None = None  # the instant whose policy ranked (its schedule window's)
    window: str | None = None  # the schedule window in force then; None: the top-level values

    @classmethod
    def of(cls, ranking: Ranking) -> RankingView:
        out = ranking.to_dict()
        return cls(
            ranking.policy_name,
            out["evaluated_at"],
            ranking.dtype,
            tuple(ranking.candidates),
            len(ranking.candidates),
            ranking.rejection_counts(),
            ranking.rejections,
        )

    @classmethod
    def from_api(cls, answer: Mapping[str, Any]) -> RankingView:
        """The view of the daemon's `GET /offers?policy=` answer (pages joined)."""
        candidates = tuple(
            Candidate(**{**c, "offer": Offer.from_dict(c["offer"])}) for c in answer["candidates"]
        )
        rejections = tuple(
            Rejection(Offer.from_dict(r["offer"]), r["rule"], r["reason"])
            for r in answer["rejections"]
        )
        return cls(
            answer["policy"],
            answer["evaluated_at"],
            answer["dtype"],
            candidates,
            int(answer["candidate_count"]),
            dict(answer["rejected_by_rule"]),
            rejections,
            int(answer.get("cooling_down", 0)),
            answer.get("at"),
            answer.get("window"),
        )

    def select(self, query: OfferQuery) -> RankingView:
        """Only the offers the query matches (candidates keep their rank); needs every
        candidate and rejection fetched."""
        candidates = tuple(c for c in self.candidates if query.matches(c.offer))
        rejections = tuple(r for r in self.rejections if query.matches(r.offer))
        counts = Counter(r.rule for r in rejections)
        # The rules in the ranking's own order (the daemon's checking order, a rule another
        # package registered there included), then any other rule in the order it appears.
        order = [*self.rejection_counts, *counts]
        return replace(
            self,
            candidates=candidates,
            candidate_count=len(candidates),
            rejection_counts={rule: counts[rule] for rule in dict.fromkeys(order) if counts[rule]},
            rejections=rejections,
        )

    @property
    def total(self) -> int:
        return self.candidate_count + sum(self.rejection_counts.values())

    def rejections_by_rule(self) -> dict[str, list[Rejection]]:
        """The fetched rejections per rule, rules in checking order."""
        out: dict[str, list[Rejection]] = {rule: [] for rule in self.rejection_counts}
        for rejection in self.rejections:
            out.setdefault(rejection.rule, []).append(rejection)
        return out

    def to_dict(self, *, limit: int, explain: bool, source: str) -> dict[str, Any]:
        """The JSON output: the first `limit` candidates (0: all), rejections with `explain`."""
        shown = self.candidates[:limit] if limit else self.candidates
        out: dict[str, Any] = {
            "policy": self.policy_name,
            "evaluated_at": self.evaluated_at,
            "dtype": self.dtype,
            "source": source,
            "candidate_count": self.candidate_count,
            "candidates": [c.to_dict() for c in shown],
            "rejected_by_rule": dict(self.rejection_counts),
            "cooling_down": self.cooling_down,
            "at": self.at,
            "window": self.window,
        }
        if explain:
            out["rejections"] = [r.to_dict() for r in self.rejections]
        return out
