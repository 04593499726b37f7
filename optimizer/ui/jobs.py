"""What the jobs list and a job's page show: each job's placement, restarts and spend; a
job's attempts with their cost lines, its timeline, probe results, GPU telemetry and events."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from markupsafe import Markup

from optimizer.answers import AttemptView, DeadlineView, GpuView
from optimizer.api.costs import job_attempts
from optimizer.api.jobs import gpu_view
from optimizer.api.logs import LogStream
from optimizer.api.state import ApiState
from optimizer.common.units import size_text
from optimizer.costs import GroupBy, Line
from optimizer.jobs.deadlines import deadline_view
from optimizer.jobs.ledger import Ledger, state_lines_for
from optimizer.jobs.progress import JobProgress, job_progress, jobs_progress
from optimizer.jobs.ranking import job_state
from optimizer.jobs.spec import JobSpec, job_spec
from optimizer.lifecycle import TERMINAL_JOB_STATES
from optimizer.store import CheckpointRecord, EventRecord, JobRecord
from optimizer.store.costs import LineFilter
from optimizer.store.jobs import AttemptRecord
from optimizer.store.probes import ProbeRecord
from optimizer.ui import timeline
from policies.egress import egress_by_path

LIST_LIMIT = 200
EVENTS = 50
TAIL_LINES = 200
TELEMETRY_POINTS = 2000
PROBES_SCANNED = 500


@dataclass(frozen=True, slots=True)
class JobRow:
    job: JobRecord
    attempt: AttemptRecord | None
    spend_usd: float | None
    progress: JobProgress | None = None

    @property
    def placement(self) -> str:
        a = self.attempt
        if a is None:
            return "\u2013"
        return f"{a.provider} {a.zone or a.region} {a.instance_type} {a.market}"


@dataclass(frozen=True, slots=True)
class JobPage:
    now: datetime
    job: JobRecord
    attempts: list[AttemptRecord]
    costs: list[AttemptView]  # GET /jobs/{name}'s attempts, each with its cost lines
    timeline: Markup
    probes: list[ProbeRecord]
    gpu: GpuView | None  # GET /jobs/{name}'s `gpu`
    events: list[EventRecord]
    checkpoints: list[CheckpointRecord]  # newest first, pruned ones too
    restored_by: dict[str, list[int]]  # checkpoint name -> attempt numbers that restored it
    state_lines: list[Line]  # the checkpoints at rest and the restores' egress, priced
    move: str | None  # what moving the job's state to another region would take, in words
    progress: JobProgress | None = None  # docs/progress.md
    deadline: DeadlineView | None = None  # docs/deadlines.md, "In the daemon"

    @property
    def state_usd(self) -> float:
        return sum(line.cost.total_usd for line in self.state_lines)

    @property
    def spec(self) -> JobSpec:
        return job_spec(self.job)

    @property
    def ended(self) -> bool:
        return self.job.state in TERMINAL_JOB_STATES

    @property
    def can_cancel(self) -> bool:
        return not self.ended and self.job.cancel_requested_at is None

    @property
    def spend_usd(self) -> float:
        """The instances' cost: "spend" everywhere (the CLI, the API, the overview), what the
        on-demand baseline and the savings compare with."""
        return sum(line.spend_usd for a in self.costs for line in a.cost_lines)

    @property
    def total_usd(self) -> float:
        """Everything billed: the instances, their root volumes, the checkpoints at rest and
        the restores' egress."""
        compute = sum(line.total_usd for a in self.costs for line in a.cost_lines)
        return compute + self.state_usd


def _gpu(state: ApiState, job: JobRecord) -> GpuView | None:
    found = gpu_view(state.store.telemetry.summary(job_id=job.id))
    return None if found is None else GpuView.model_validate(found)


