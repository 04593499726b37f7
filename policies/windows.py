"""Wall-clock arithmetic for a policy's schedule windows (pure; no schema, no I/O).

A window is local wall-clock hours (`09:00-18:00`, or `22:00-06:00` across midnight) on some
days of the week, in an IANA time zone. Two things are decided here:

- whether two windows overlap, on the wall clock of one week (a window that crosses midnight
  runs into the next day, and Sunday's into Monday);
- which instant a wall-clock time names on a date. The rule is "the first moment the clock
  shows that time": a time the clock shows twice (the hour repeated when summer time ends) is
  its first showing; a time it skips (the hour lost when summer time starts) is the moment the
  clock jumps past it. That mapping never goes backwards, so windows that do not overlap on
  the wall clock never overlap in real time either, and a window never flickers off and on
  inside the repeated hour.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")  # datetime.weekday() order
DAY_MINUTES = 24 * 60
WEEK_MINUTES = 7 * DAY_MINUTES

HOURS_PATTERN = r"^\s*([0-9]{1,2}):([0-9]{2})\s*-\s*([0-9]{1,2}):([0-9]{2})\s*$"


@dataclass(frozen=True, slots=True)
class Hours:
    """`HH:MM-HH:MM` as minutes after local midnight; `end` may be 1440 (`24:00`), and an
    end at or before the start crosses midnight into the next day."""

    start: int
    end: int

    @property
    def minutes(self) -> int:
        """How long the window lasts on the wall clock (at most a day)."""
        return (
            self.end - self.start if self.end > self.start else self.end + DAY_MINUTES - self.start
        )

    def __str__(self) -> str:
        return f"{_hhmm(self.start)}-{_hhmm(self.end)}"


def _hhmm(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def parse_hours(text: str) -> Hours:
    """`09:00-18:00` → Hours(540, 1080); raises ValueError saying what is wrong."""
    match = re.fullmatch(HOURS_PATTERN, text)
    if match is None:
        raise ValueError(
            f"{text!r} is not a span of hours: write HH:MM-HH:MM in local time "
            "(09:00-18:00, or 22:00-06:00 across midnight)"
        )
    sh, sm, eh, em = (int(g) for g in match.groups())
    if sh > 23 or sm > 59:
        raise ValueError(f"{text!r}: the start must be 00:00 to 23:59")
    if not ((eh < 24 and em <= 59) or (eh, em) == (24, 0)):
        raise ValueError(f"{text!r}: the end must be 00:00 to 24:00")
    start, end = sh * 60 + sm, eh * 60 + em
    if start == end:
        raise ValueError(
            f"{text!r} starts where it ends; a whole day is 00:00-24:00, a day and a night "
            "are two windows"
        )
    return Hours(start, end)


def day_index(day: str) -> int:
    return DAYS.index(day)


Span = tuple[int, int]  # [start, end) in minutes after Monday 00:00; end may pass the week


def weekly_spans(days: Iterable[str], hours: Hours) -> list[Span]:
    """Where a window lies on the wall clock of one week, one span per day it starts on."""
    return [
        (
            day_index(d) * DAY_MINUTES + hours.start,
            day_index(d) * DAY_MINUTES + hours.start + hours.minutes,
        )
        for d in days
    ]


def first_overlap(a: Sequence[Span], b: Sequence[Span]) -> tuple[Span, Span] | None:
    """A pair of spans, one of each, that share a minute of some week (spans wrap from
    Sunday into Monday); None when the two never meet."""
    for sa in a:
        for sb in b:
            for shift in (-WEEK_MINUTES, 0, WEEK_MINUTES):
                if sa[0] < sb[1] + shift and sb[0] + shift < sa[1]:
                    return sa, sb
    return None


def describe_span(span: Span) -> str:
    """`fri 22:00 to sat 06:00`: a weekly span as a person reads it."""
    start, end = span
    return f"{_at(start)} to {_at(end)}"


def _at(minute: int) -> str:
    minute %= WEEK_MINUTES
    return f"{DAYS[minute // DAY_MINUTES]} {_hhmm(minute % DAY_MINUTES)}"


def zone(name: str) -> ZoneInfo:
    """The IANA time zone `name` (Europe/Berlin); ValueError naming it when unknown."""
    if not name or name != name.strip():
        raise ValueError(f"{name!r} is not an IANA time zone name (Europe/Berlin, UTC)")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"unknown time zone {name!r}: use an IANA name such as Europe/Berlin, "
            "America/New_York or UTC"
        ) from None


def _wall(instant_ts: int, tz: ZoneInfo) -> datetime:
    return datetime.fromtimestamp(instant_ts, UTC).astimezone(tz).replace(tzinfo=None)


def first_instant(tz: ZoneInfo, wall: datetime) -> datetime:
    """The first moment (UTC) the clock in `tz` shows the naive wall time `wall`; for a time
    the clock skips, the moment it jumps past it (module docstring)."""
    earliest = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    if earliest.astimezone(tz).replace(tzinfo=None) == wall:
        return earliest  # it exists; fold=0 is its first showing when it shows twice
    # Skipped: read with the offset after the jump it falls before the jump (lo), with the
    # offset before the jump after it (hi). The jump is the first second whose wall time is
    # past `wall`.
    lo = int(wall.replace(tzinfo=tz, fold=1).astimezone(UTC).timestamp())
    hi = int(earliest.timestamp())
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _wall(mid, tz) >= wall:
            hi = mid
        else:
            lo = mid
    return datetime.fromtimestamp(hi, UTC)


__all__ = [
    "DAYS",
    "HOURS_PATTERN",
    "Hours",
    "Span",
    "describe_span",
    "first_instant",
    "first_overlap",
    "parse_hours",
    "weekly_spans",
    "zone",
]
