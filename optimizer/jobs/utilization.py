"""Utilization rules and max_duration: pure decisions on a running job's GPU readings.

`watch(...)` looks at one running attempt — its job's start, the per-span GPU readings its
agent sent (the `gpu_sample` rows: `util_mean` over each span), the rules of its policy and
job spec, the end of the last window each alert rule already alerted on — and the time now,
and says which rules fire. It does no I/O and reads no clock; the reconciler's
utilization watch (watch.py) carries out what it says: `stop` through the state machine
(machine.decide, the job ends `stopped`), `alert` as an event deduplicated per attempt and
window start.

"Below `below` for W", precisely (docs/policies.md, Utilization):

* The evidence is the attempt's samples with a reading (`util` not None) that started
  before now and end after the job started running on this attempt; each sample is the mean
  utilization over its span `[start, start + span)`. A span still in progress (the local
  cloud's live readings report the minute so far) counts up to now: its end is taken as
  `min(start + span, now)`.
* The window is the W that ends where the evidence ends: `[end - W, end]`, `end` the latest
  sample's (clipped) end. (An agent reading NVML sends a minute once it has closed, so a
  window ending now would never be covered.)
* The rule fires when (1) the window starts no earlier than the job started running on this
  attempt — at least W of coverage since then; (2) the samples overlapping the window cover
  it without a gap longer than `GAP`; (3) every one of them is below `below`; and (4) for an
  alert, the window starts no earlier than the end of the window it last alerted on, so a
  job that stays low alerts once per W, never twice for the same readings.

`max_duration` counts from when the job first started running, on any attempt, on the wall
clock (time between attempts counts): a job that started at 10:00 with `max_duration: 2h` is
stopped at 12:00 whatever was interrupted in between.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import ValidationError

from policies.schema import Policy, Utilization, UtilizationRule

# The longest hole between two samples that still counts as covered: agents close their
# spans on their own clock, so consecutive spans may sit a little apart.
GAP = timedelta(seconds=2)
RULE_NAMES: tuple[str, ...] = ("idle", "low")  # the order rules are looked at and reported

Action = Literal["alert", "stop"]


@dataclass(frozen=True, slots=True)
class Sample:
    """One span of readings: the mean GPU utilization (0..1) over `[start, start + span)`;
    `util` None when the span had no reading (no GPU)."""

    start: datetime
    span: timedelta
    util: float | None

    @property
    def end(self) -> datetime:
        return self.start + self.span


@dataclass(frozen=True, slots=True)
class Rule:
    name: str  # low | idle
    below: float
    window: timedelta
    action: Action

    def describe(self) -> str:
        return f"below {self.below:.0%} for {span(self.window)}"


@dataclass(frozen=True, slots=True)
class Rules:
    """What one job is held to: its utilization rules and its max_duration."""

    rules: tuple[Rule, ...] = ()
    max_duration: timedelta | None = None

    def __bool__(self) -> bool:
        return bool(self.rules) or self.max_duration is not None


@dataclass(frozen=True, slots=True)
class Fired:
    """A rule whose window of readings was all below its threshold."""

    rule: Rule
    start: datetime
    end: datetime
    peak: float  # the highest span mean in the window

    @property
    def message(self) -> str:
        return (
            f"GPU utilization {self.rule.describe()} (at most {self.peak:.0%} "
            f"from {self.start.isoformat(timespec='seconds')} to "
            f"{self.end.isoformat(timespec='seconds')}; rule {self.rule.name})"
        )


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a pass does about one running attempt: alerts to raise, and why to stop (None:
    keep running)."""

    alerts: tuple[Fired, ...] = ()
    stop: str | None = None
    stopped_by: str | None = None  # the rule name, or max_duration
    fired_stop: Fired | None = None


def span(delta: timedelta) -> str:
    seconds = delta.total_seconds()
    if seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    if seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"


def _rule(name: str, rule: UtilizationRule) -> Rule:
    return Rule(name, rule.below, timedelta(seconds=rule.for_), rule.action)


def rules_for(policy: Policy, spec: Mapping[str, Any]) -> Rules:
    """The job's rules: the policy's, each replaced by the job spec's rule of the same name
    when the spec gives one; the spec's max_duration over the policy's. `spec` is the stored
    job spec (durations in seconds, as submitted specs are stored)."""
    chosen: dict[str, UtilizationRule | None] = {
        "low": policy.utilization.low,
        "idle": policy.utilization.idle,
    }
    raw = spec.get("utilization")
    if isinstance(raw, Mapping):
        try:
            own = Utilization.model_validate(dict(raw), strict=False)
        except ValidationError:
            own = Utilization()
        for name in chosen:
            value = getattr(own, name)
            if value is not None:
                chosen[name] = value
    limit = policy.max_duration
    if isinstance(spec.get("max_duration"), int | float):
        limit = float(spec["max_duration"])
    return Rules(
        rules=tuple(_rule(n, chosen[n]) for n in RULE_NAMES if chosen[n] is not None),  # type: ignore[arg-type]
        max_duration=None if limit is None else timedelta(seconds=limit),
    )


def below_for(
    samples: Iterable[Sample],
    rule: Rule,
    *,
    started_at: datetime,
    now: datetime,
    since: datetime | None = None,
) -> Fired | None:
    """Whether `rule` fires (see the module's docstring); `since`: the end of the window the
    rule last fired on for this attempt (None: never)."""
    evidence = sorted(
        (
            Sample(s.start, min(s.end, now) - s.start, s.util)
            for s in samples
            if s.util is not None and s.end > started_at and s.start < now
        ),
        key=lambda s: (s.start, s.end),
    )
    if not evidence:
        return None
    end = max(s.end for s in evidence)
    start = end - rule.window
    if start < started_at or (since is not None and start < since):
        return None
    inside = [s for s in evidence if s.end > start and s.start < end]
    reached = start
    for s in inside:
        if s.start - reached > GAP:
            return None
        reached = max(reached, s.end)
    if reached < end:
        return None
    readings = [s.util for s in inside if s.util is not None]
    if not all(u < rule.below for u in readings):
        return None
    return Fired(rule, start, end, max(readings))


def overran(first_started_at: datetime | None, limit: timedelta | None, *, now: datetime) -> bool:
    """Whether a job that first started running at `first_started_at` has run `limit`."""
    return first_started_at is not None and limit is not None and now - first_started_at >= limit


def watch(
    rules: Rules,
    samples: Iterable[Sample],
    *,
    started_at: datetime,
    first_started_at: datetime,
    now: datetime,
    alerted: Mapping[str, datetime] | None = None,
) -> Verdict:
    """What to do about a running attempt whose job started at `started_at` (the job's first
    start, on any attempt: `first_started_at`). `alerted`: per rule name, the end of the
    window it last alerted on for this attempt."""
    alerted = alerted or {}
    samples = list(samples)
    if overran(first_started_at, rules.max_duration, now=now):
        assert rules.max_duration is not None
        ran = span(rules.max_duration)
        return Verdict(
            stop=f"ran its max_duration of {ran} (since "
            f"{first_started_at.isoformat(timespec='seconds')})",
            stopped_by="max_duration",
        )
    alerts: list[Fired] = []
    for rule in rules.rules:
        since = alerted.get(rule.name) if rule.action == "alert" else None
        fired = below_for(samples, rule, started_at=started_at, now=now, since=since)
        if fired is None:
            continue
        if rule.action == "stop":
            return Verdict(
                alerts=tuple(alerts),
                stop=fired.message,
                stopped_by=rule.name,
                fired_stop=fired,
            )
        alerts.append(fired)
    return Verdict(alerts=tuple(alerts))
