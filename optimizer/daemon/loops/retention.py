"""The retention loop: age price history from raw points to hourly summaries to nothing, jobs'
GPU telemetry from per-minute to hourly spans to nothing, and delete the output of jobs that
ended more than `logs.retention_days` ago.

Leader only, like every writer. A pass works through the pools in bounded batches
(`Prices.prune_history`, one transaction each), so a large backlog never holds a long lock;
between batches it checks that the daemon is not stopping and that this replica still leads,
and otherwise ends the pass early (the next pass picks up where the data says: a batch
leaves nothing half done). Every batch of a pass uses the time the pass started. Job logs go
the same way (`Logs.prune`, at most `log_batch` chunks a transaction), after the prices, and
GPU telemetry (`Telemetry.downsample` folds the minutes of hours wholly older than
`telemetry.minute_days` into hourly spans, then `Telemetry.expire` drops spans older than
`telemetry.hourly_days`, each at most `log_batch` rows a transaction). Last, agents' reports
(`Jobs.prune_agent_events`) of attempts that ended more than `agent_events.retention_days`
ago with their instance gone, `log_batch` rows a transaction (each attempt's `job_exited`
stays: the cost ledger reads it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from optimizer.clock import Clock
from optimizer.store import PruneBatch, Retention, Store
from optimizer.store.logs import PRUNE_BATCH

log = logging.getLogger(__name__)

# Pools visited per batch at most: a pass over many pools with a little to do each (the
# hourly steady state) is still many short transactions.
MAX_POOLS_PER_BATCH = 100


@dataclass
class RetentionReport:
    """One pass's totals."""

    batches: int = 0
    pools: int = 0
    summarized: int = 0
    hours: int = 0
    dropped: int = 0
    expired: int = 0
    complete: bool = False  # the pass reached the last pool (not stopped early)
    log_chunks: int = 0  # chunks of job output deleted
    gpu_minutes: int = 0  # per-minute GPU spans folded into hourly ones
    gpu_hours: int = 0  # hourly GPU spans written or merged into
    gpu_expired: int = 0  # GPU spans past the hourly retention, removed
    agent_events: int = 0  # agents' reports of attempts long ended, deleted
    seconds: float = 0.0

    def add(self, batch: PruneBatch) -> None:
        self.batches += 1
        self.pools += batch.pools
        self.summarized += batch.summarized
        self.hours += batch.hours
        self.dropped += batch.dropped
        self.expired += batch.expired


class RetentionLoop:
    """Prunes price history to `retention`; `run_once()` is one pass, `stop()` ends a pass
    in progress after its current batch."""

    name = "retention"

    def __init__(
        self,
        store: Store,
        clock: Clock,
        retention: Retention,
        *,
        batch_rows: int = 5_000,
        log_retention: timedelta | None = None,
        log_batch: int = PRUNE_BATCH,
        telemetry_retention: tuple[timedelta, timedelta] | None = None,
        agent_event_retention: timedelta | None = None,
        leading: Callable[[], bool] = lambda: True,
    ) -> None:
        self.store = store
        self.clock = clock
        self.retention = retention
        self.batch_rows = batch_rows
        self.log_retention = log_retention
        self.log_batch = log_batch
        self.telemetry_retention = telemetry_retention  # (per-minute, hourly) ages
        self.agent_event_retention = agent_event_retention
        self.leading = leading
        self._stopping = threading.Event()

    def stop(self) -> None:
        self._stopping.set()

    def run_once(self) -> RetentionReport:
        report = RetentionReport()
        started = time.perf_counter()
        now = self.clock()
        after = None
        while not self._stopping.is_set() and self.leading():
            batch = self.store.prices.prune_history(
                self.retention,
                now=now,
                after=after,
                max_rows=self.batch_rows,
                max_pools=MAX_POOLS_PER_BATCH,
            )
            report.add(batch)
            if batch.done:
                report.complete = True
                break
            after = batch.after
        if self.log_retention is not None:
            ended_before = now - self.log_retention
            while not self._stopping.is_set() and self.leading():
                gone = self.store.logs.prune(ended_before=ended_before, limit=self.log_batch)
                report.log_chunks += gone
                if gone < self.log_batch:
                    break
        if self.telemetry_retention is not None:
            self._telemetry(report, now)
        if self.agent_event_retention is not None:
            ended_before = now - self.agent_event_retention
            while not self._stopping.is_set() and self.leading():
                gone = self.store.jobs.prune_agent_events(
                    ended_before=ended_before, limit=self.log_batch
                )
                report.agent_events += gone
                if gone < self.log_batch:
                    break
        report.seconds = time.perf_counter() - started
        if report.summarized or report.dropped or report.expired:
            log.info(
                "price history: %d raw points summarized into %d hourly rows, %d raw points "
                "and %d hourly rows past retention removed (%d batches, %.1f s%s)",
                report.summarized,
                report.hours,
                report.dropped,
                report.expired,
                report.batches,
                report.seconds,
                "" if report.complete else "; stopped early, the next pass goes on",
            )
        if report.gpu_minutes or report.gpu_expired:
            log.info(
                "GPU telemetry: %d minute span(s) folded into %d hourly span(s), %d span(s) "
                "past retention removed",
                report.gpu_minutes,
                report.gpu_hours,
                report.gpu_expired,
            )
        if report.log_chunks:
            log.info(
                "job logs: %d chunk(s) of jobs that ended over %s ago deleted",
                report.log_chunks,
                self.log_retention,
            )
        if report.agent_events:
            log.info(
                "agent events: %d report(s) of attempts that ended over %s ago deleted",
                report.agent_events,
                self.agent_event_retention,
            )
        return report

    def _telemetry(self, report: RetentionReport, now: datetime) -> None:
        assert self.telemetry_retention is not None
        minutes, hourly = self.telemetry_retention
        while not self._stopping.is_set() and self.leading():
            done = self.store.telemetry.downsample(before=now - minutes, limit=self.log_batch)
            report.gpu_minutes += done.minutes
            report.gpu_hours += done.hours
            if done.minutes < self.log_batch:
                break
        while not self._stopping.is_set() and self.leading():
            gone = self.store.telemetry.expire(before=now - hourly, limit=self.log_batch)
            report.gpu_expired += gone
            if gone < self.log_batch:
                break
