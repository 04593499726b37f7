"""What the ranking engine returns: candidates best first, and the rejections by rule.

`Ranking` keeps a rule's rejections as two sequences, the offers and their reasons, and
builds a `Rejection` record only when one is read. The columnar engine hands it lazy
sequences (`LazyRows`): an offer is fetched and a reason formatted only when read, so a
caller that wants the best offer or the counts per rule pays for neither.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import chain, repeat
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar, overload

from optimizer.clock import utc_text
from optimizer.model import Offer

if TYPE_CHECKING:
    import numpy as np
else:
    from optimizer.common.lazy import numpy as np

T = TypeVar("T")


class LazyRows(Sequence[T]):
    """`at(i)` for each row index i of `index`, computed when read (and kept once all are
    read). `bulk(indexes)`, where given, makes many at once (a slice, or all of them)."""

    __slots__ = ("_at", "_built", "_bulk", "_index")

    def __init__(
        self,
        at: Callable[[int], T],
        index: np.ndarray,
        bulk: Callable[[np.ndarray], list[T]] | None = None,
    ) -> None:
        self._at = at
        self._index = index
        self._bulk = bulk
        self._built: list[T] | None = None

    def __len__(self) -> int:
        return len(self._index)

    def _many(self, index: np.ndarray) -> list[T]:
        if self._bulk is not None:
            return self._bulk(index)
        return list(map(self._at, index.tolist()))

    @overload
    def __getitem__(self, i: int) -> T: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[T]: ...
    def __getitem__(self, i: int | slice) -> T | Sequence[T]:
        if self._built is not None:
            return tuple(self._built[i]) if isinstance(i, slice) else self._built[i]
        if isinstance(i, slice):
            return tuple(self._many(self._index[i]))
        return self._at(int(self._index[i]))

    def __iter__(self) -> Iterator[T]:
        if self._built is None:
            self._built = self._many(self._index)
        return iter(self._built)

    def __bool__(self) -> bool:
        return len(self._index) > 0

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"LazyRows({len(self)} rows)"


class Candidate(NamedTuple):
    """An offer that passed every rule, with the figures its rank came from.

    A NamedTuple, like Rejection: a permissive policy over a large price list builds one per
    offer, and a frozen dataclass costs several times more to construct.
    """

    offer: Offer
    rank: int  # 1 = best
    score: float  # what rank_by orders on: USD/h, per node-TFLOP-hour or TB/s-hour, per step
    usd_per_gpu_hour: float
    gpu_memory_need_gib: float  # per GPU, after the buffer
    memory_headroom: float | None  # offer's GPU memory / need - 1; None when nothing is needed
    node_tflops: float | None  # whole node, for the ranking dtype (measured where known)
    usd_per_tflop_hour: float | None
    on_demand_usd_per_hour: float | None  # cheapest on-demand of the same type in the region
    throughput: str | None = None  # where node_tflops came from: measured | datasheet
    measured_n: int | None = None  # probe results the type's measured figures are medians of
    measured_age_s: float | None = None  # seconds from the newest of them to the evaluation
    node_tbps: float | None = None  # memory bandwidth, whole node (measured where known)
    usd_per_tbps_hour: float | None = None
    bandwidth: str | None = None  # where node_tbps came from: measured | datasheet
    probe_failures: str | None = None  # the type's probes keep failing: ranked after the rest
    # Expected cost (policies/risk.py), where the daemon or the CLI worked it out:
    interruption_p: float | None = None  # the pool's interruption probability per hour
    interruption_source: str | None = None  # where p came from, in words
    expected_usd_per_hour: float | None = None  # price x (1 + p x overhead_hours)
    overhead_hours: float | None = None  # the job's restart overhead it was worked out with
    risk: str | None = None  # a recent interruption in the pool, in words
    # Data gravity (policies/data_rules.py), where the ranking was given the job's state:
    move_usd: float | None = None  # egress + the restore's time at this offer's price
    move_usd_per_hour: float | None = None  # move_usd spread over the horizon, in the score
    move: str | None = None  # the move in words: "moving 12.3 GiB from aws eu-central-1: ..."
    # Price per step (policies/per_step.py), under rank_by price_per_step:
    steps_per_hour: float | None = None  # the job's speed on this offer's type
    usd_per_step: float | None = None  # (price + move per hour) / steps_per_hour
    speed_source: str | None = None  # job | probe | datasheet (None: no speed for it)
    speed_basis: str | None = None  # where the speed came from, in words

    def to_dict(self) -> dict[str, Any]:
        moved = (
            {}
            if self.move_usd is None
            else {
                "move_usd": self.move_usd,
                "move_usd_per_hour": self.move_usd_per_hour,
                "move": self.move,
            }
        )
        stepped = (
            {}
            if self.speed_basis is None
            else {
                "steps_per_hour": self.steps_per_hour,
                "usd_per_step": self.usd_per_step,
                "speed_source": self.speed_source,
                "speed_basis": self.speed_basis,
            }
        )
        return (
            moved
            | stepped
            | {
                "rank": self.rank,
                "score": self.score,
                "usd_per_gpu_hour": self.usd_per_gpu_hour,
                "gpu_memory_need_gib": self.gpu_memory_need_gib,
                "memory_headroom": self.memory_headroom,
                "node_tflops": self.node_tflops,
                "usd_per_tflop_hour": self.usd_per_tflop_hour,
                "on_demand_usd_per_hour": self.on_demand_usd_per_hour,
                "throughput": self.throughput,
                "measured_n": self.measured_n,
                "measured_age_s": self.measured_age_s,
                "node_tbps": self.node_tbps,
                "usd_per_tbps_hour": self.usd_per_tbps_hour,
                "bandwidth": self.bandwidth,
                "probe_failures": self.probe_failures,
                "interruption_p": self.interruption_p,
                "interruption_source": self.interruption_source,
                "expected_usd_per_hour": self.expected_usd_per_hour,
                "overhead_hours": self.overhead_hours,
                "risk": self.risk,
                "offer": self.offer.to_dict(),
            }
        )


class Rejection(NamedTuple):
    """An offer and the first rule it failed, with a reason that names the numbers.

    A NamedTuple rather than a dataclass: a large price list yields one per offer, and a
    tuple is the cheapest immutable record Python builds. `Ranking` builds them when they
    are first read, not while ranking.
    """

    offer: Offer
    rule: str  # one of RULES
    reason: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "reason": self.reason, "offer": self.offer.to_dict()}


def _records(rule: str, offers: Sequence[Offer], reasons: Sequence[str]) -> Iterator[Rejection]:
    """One rule's Rejection records, built as bare tuples (skipping the NamedTuple's
    Python-level __new__)."""
    return map(tuple.__new__, repeat(Rejection), zip(offers, repeat(rule), reasons))


@dataclass(frozen=True, slots=True)
class Ranking:
    """The engine's answer for one policy at one moment.

    Candidates are best first. Rejections are grouped by rule in RULES order and keep the
    input order within a rule; their records are built when first read (`rejections`,
    `rejected(rule)`), so a caller that needs only the best offer or the counts per rule
    (`rejection_counts()`) never pays for one record per rejected offer.
    """

    policy_name: str
    evaluated_at: datetime
    dtype: str  # the dtype throughput and price_per_tflop were read for
    candidates: Sequence[Candidate]  # a tuple, or LazyRows (each built when read)
    # (rule, offers, reasons) for each rule that rejected something, in RULES order; the
    # sequences may be lazy (LazyRows).
    rejected_columns: tuple[tuple[str, Sequence[Offer], Sequence[str]], ...] = field(repr=False)
    # Records built so far: a rule's, or under "" every rule's.
    _built: dict[str, tuple[Rejection, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @property
    def best(self) -> Candidate | None:
        return self.candidates[0] if self.candidates else None

    @property
    def rejections(self) -> tuple[Rejection, ...]:
        """Every rejected offer with the first rule it failed, grouped by rule in RULES order."""
        every = self._built.get("")
        if every is None:
            every = tuple(
                chain.from_iterable(
                    self._built.get(rule) or _records(rule, offers, reasons)
                    for rule, offers, reasons in self.rejected_columns
                )
            )
            self._built[""] = every
        return every

    def rejected(self, rule: str) -> tuple[Rejection, ...]:
        """The offers `rule` rejected, in input order."""
        found = self._built.get(rule)
        if found is None:
            every, start, found = self._built.get(""), 0, ()
            for name, offers, reasons in self.rejected_columns:
                if name == rule:
                    stop = start + len(offers)
                    found = every[start:stop] if every else tuple(_records(rule, offers, reasons))
                    break
                start += len(offers)
            self._built[rule] = found
        return found

    def rejection_counts(self) -> dict[str, int]:
        """How many offers each rule rejected, rules in checking order; rules that rejected
        nothing are left out. Builds no records."""
        return {rule: len(offers) for rule, offers, _ in self.rejected_columns}

    def rejections_by_rule(self) -> dict[str, list[Rejection]]:
        """Rejections per rule id, rules in checking order; rules that rejected nothing left out."""
        return {rule: list(self.rejected(rule)) for rule in self.rejection_counts()}

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values."""
        return {
            "policy": self.policy_name,
            "evaluated_at": utc_text(self.evaluated_at),
            "dtype": self.dtype,
            "candidates": [c.to_dict() for c in self.candidates],
            "rejected_by_rule": self.rejection_counts(),
            "rejections": [r.to_dict() for r in self.rejections],
        }
