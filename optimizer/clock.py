"""The clock gpuopt's daemon reads "now" from: injected everywhere, so tests can move time."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

Clock = Callable[[], datetime]
"""Returns the current time, timezone-aware UTC."""


def utc_now() -> datetime:
    """The wall clock, in UTC."""
    return datetime.now(UTC)


def utc_text(when: datetime, *, timespec: str = "auto", sep: str = "T") -> str:
    """`when` as ISO 8601 text in UTC with a `Z`: `2026-03-14T12:03:07.250000Z`.

    The one text form of a time on the wire, in events, files and logs. `timespec` is
    `datetime.isoformat`'s (`"seconds"` drops the fraction, `"milliseconds"` keeps three
    digits); `sep` the character between date and time. A naive time has no zone to convert
    from, so it is refused rather than read as local time.
    """
    if when.tzinfo is None:
        raise ValueError(f"naive datetime {when!r}: pass a timezone-aware time")
    return when.astimezone(UTC).isoformat(sep, timespec).replace("+00:00", "Z")


def utc_label(when: datetime) -> str:
    """`when` for people, in UTC to the second: `2026-03-14 12:03:07 UTC`."""
    return f"{utc_text(when, timespec='seconds', sep=' ').removesuffix('Z')} UTC"


def parse_utc(text: str) -> datetime:
    """ISO 8601 text as a time: `utc_text`'s form (`2026-03-14T12:03:07Z`, a `Z` for UTC), or
    any other offset, which the time keeps (`astimezone(UTC)` where UTC is wanted).

    The one reader of a time's text. Text without an offset (`2026-03-14T12:03:07`, a date
    alone) comes back naive: whether that is UTC or an error is the caller's to say. Text
    that is not an ISO time is a ValueError.
    """
    return datetime.fromisoformat(text)


CLOCK_OFFSET_ENV = "GPUOPT_CLOCK_OFFSET_S"


def machine_now() -> datetime:
    """This machine's time, in UTC: the wall clock moved by GPUOPT_CLOCK_OFFSET_S seconds
    where that is set. The local cloud sets it on its instances when it runs on a clock of its
    own (a test's fixed start), so that what their agents report is dated on that clock."""
    raw = os.environ.get(CLOCK_OFFSET_ENV)
    if not raw:
        return utc_now()
    try:
        offset = float(raw)
    except ValueError:
        raise ValueError(f"{CLOCK_OFFSET_ENV}={raw!r} is not a number of seconds") from None
    return utc_now() + timedelta(seconds=offset)


class ManualClock:
    """A clock that moves only when told to: for tests and benches."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        if self._now.tzinfo is None:
            raise ValueError("ManualClock needs a timezone-aware start")
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, seconds: float = 0.0, **delta: float) -> datetime:
        """Move forward by `seconds` (and any timedelta keywords); returns the new time."""
        with self._lock:
            self._now += timedelta(seconds=seconds, **delta)
            return self._now

    def set(self, when: datetime) -> None:
        with self._lock:
            self._now = when.astimezone(UTC)


class SteadyClock:
    """A clock that starts at a fixed instant and then moves at the wall clock's pace.

    For end-to-end tests that run real processes (so time must pass) but must not depend on
    the calendar day they run on: month ends, budgets and schedules see the fixed start.
    """

    def __init__(self, start: datetime) -> None:
        if start.tzinfo is None:
            raise ValueError("SteadyClock needs a timezone-aware start")
        self._start = start.astimezone(UTC)
        self._origin = time.monotonic()

    def __call__(self) -> datetime:
        return self._start + timedelta(seconds=time.monotonic() - self._origin)

    def epoch(self) -> float:
        """The same instant as epoch seconds, for clocks that count in floats."""
        return self().timestamp()
