"""The checkpoint window on the agent's side: the job's stop at the power-off less its allowance.

After an ending interruption notice the daemon stops the old job once its replacement is
ready, or at the power-off less the job's checkpoint allowance, whichever comes first
(optimizer/jobs/handover.py). Its word reaches the agent on the answer to a call, so it comes a
poll late; the agent knows both figures itself (the power-off from the notice, the allowance
from its registration answer), so it also stops the job at that instant should the daemon's
stop not have come by then. A stop that came first wins: the job gets one SIGTERM.

`CheckpointWindow` holds the instant and says how long is left on an injected wall clock;
`CommandPoller` asks the daemon for its commands every `poll_s` while the job hands over, so a
stop for a replacement that is ready early reaches the job within that, not a heartbeat later.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from optimizer.clock import machine_now
from optimizer.protocol import Command, EventsAnswer, power_off_time

log = logging.getLogger(__name__)

WINDOW_REASON = "interrupted; the power-off is near"  # the daemon's words for the same stop
HANDOVER_POLL_S = 0.25  # how often an agent that got an ending notice asks for its commands


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


class CommandPoller:
    """Asks the daemon for its commands (an empty `/events` call) every `poll_s` until
    stopped; failures are left to the reporter's own retries (logged at debug)."""

    def __init__(
        self,
        poll: Callable[[], EventsAnswer],
        on_commands: Callable[[list[Command]], object],
        *,
        poll_s: float = HANDOVER_POLL_S,
    ) -> None:
        self.poll = poll
        self.on_commands = on_commands
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="agent-handover", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                answer = self.poll()
            except Exception as exc:  # the daemon away: the window still stops the job
                log.debug("handover poll failed: %s", exc)
            else:
                if answer.commands:
                    self.on_commands(answer.commands)
            self._stop.wait(self.poll_s)


__all__ = [
    "HANDOVER_POLL_S",
    "WINDOW_REASON",
    "CheckpointWindow",
    "CommandPoller",
    "stop_due",
]
