"""APScheduler 3 around the daemon's loops: each loop is one interval job, never two
instances at once, missed runs coalesced into one, late runs allowed a grace period.

A loop that raises is logged with its traceback, counted in
`gpuopt_loop_runs_total{outcome="error"}`, and simply runs again at its next tick.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from apscheduler.schedulers.background import BackgroundScheduler

from optimizer.clock import Clock, utc_now
from optimizer.daemon.metrics import Metrics

log = logging.getLogger(__name__)


class LoopScheduler:
    """The daemon's loops on a background thread pool."""

    def __init__(
        self,
        *,
        metrics: Metrics | None = None,
        misfire_grace_s: float = 60,
        clock: Clock = utc_now,
        workers: int = 10,
    ) -> None:
        from apscheduler.executors.pool import ThreadPoolExecutor

        self.metrics = metrics
        self.clock = clock
        self._scheduler = BackgroundScheduler(
            timezone=UTC,
            executors={"default": ThreadPoolExecutor(workers)},
            job_defaults={
                "max_instances": 1,
                "coalesce": True,
                "misfire_grace_time": max(1, round(misfire_grace_s)),
            },
        )
        self.names: list[str] = []
        # Runs in progress, counted here so that shutdown can wait for them without holding
        # the scheduler's job-store lock: a loop that wakes another (run_now) takes that lock,
        # and APScheduler's own shutdown(wait=True) holds it while it waits for the loops.
        self._busy = threading.Condition()
        self._in_flight = 0
        self._stopping = False

    def add(
        self,
        name: str,
        func: Callable[[], object],
        every_s: float,
        *,
        run_now: bool = True,
        guards_overlap: bool = False,
    ) -> None:
        """Run `func` every `every_s` seconds (first at start when `run_now`).

        `guards_overlap`: `func` itself refuses to run twice at once, so the scheduler may
        start it while a run is still finishing. A `run_now` that lands in the moment between
        a run's last check and its end then still runs, instead of being dropped as a second
        instance (how a wake-up could wait a whole interval).
        """
        kwargs: dict[str, object] = {"next_run_time": datetime.now(UTC)} if run_now else {}
        if guards_overlap:
            kwargs["max_instances"] = 3
        self._scheduler.add_job(
            self._guarded(name, func),
            "interval",
            seconds=every_s,
            id=name,
            name=name,
            replace_existing=True,
            **kwargs,
        )
        self.names.append(name)

    def run_now(self, name: str) -> None:
        """Move a loop's next run to now (it still never overlaps a run in progress); nothing
        once the scheduler is stopping."""
        if self._stopping:
            return
        try:
            self._scheduler.modify_job(name, next_run_time=datetime.now(UTC))
        except Exception:  # stopped, or the job is gone: nothing to wake
            log.debug("could not wake loop %s", name, exc_info=True)

    def _guarded(self, name: str, func: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            started = time.perf_counter()
            outcome = "ok"
            with self._busy:
                self._in_flight += 1
            try:
                func()
            except Exception:
                outcome = "error"
                log.exception("loop %s failed; it runs again at its next tick", name)
            finally:
                with self._busy:
                    self._in_flight -= 1
                    self._busy.notify_all()
                if self.metrics is not None:
                    self.metrics.loop_duration.labels(name).observe(time.perf_counter() - started)
                    self.metrics.loop_runs.labels(name, outcome).inc()
                    if outcome == "ok":
                        self.metrics.loop_last_success.labels(name).set(self.clock().timestamp())

        run.__name__ = f"loop_{name.replace(':', '_')}"
        return run

    @property
    def running(self) -> bool:
        return bool(self._scheduler.running)

    def start(self) -> None:
        self._scheduler.start()

    def shutdown(self, *, wait: bool = True) -> None:
        """Stop scheduling; with `wait`, let every loop finish its current iteration.

        The wait happens here, after APScheduler has let go of its locks: waiting inside its
        shutdown deadlocked when a finishing loop woke another one (run_now) meanwhile."""
        self._stopping = True
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)
        if wait:
            with self._busy:
                self._busy.wait_for(lambda: self._in_flight == 0)
