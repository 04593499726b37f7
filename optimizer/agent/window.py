"""The checkpoint window on the agent's side: the job's stop at the power-off less its allowance.

After an ending interruption notice the daemon stops the old job once its replacement is
ready, or at the power-off less the job's checkpoint allowance, whichever comes first
(optimizer/jobs/handover.py). Its word reaches the agent on the answer to a call, so it comes a
poll late; the agent knows both figures itself (the power-off from the notice, the allowance
from its registration answer), so it also stops the job at that instant should the daemon's
stop not have come by then. A stop that came first wins: the job gets one SIGTERM.

`CheckpointWindow` holds the instant and says how long is left on an injected wall clock. (The
daemon's stop itself comes sooner than a heartbeat after a notice: the agent then asks for its
commands every `fence_poll_s`, agent.py's `_handover_polls`.)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from optimizer.clock import machine_now
from optimizer.protocol import power_off_time

WINDOW_REASON = "interrupted; the power-off is near"  # the daemon's words for the same stop


def stop_due(
    notice: Mapping[str, Any], seen_at: datetime, allowance_s: float | None
) -> datetime | None:
    """When the job gets its stop for the window: the notice's power-off less `allowance_s`
    (None: no allowance known, or a notice that ends nothing)."""
    if allowance_s is None:
        return None
    off = power_off_time(notice, seen_at)
    return None if off is None else off - timedelta(seconds=allowance_s)


class CheckpointWindow:
    """The window of one attempt's job: armed by the first ending notice, read by the agent's
    supervising loop (`left`), which stops the job once nothing is left."""

    def __init__(self, wall: Callable[[], datetime] = machine_now) -> None:
        self.wall = wall
        self.allowance_s: float | None = None
        self._notice: tuple[Mapping[str, Any], datetime] | None = None
        self._lock = threading.Lock()

    def notice(self, data: Mapping[str, Any]) -> None:
        """An ending notice's data (the `interruption_notice` event's); the first one counts."""
        with self._lock:
            if self._notice is None:
                self._notice = (dict(data), self.wall())

    @property
    def due(self) -> datetime | None:
        """When the job gets its stop (None: no ending notice yet, or no allowance)."""
        with self._lock:
            if self._notice is None:
                return None
            data, seen = self._notice
        return stop_due(data, seen, self.allowance_s)

    def left(self) -> float | None:
        """Seconds until the stop is due on the wall clock (<= 0: now; None: no stop due)."""
        due = self.due
        return None if due is None else (due - self.wall()).total_seconds()


__all__ = [
    "WINDOW_REASON",
    "CheckpointWindow",
    "stop_due",
]
