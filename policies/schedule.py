"""A policy's schedule in time: which window is in force at an instant, the plain policy in
force then, and the coming transitions between windows (pure; the clock is an argument).

Each window occurrence runs from the first moment the local clock shows its start to the
first moment it shows its end (policies/windows.py says why). Outside every window the
policy's top-level values apply. Everything here takes and returns aware instants.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import yaml

from optimizer.clock import utc_text
from policies import windows
from policies.schema import WINDOW_KEYS, Policy, Schedule, Window

# An occurrence starts on its day and lasts at most a day of wall time, so the occurrences
# that can cover an instant started on its local date or the two before it.
_LOOK_BACK_DAYS = 2


@dataclass(frozen=True, slots=True)
class Occurrence:
    """One window, on one day, as real instants [start, end) in UTC."""

    window: str
    start: datetime
    end: datetime


@dataclass(frozen=True, slots=True)
class Transition:
    """The moment the window in force changes; None is "outside every window"."""

    at: datetime  # UTC
    before: str | None
    after: str | None


def _aware(when: datetime, what: str = "when") -> datetime:
    if when.tzinfo is None or when.utcoffset() is None:
        raise ValueError(f"{what} must be an aware instant (with a UTC offset), got {when}")
    return when.astimezone(UTC)


def _on(schedule: Schedule, window: Window, day: date) -> Occurrence | None:
    """The occurrence of `window` that starts on local date `day`, if it starts that day
    and lasts a moment of real time (one inside a skipped hour lasts none)."""
    if windows.DAYS[day.weekday()] not in window.days:
        return None
    tz = windows.zone(schedule.timezone)
    hours = window.parsed_hours()
    begin = datetime.combine(day, time()) + timedelta(minutes=hours.start)
    end = begin + timedelta(minutes=hours.minutes)  # wall-clock arithmetic (naive)
    start_at, end_at = windows.first_instant(tz, begin), windows.first_instant(tz, end)
    if end_at <= start_at:
        return None
    return Occurrence(window.name, start_at, end_at)


def _local_dates(schedule: Schedule, since: datetime, until: datetime) -> Iterator[date]:
    tz = windows.zone(schedule.timezone)
    day = since.astimezone(tz).date() - timedelta(days=_LOOK_BACK_DAYS)
    last = until.astimezone(tz).date() + timedelta(days=1)
    while day <= last:
        yield day
        day += timedelta(days=1)


def occurrences(schedule: Schedule, since: datetime, until: datetime) -> list[Occurrence]:
    """The occurrences that share a moment with [since, until), in time order."""
    since, until = _aware(since, "since"), _aware(until, "until")
    found = [
        occ
        for day in _local_dates(schedule, since, until)
        for window in schedule.windows
        if (occ := _on(schedule, window, day)) is not None and occ.start < until and occ.end > since
    ]
    return sorted(found, key=lambda o: o.start)


def window_at(schedule: Schedule | None, when: datetime) -> Window | None:
    """The window in force at `when`, or None (outside every window, or no schedule)."""
    if schedule is None:
        return None
    when = _aware(when)
    for occ in occurrences(schedule, when, when + timedelta(microseconds=1)):
        if occ.start <= when < occ.end:
            return schedule.window(occ.window)
    return None


def apply(policy: Policy, window: Window | None) -> Policy:
    """`policy` with `window`'s keys in place of its own, and no schedule."""
    update: dict[str, Any] = {"schedule": None}
    if window is not None:
        update.update(window.overrides())
    return policy.model_copy(update=update)


def effective(policy: Policy, when: datetime) -> Policy:
    """The plain policy in force at `when`: the window in force then applied over the
    top-level values (each key a window sets replaces the policy's), and no schedule."""
    if policy.schedule is None:
        return policy
    return apply(policy, window_at(policy.schedule, when))


def transitions(schedule: Schedule | None, since: datetime, until: datetime) -> list[Transition]:
    """Each moment in (since, until] at which the window in force changes, in time order.

    Back-to-back occurrences of one window (Monday 00:00-24:00 and Tuesday 00:00-24:00) are
    one stretch, with no transition between them; a window that ends where another starts is
    one transition from the first to the second."""
    if schedule is None:
        return []
    since, until = _aware(since, "since"), _aware(until, "until")
    if until <= since:
        return []
    # Widen by a day on each side so a stretch that runs across `since` or `until` is whole.
    found = occurrences(schedule, since - timedelta(days=1), until + timedelta(days=1))
    stretches: list[Occurrence] = []
    for occ in found:
        last = stretches[-1] if stretches else None
        if last is not None and last.window == occ.window and last.end == occ.start:
            stretches[-1] = Occurrence(occ.window, last.start, occ.end)
        else:
            stretches.append(occ)
    edges: list[Transition] = []
    for i, occ in enumerate(stretches):
        before = stretches[i - 1] if i else None
        if before is None or before.end < occ.start:
            edges.append(Transition(occ.start, None, occ.window))
        else:  # the previous stretch ends where this one starts
            edges.append(Transition(occ.start, before.window, occ.window))
        after = stretches[i + 1] if i + 1 < len(stretches) else None
        if after is None or after.start > occ.end:
            edges.append(Transition(occ.end, occ.window, None))
    return [t for t in edges if since < t.at <= until]


