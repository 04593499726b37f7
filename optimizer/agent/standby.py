"""The agent's side of standby start (docs/standby.md; the job's side, optimizer/standby.py).

A job whose spec says `standby: true` is started while the fence holds, with
`GPUOPT_STANDBY=1` and `GPUOPT_GO_FILE`; it builds what does not need the checkpoint and
waits. `Standby` keeps what that start needs to know: the go file, when the job's `run`
command started, and whether the go has been given, so `job_started` is reported once, at
the go (the daemon lifts a fence only for an attempt whose job has not started, so a job in
standby must not count as started), or when `run` starts if a long `setup` ends after it.

Once the job says it waits (`<go file>.ready`, made by `wait_for_go`), or has ended before
its go, the agent reports `standby_ready` (once): the daemon waits for it before it stops the
old attempt's job (`jobs/standby.py`), so that one trains on while the new one starts up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from optimizer import standby
from optimizer.agent.config import Assignment
from optimizer.agent.reporter import EventQueue, now_iso
from optimizer.agent.runner import AdoptedJob
from optimizer.protocol import STANDBY_READY_EVENT

log = logging.getLogger(__name__)

READY = STANDBY_READY_EVENT  # the agent's event: the job in standby waits for its go
# How often an agent whose job waits in standby, and has said so, asks whether the fence has
# lifted: the daemon stops the old job on that word, so the lift is seconds away, and the go
# should follow it closely (the fence's usual poll is 0.25 s). A bounded window: the old
# job's checkpoint, at most its allowance.
READY_POLL_S = 0.05


def wanted(assignment: Assignment) -> bool:
    """Whether to start the job in standby: its spec asks for it and it must wait at a fence.
    A gang node starts as without (its rendezvous is settled by the fence itself)."""
    gang = assignment.gang
    return (
        assignment.job.standby
        and assignment.fence is not None
        and (gang is None or gang.nodes <= 1)
    )


class Standby:
    """One standby start: the go file, and when the job's `run` began."""

    def __init__(self, go_file: Path) -> None:
        self.go_file = go_file
        self.since: str | None = None  # when `run` started (UTC text), for job_started
        self.pid: int | None = None
        self.given: str | None = None  # the word given: go or stop
        self.reported = False  # standby_ready sent
        self._began = time.monotonic()
        self._lock = threading.Lock()

    def prepare(self) -> dict[str, str]:
        """Make the go file (a pipe the job waits on); the job's extra environment."""
        standby.prepare(self.go_file)
        return {standby.ENV_STANDBY: "1", standby.ENV_GO_FILE: str(self.go_file)}

    def note_ready(self, exited: bool, queue: EventQueue) -> None:
        """Report `standby_ready` once the job waits for its go, or has `exited` before it
        (a start-up that failed: the old job need not wait for it)."""
        if self.reported or not (exited or standby.ready_file(self.go_file).exists()):
            return
        self.reported = True
        startup_s = round(time.monotonic() - self._began, 3)
        queue.put(READY, {"exited": exited, "startup_s": startup_s})
        log.info("the job in standby %s after %.1f s", "ended" if exited else "is ready", startup_s)

    def poll_s(self, usual: float) -> float:
        """How long to wait before the next fence poll: shorter once `standby_ready` went."""
        return min(usual, READY_POLL_S) if self.reported else usual

    def run_started(
        self, pid: int, *, waiting: Callable[[], object], report: Callable[[], object]
    ) -> None:
        """The `run` command has started (`pid`): `report` it as the job's start where the go
        came first (a long `setup`), else `waiting` (it waits for the go, which reports it)."""
        with self._lock:
            self.pid, self.since = pid, now_iso()
            (report if self.given == standby.GO else waiting)()

    def go(self, *, report: Callable[[int], object]) -> None:
        """Give the go, and `report` the job's start (its pid) where `run` has started; where
        a `setup` still runs, `run_started` reports it."""
        started = time.monotonic()
        with self._lock:
            standby.give(self.go_file, standby.GO)
            self.given = standby.GO
            if self.pid is not None:
                report(self.pid)
        log.info("standby: go given in %.1f ms", (time.monotonic() - started) * 1000)

    def stop(self) -> None:
        """Tell the job waiting in standby to end (it exits 143 without loading anything)."""
        with self._lock:
            if self.given is None:
                standby.give(self.go_file, standby.STOP)
                self.given = standby.STOP


def end_orphan(record: dict[str, object], go_file: Path, grace_s: float) -> None:
    """A job an earlier agent started in standby and left waiting: told to stop, SIGTERM,
    then SIGKILL after `grace_s`; returns once it has ended (it never got its go, so nothing
    of it is lost, and this agent starts the job anew)."""
    pid, ticks = record.get("pid"), record.get("start_ticks")
    if not isinstance(pid, int):
        return
    job = AdoptedJob(pid, ticks if isinstance(ticks, int) else None, poll_s=0.05)
    if not job.alive():
        return
    log.warning("ending the job an earlier agent left in standby (pid %s)", pid)
    if go_file.exists():
        standby.give(go_file, standby.STOP)
    job.stop(grace_s)
    job.wait(grace_s + 5.0)


__all__ = ["READY", "READY_POLL_S", "Standby", "end_orphan", "wanted"]
