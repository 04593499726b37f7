"""The daemon's alarm: wake a loop at an instant on the daemon's clock, not at its next tick.

A reconciler that knows when its next decision falls due (the checkpoint window: the old job's
stop at the power-off less its allowance, optimizer/jobs/handover.py) asks for a pass then
(`ReconcileContext.wake_at`); the reconcile loop's `Alarm` calls its wake-up at that instant.

The instants are kept in a heap and one thread sleeps until the earliest; `fire_due` is the
decision (which instants have come on `clock`, and how long until the next), so tests drive it
with an injected clock. The thread waits at most `max_wait_s` at a time and asks the clock
again, so a clock that moves other than the host's monotonic one (a test's, an adjusted wall
clock) is followed within that; an instant asked for twice wakes once.
"""

from __future__ import annotations

import heapq
import logging
import threading
from collections.abc import Callable
from datetime import datetime

from optimizer.clock import Clock

log = logging.getLogger(__name__)

MAX_WAIT_S = 5.0  # the longest the alarm's thread sleeps before it reads the clock again


class Alarm:
    """Calls `wake` at each instant asked for with `at` (once per instant), on `clock`."""

    def __init__(
        self, wake: Callable[[], None], clock: Clock, *, max_wait_s: float = MAX_WAIT_S
    ) -> None:
        self.wake = wake
        self.clock = clock
        self.max_wait_s = max_wait_s
        self._due: list[datetime] = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.fired = 0  # wake-ups given, for tests and the bench

    def at(self, when: datetime) -> None:
        """Wake at `when` (at once if it has passed); an instant already set is kept once."""
        with self._cond:
            if self._closed or when in self._due:
                return
            heapq.heappush(self._due, when)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="alarm", daemon=True)
                self._thread.start()
            self._cond.notify()

    def pending(self) -> list[datetime]:
        """The instants still to come, earliest first."""
        with self._cond:
            return sorted(self._due)

    def fire_due(self) -> float | None:
        """Wake once for every instant that has come on the clock (one `wake` for them all);
        the seconds until the next instant (None: none left)."""
        now = self.clock()
        with self._cond:
            came = 0
            while self._due and self._due[0] <= now:
                heapq.heappop(self._due)
                came += 1
            left = (self._due[0] - now).total_seconds() if self._due else None
        if came:
            self.fired += 1
            try:
                self.wake()
            except Exception:  # a wake-up that fails must not end the alarm
                log.exception("the alarm's wake-up failed")
        return left

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._due.clear()
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            left = self.fire_due()
            with self._cond:
                if self._closed:
                    return
                if left is None and not self._due:
                    self._cond.wait(self.max_wait_s)
                    continue
                if self._due:  # one may have been added meanwhile
                    left = (self._due[0] - self.clock()).total_seconds()
                if left is not None and left > 0:
                    self._cond.wait(min(left, self.max_wait_s))


__all__ = ["MAX_WAIT_S", "Alarm"]