def job_rows(state: ApiState, job_state: str | None = None) -> list[JobRow]:
    jobs = state.store.jobs.jobs_page(state=job_state, limit=LIST_LIMIT)
    attempts = state.store.jobs.attempts_of(j.id for j in jobs)
    spend = {t.key: t.cost.spend_usd for t in Ledger(state.store, state.clock).groups(GroupBy.JOB)}
    progress = jobs_progress(state.store, jobs, state.clock())
    out = []
    for j in jobs:
        mine = attempts.get(j.id)
        out.append(JobRow(j, mine[-1] if mine else None, spend.get(j.name), progress.get(j.id)))
    return out


def job_page(state: ApiState, job: JobRecord) -> JobPage:
    now = state.clock()
    attempts = state.store.jobs.attempts(job.id)
    probes = [p for p in state.store.probes.page(limit=PROBES_SCANNED) if p.job_id == job.id]
    return JobPage(
        now=now,
        job=job,
        attempts=attempts,
        costs=[AttemptView.model_validate(a) for a in job_attempts(state, job.id)],
        timeline=timeline.svg(attempts, now, state.store.costs.exits([a.key for a in attempts])),
        probes=probes,
        gpu=_gpu(state, job),
        events=state.store.events.list_events(job_id=job.id, limit=EVENTS),
        **_state(state, job, attempts, now),
        progress=job_progress(state.store, job, now),
        deadline=_deadline(state, job, now),
    )


def _deadline(state: ApiState, job: JobRecord, now: datetime) -> DeadlineView | None:
    loaded = state.policies.for_job(job)
    found = deadline_view(state.store, job, None if loaded is None else loaded.policy, now)
    return None if found is None else DeadlineView.model_validate(found)


def _state(
    state: ApiState, job: JobRecord, attempts: list[AttemptRecord], now: datetime
) -> dict[str, Any]:
    """The job's state in its bucket: checkpoints, who restored them, their cost so far and
    what a move of the newest across regions would take (the ranking's own words)."""
    numbers = {a.id: a.number for a in attempts}
    restored: dict[str, list[int]] = {}
    for r in state.store.checkpoints.restores(job.id):
        restored.setdefault(r.checkpoint_name, []).append(numbers.get(r.attempt_id, 0))
    place = job_state(state.store, job, now)
    move = None
    if place is not None and place.size_bytes > 0:
        paths = egress_by_path(place.provider, place.region, place.size_bytes)
        move = (
            f"{size_text(place.size_bytes)} in {place.provider} {place.region}; moving it costs "
            + ", ".join(f"${usd:.2f} ({path})" for path, usd in paths.items())
            + " in egress, and its restore's time at the new instance's price"
        )
    return {
        "checkpoints": state.store.checkpoints.checkpoints(job.id),
        "restored_by": restored,
        "state_lines": state_lines_for(state.store, LineFilter(job_id=job.id), now),
        "move": move,
    }


def utilization(state: ApiState, job: JobRecord) -> dict[str, list[Any]]:
    """The job's GPU spans as uPlot's columns: start (epoch s), utilization and memory used
    (percent), and which attempt each span belongs to."""
    numbers = {a.id: a.number for a in state.store.jobs.attempts(job.id)}
    spans = state.store.telemetry.samples(job_id=job.id, limit=TELEMETRY_POINTS)
    return {
        "t": [s.start.timestamp() for s in spans],
        "util": [None if s.util_mean is None else round(s.util_mean * 100, 2) for s in spans],
        "memory": [
            None if s.memory_used_ratio is None else round(s.memory_used_ratio * 100, 2)
            for s in spans
        ],
        "attempt": [numbers.get(s.attempt_id) for s in spans],
        "simulated": [s.simulated for s in spans],
    }


def logs_tail(state: ApiState, job: JobRecord, lines: int = TAIL_LINES) -> str:
    """The last `lines` lines of the job's output, under their attempts' headers (what
    `gpuopt jobs logs NAME --tail N` prints)."""
    stream = LogStream(state.store, job.id, tail=lines)
    out = []
    while (text := stream.step()) is not None:
        out.append(text)
    return "".join(out)
