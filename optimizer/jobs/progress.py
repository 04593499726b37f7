"""A job's progress (docs/progress.md): how far it has got, how fast it goes per attempt and
per instance type, and when it will be done at that speed.

The agents forward what the job appends to `$GPUOPT_PROGRESS_FILE`; `record_progress` folds
each report into its attempt's row (the first report and the newest, `store.progress`).
`job_progress` reads them back:

- an attempt's speed is (newest step - first step) / (newest time - first time), in steps per
  hour: measured from the attempt's first report, so the time its instance spent starting,
  probing and restoring before the job's first step does not count; an attempt whose reports
  span less than MIN_SPAN_S has no speed yet;
- per instance type, the steps over the hours of every attempt measured on it;
- the speed in force is the current attempt's, else its type's from earlier attempts, else the
  last attempt's that was measured;
- the ETA: the work left (total - step) at that speed, from the newest report while its
  attempt runs, from now while the job waits for its next attempt (its start-up not counted);
  none once the job has ended short of its total, or without a total or a speed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from optimizer.clock import utc_text
from optimizer.jobs.checkpoint_reports import report_time
from optimizer.lifecycle import TERMINAL_JOB_STATES
from optimizer.protocol import PROGRESS_EVENT
from optimizer.store import JobRecord, ProgressRecord, Store
from optimizer.store.jobs import AttemptRecord

MIN_SPAN_S = 5.0  # reports closer together than this give no speed (a few agent polls)


@dataclass(frozen=True, slots=True)
class JobProgress:
    """A job's progress (module docstring)."""

    step: int  # the newest report's
    total: int | None
    at: datetime
    steps_per_hour: float | None  # the current (or last) attempt's speed
    instance_type: str | None  # where that speed was measured
    by_type: Mapping[str, float] = field(default_factory=dict)  # steps/h per instance type
    eta: datetime | None = None  # at the current speed

    def work_left_fraction(self) -> float | None:
        """(total - step) / total; None without a total."""
        if self.total is None:
            return None
        return max(self.total - self.step, 0) / self.total

    def to_dict(self) -> dict[str, Any]:
        """The API's `progress` object (docs/progress.md)."""
        left = self.work_left_fraction()
        return {
            "step": self.step,
            "total": self.total,
            "at": utc_text(self.at),
            "fraction_done": None if left is None else 1 - left,
            "steps_per_hour": self.steps_per_hour,
            "instance_type": self.instance_type,
            "by_type": dict(self.by_type),
            "eta": None if self.eta is None else utc_text(self.eta),
        }


def attempt_speed(record: ProgressRecord) -> float | None:
    """The attempt's steps per hour since its first report; None under MIN_SPAN_S."""
    seconds = (record.at - record.first_at).total_seconds()
    if seconds < MIN_SPAN_S:
        return None
    return (record.step - record.first_step) * 3600 / seconds


def speeds_by_type(records: Iterable[ProgressRecord]) -> dict[str, float]:
    """Steps per hour per instance type: every measured attempt's steps over their hours."""
    steps: dict[str, int] = {}
    seconds: dict[str, float] = {}
    for r in records:
        if attempt_speed(r) is None:
            continue
        steps[r.instance_type] = steps.get(r.instance_type, 0) + r.step - r.first_step
        seconds[r.instance_type] = (
            seconds.get(r.instance_type, 0.0) + (r.at - r.first_at).total_seconds()
        )
    return {t: steps[t] * 3600 / seconds[t] for t in sorted(steps)}


def progress_of(
    records: Sequence[ProgressRecord],
    now: datetime,
    *,
    running: bool,
    ended: bool,
) -> JobProgress | None:
    """The job's progress from its attempts' rows (module docstring); None without any.
    `running`: the attempt of the newest report still runs; `ended`: the job has ended."""
    if not records:
        return None
    newest = max(records, key=lambda r: (r.at, r.attempt_id))
    total = newest.total
    if total is None:  # the newest report may leave it out: the last total given holds
        given = [r for r in records if r.total is not None]
        total = max(given, key=lambda r: r.at).total if given else None
    by_type = speeds_by_type(records)
    speed, kind = attempt_speed(newest), newest.instance_type
    if speed is None:
        speed = by_type.get(newest.instance_type)
    if speed is None:
        measured = [r for r in records if attempt_speed(r) is not None]
        if measured:
            last = max(measured, key=lambda r: (r.at, r.attempt_id))
            speed, kind = attempt_speed(last), last.instance_type
    return JobProgress(
        step=newest.step,
        total=total,
        at=newest.at,
        steps_per_hour=speed,
        instance_type=kind if speed is not None else None,
        by_type=by_type,
        eta=_eta(newest.step, total, newest.at, speed, now, running=running, ended=ended),
    )


def _eta(
    step: int,
    total: int | None,
    at: datetime,
    speed: float | None,
    now: datetime,
    *,
    running: bool,
    ended: bool,
) -> datetime | None:
    if total is None:
        return None
    left = total - step
    if left <= 0:
        return at  # done at its newest report
    if ended or speed is None or speed <= 0:
        return None
    start = at if running else now
    return max(start + timedelta(hours=left / speed), now)


def job_progress(store: Store, job: JobRecord | int, now: datetime) -> JobProgress | None:
    """The job's progress (module docstring); None before any report. `job`: its record or
    id."""
    record = store.jobs.get_job_by_id(job) if isinstance(job, int) else job
    if record is None or record.id is None:
        return None
    found = jobs_progress(store, [record], now)
    return found.get(record.id)


def jobs_progress(store: Store, jobs: Iterable[JobRecord], now: datetime) -> dict[int, JobProgress]:
    """`job_progress` for many jobs in a few queries (a list's); jobs without reports are
    left out."""
    wanted = {j.id: j for j in jobs if j.id is not None}
    rows = store.progress.of_jobs(wanted)
    attempts = store.jobs.attempts_of(rows) if rows else {}
    out: dict[int, JobProgress] = {}
    for job_id, mine in rows.items():
        live = {a.id for a in attempts.get(job_id, []) if not a.ended}
        newest = max(mine, key=lambda r: (r.at, r.attempt_id))
        found = progress_of(
            mine,
            now,
            running=newest.attempt_id in live,
            ended=wanted[job_id].state in TERMINAL_JOB_STATES,
        )
        if found is not None:
            out[job_id] = found
    return out


def record_progress(
    store: Store,
    attempt: AttemptRecord,
    events: Iterable[Mapping[str, Any]],
    *,
    now: datetime,
) -> None:
    """Fold the attempt's `progress` events (agent events with id, kind, at and data, already
    validated, `protocol.ProgressData`) into its row; the agent's time for each, where it is
    plausible (`checkpoint_reports.report_time`), else now."""
    for event in events:
        if event.get("kind") != PROGRESS_EVENT:
            continue
        data = event.get("data") or {}
        total = data.get("total")
        store.progress.record(
            job_id=attempt.job_id,
            attempt_id=attempt.id,
            instance_type=attempt.instance_type,
            step=int(data["step"]),
            total=None if total is None else int(total),
            at=report_time(event, attempt, now),
        )


__all__ = [
    "MIN_SPAN_S",
    "JobProgress",
    "attempt_speed",
    "job_progress",
    "jobs_progress",
    "progress_of",
    "record_progress",
    "speeds_by_type",
]
