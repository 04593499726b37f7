"""Clocks for end-to-end tests that need real time to pass and the calendar to jump."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

from optimizer.clock import SteadyClock


class JumpClock(SteadyClock):
    """A SteadyClock (a fixed start, then the wall clock's pace) that a test can move ahead:
    real processes keep running while the daemon sees half an hour pass in an instant."""

    def __init__(self, start: datetime) -> None:
        super().__init__(start)
        self._ahead = timedelta(0)
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            ahead = self._ahead
        return super().__call__() + ahead

    def skip(self, **delta: float) -> datetime:
        """Jump forward by a timedelta's keywords (minutes=31); returns the new time."""
        with self._lock:
            self._ahead += timedelta(**delta)
        return self()
