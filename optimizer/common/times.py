"""The span of time gpuopt reads: a time from outside (a query parameter, an option, a history
file) outside [EARLIEST, LATEST) is an error naming where it came from.

Python's datetime ends at years 1 and 9999: a time at either edge with an offset
(`0001-01-01T00:00:00+14:00`) cannot even be turned into UTC, and one a little inside them
overflows as soon as a month or a day is added to it. Prices, jobs and costs all live well
inside the bounds below, so anything outside is a mistake, said as one.
"""

from __future__ import annotations

from datetime import UTC, datetime

EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(2200, 1, 1, tzinfo=UTC)
EARLIEST_SECONDS = int(EARLIEST.timestamp())
LATEST_SECONDS = int(LATEST.timestamp())
SPAN = "between 1970-01-01 and 2200-01-01 UTC"


class TimeRangeError(ValueError):
    """A time outside [EARLIEST, LATEST); the message names the field."""


def in_span(value: datetime, name: str) -> datetime:
    """`value` in UTC (a time without an offset is UTC), or TimeRangeError naming `name`
    when it lies outside [EARLIEST, LATEST) or cannot be said in UTC at all."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    try:
        utc = value.astimezone(UTC)
    except (OverflowError, ValueError):
        utc = None
    if utc is None or not EARLIEST <= utc < LATEST:
        raise TimeRangeError(f"{name}: must be {SPAN}")
    return utc


def seconds_in_span(value: int) -> bool:
    """Whether epoch seconds `value` lie in [EARLIEST, LATEST)."""
    return EARLIEST_SECONDS <= value < LATEST_SECONDS