# -- what a transition changes -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Change:
    """One key whose value in force differs across a transition, as flow YAML."""

    key: str
    before: str
    after: str

    def __str__(self) -> str:
        return f"{self.key} {self.before} -> {self.after}"


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _flow(value: Any) -> str:
    if hasattr(value, "model_dump"):
        value = value.model_dump(mode="json", exclude_defaults=True, by_alias=True)
    value = _plain(value)
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000, sort_keys=False)
    return str(text).strip().removesuffix("...").strip()


def changes(before: Policy, after: Policy) -> list[Change]:
    """The keys a window may set whose values differ between two plain policies."""
    out = []
    for key in WINDOW_KEYS:
        old, new = getattr(before, key), getattr(after, key)
        if old != new:
            out.append(Change(key, _flow(old), _flow(new)))
    return out


def name_of(window: str | None) -> str:
    """A window's name, or what being outside every window is called."""
    return window if window is not None else "(no window)"


@dataclass(frozen=True, slots=True)
class PlannedTransition:
    """A transition with what it changes."""

    transition: Transition
    local: datetime  # the moment on the schedule's clock
    changes: tuple[Change, ...]

    def to_dict(self) -> dict[str, Any]:
        t = self.transition
        return {
            "at": utc_text(t.at),
            "local": self.local.isoformat(),
            "before": t.before,
            "after": t.after,
            "changes": [{"key": c.key, "before": c.before, "after": c.after} for c in self.changes],
        }


@dataclass(frozen=True, slots=True)
class Plan:
    """A policy's schedule from one instant: the window then, and the transitions after."""

    policy: str
    timezone: str | None
    since: datetime
    until: datetime
    window: str | None
    transitions: tuple[PlannedTransition, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "timezone": self.timezone,
            "since": utc_text(self.since),
            "until": utc_text(self.until),
            "window": self.window,
            "transitions": [t.to_dict() for t in self.transitions],
        }

    def text(self) -> str:
        """The plan for people, one transition a line."""
        if self.timezone is None:
            return f"policy {self.policy} has no schedule: its top-level values always apply"
        since = self.since.astimezone(windows.zone(self.timezone))
        lines = [
            f"policy {self.policy}, times in {self.timezone}; at {since:%a %Y-%m-%d %H:%M %Z}: "
            f"{name_of(self.window)}"
        ]
        if not self.transitions:
            lines.append(
                f"no transition until {self.until.astimezone(since.tzinfo):%a %Y-%m-%d %H:%M %Z}"
            )
        for planned in self.transitions:
            t = planned.transition
            what = "; ".join(str(c) for c in planned.changes) or "nothing changes"
            lines.append(
                f"{planned.local:%a %Y-%m-%d %H:%M %Z}  {name_of(t.before)} -> "
                f"{name_of(t.after)}: {what}"
            )
        return "\n".join(lines)


def window_plan(policy: Policy, since: datetime, until: datetime) -> Plan:
    """The window in force at `since` and each transition in (since, until] with the keys it
    changes (what `gpuopt policy windows` prints)."""
    found = policy.schedule
    if found is None:
        return Plan(policy.name, None, since, until, None, ())
    tz = windows.zone(found.timezone)
    now = window_at(found, since)
    planned = tuple(
        PlannedTransition(
            t,
            t.at.astimezone(tz),
            tuple(
                changes(
                    apply(policy, found.window(t.before) if t.before else None),
                    apply(policy, found.window(t.after) if t.after else None),
                )
            ),
        )
        for t in transitions(found, since, until)
    )
    return Plan(
        policy.name, found.timezone, since, until, None if now is None else now.name, planned
    )


__all__ = [
    "Change",
    "Occurrence",
    "Plan",
    "PlannedTransition",
    "Transition",
    "apply",
    "changes",
    "effective",
    "name_of",
    "occurrences",
    "transitions",
    "window_at",
    "window_plan",
]
