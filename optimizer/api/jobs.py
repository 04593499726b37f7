"""/jobs: submit, list, show, cancel and remove managed jobs. Submitting stores the job as
`pending`; the reconcile loop runs it. Cancelling records a request on the job; the reconcile
loop decides it (terminates the job's instance, moves the job to `cancelled`): the state
machine is the only writer of job states. Submit and cancel wake the reconcile loop.
Removing takes an ended job off the lists and frees its name; its row, attempts and events
stay under its id."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, status

from optimizer import answers
from optimizer.api.costs import job_attempts
from optimizer.api.params import Id, Page
from optimizer.api.plan import effective_policy
from optimizer.api.state import ApiState, StateDep, utc_text
from optimizer.code import CodeError
from optimizer.daemon.policies import POLICY_DOCUMENT
from optimizer.jobs.advice import job_advice
from optimizer.jobs.deadlines import deadline_view
from optimizer.jobs.gang import head_number
from optimizer.jobs.progress import JobProgress, job_progress, jobs_progress
from optimizer.jobs.spec import JobSpec, bucket_provider, stored_form
from optimizer.jobs.state import BucketRefused, BucketUnreachable
from optimizer.lifecycle import TERMINAL_JOB_STATES, JobState
from optimizer.model import EventKind
from optimizer.store import (
    CheckpointRecord,
    DuplicateJobError,
    JobNotEndedError,
    JobRecord,
    RestoreRecord,
)
from optimizer.store.telemetry import GpuSummary
from policies.egress import residency_problem
from policies.inline import document
from policies.schema import Policy

router = APIRouter(prefix="/jobs", tags=["jobs"])


def job_view(job: JobRecord, progress: JobProgress | None = None) -> dict[str, Any]:
    """The API's job object; `progress` as `optimizer.jobs.progress` works it out (null
    before the job reported any, docs/progress.md)."""
    return {
        "id": job.id,
        "name": job.given_name,
        "policy": job.policy,
        "state": job.state,
        "reason": job.reason,
        "restarts": job.restarts,
        "created_at": utc_text(job.created_at),
        "updated_at": utc_text(job.updated_at),
        "cancel_requested_at": (
            None if job.cancel_requested_at is None else utc_text(job.cancel_requested_at)
        ),
        "removed_at": None if job.removed_at is None else utc_text(job.removed_at),
        "spec": {k: v for k, v in job.spec.items() if k != POLICY_DOCUMENT},
        "progress": None if progress is None else progress.to_dict(),
    }


def _view(state: ApiState, job: JobRecord) -> dict[str, Any]:
    """The job object with its progress now."""
    return job_view(job, job_progress(state.store, job, state.clock()))


def _detail_view(state: ApiState, job: JobRecord) -> dict[str, Any]:
    """The job object with its progress and its effective policy (null when not loaded)."""
    loaded = state.policies.for_job(job)
    return {
        **_view(state, job),
        "effective_policy": None if loaded is None else document(loaded.policy),
    }


def _job(state: ApiState, name: str) -> JobRecord:
    job = state.store.jobs.get_job(name)
    if job is None:
        raise HTTPException(404, detail=f"no job named {name!r}")
    return job


@router.get("", response_model=answers.JobList)
def list_jobs(
    state: StateDep,
    job_state: Annotated[JobState | None, Query(alias="state")] = None,
    before: Annotated[Id | None, Query(description="Only jobs with an id below this.")] = None,
    limit: Annotated[Page, Query()] = 100,
) -> dict[str, Any]:
    """Jobs newest first."""
    jobs = state.store.jobs.jobs_page(
        state=job_state.value if job_state else None, before_id=before, limit=limit
    )
    found = jobs_progress(state.store, jobs, state.clock())
    return {"jobs": [job_view(j, found.get(j.id)) for j in jobs]}


@router.post("", status_code=status.HTTP_201_CREATED, response_model=answers.JobView)
def submit_job(spec: JobSpec, state: StateDep) -> dict[str, Any]:
    """Store a job to run under a loaded policy, or under its own: its inline `resources`
    over the policy it names or the daemon's default (optimizer/api/plan.py); 409 if the
    name is taken. The answer carries the job's effective policy."""
    name, policy, base = effective_policy(state, spec)
    inline = spec.inline
    spec, unknown = _with_region(state, spec)
    spec = spec.model_copy(update={"policy": name})
    _check_residency(spec, policy)
    if spec.code is not None and state.code is not None and not _holds(state, spec.code.sha256):
        raise HTTPException(
            422,
            detail=[
                {
                    "loc": ["body", "code", "sha256"],
                    "msg": f"the daemon holds no code archive sha256:{spec.code.sha256}: "
                    "upload it first (PUT /code/{sha256}; `gpuopt jobs submit` does)",
                    "type": "value_error",
                }
            ],
        )
    body = stored_form(spec)
    if inline:
        body[POLICY_DOCUMENT] = document(policy)
    assert spec.policy is not None
    event = state.emitter.draft(
        EventKind.JOB_SUBMITTED,
        f"job {spec.name} submitted under policy {spec.policy}"
        + (f" (inline resources over policy {base})" if inline else ""),
        policy=spec.policy,
        data={"job": spec.name, **({"base_policy": base} if inline else {})},
    )
    try:
        job_id = state.store.jobs.add_job(spec.name, spec.policy, body, event=event)
    except DuplicateJobError as exc:
        raise HTTPException(409, detail=_taken(exc)) from None
    if unknown is not None:
        state.store.events.record_event(
            state.emitter.draft(
                EventKind.JOB_WARNING,
                f"job {spec.name}: the region of its checkpoint bucket is unknown: {unknown}",
                severity="warning",
                policy=spec.policy,
                job_id=job_id,
                data={"job": spec.name, "field": "checkpoint.uri", "reason": unknown},
            )
        )
    state.wakeup.set()
    return _detail_view(state, _job(state, spec.name))


def _check_residency(spec: JobSpec, policy: Policy | None) -> None:
    """Data residency is compliance: a job whose policy keeps it to a region preset (`eu`,
    alias `gdpr`, ...) may not keep its checkpoints in a bucket outside it, nor outside the
    policy's `data.regions.allow`; a 422 naming `checkpoint.uri` otherwise. A bucket whose
    region is unknown is not judged (its job got a warning)."""
    bucket = spec.checkpoint
    if policy is None or bucket is None or not bucket.region:
        return
    provider = bucket_provider(bucket.uri)
    problem = residency_problem(policy.placement.compliance, provider, bucket.region)
    if problem is None and not policy.data.regions.allows(bucket.region):
        problem = f"region {bucket.region} is not in the policy's data.regions.allow"
    if problem is None:
        return
    raise HTTPException(
        422,
        detail=[
            {
                "loc": ["body", "checkpoint", "uri"],
                "msg": f"the checkpoint bucket {bucket.uri} ({provider} {bucket.region}) "
                f"breaks policy {spec.policy}'s data residency: {problem}",
                "type": "value_error",
            }
        ],
    )


def _with_region(state: ApiState, spec: JobSpec) -> tuple[JobSpec, str | None]:
    """The spec with its checkpoint bucket's region filled in from the storage API where it
    names none, and why the region stays unknown (None: it does not). A bucket that is
    missing or refuses access is a 422 naming `checkpoint.uri`; one the daemon cannot reach
    leaves the region unknown (optimizer/jobs/state.py)."""
    bucket = spec.checkpoint
    if bucket is None or bucket.region is not None:
        return spec, None
    try:
        region = state.bucket_region(bucket.uri)
        region = region.lower() if region else None
    except BucketRefused as exc:
        raise HTTPException(
            422,
            detail=[
                {
                    "loc": ["body", "checkpoint", "uri"],
                    "msg": f"the checkpoint bucket cannot be used: {exc}",
                    "type": "value_error",
                }
            ],
        ) from None
    except BucketUnreachable as exc:
        return spec, str(exc)
    if region is None:
        return spec, None
    return spec.model_copy(
        update={"checkpoint": bucket.model_copy(update={"region": region})}
    ), None


def _holds(state: ApiState, sha256: str) -> bool:
    """Whether the daemon holds the code archive (503 while its bucket cannot say)."""
    assert state.code is not None
    try:
        return state.code.has(sha256)
    except CodeError as exc:
        raise HTTPException(503, detail=f"the code store cannot be used: {exc}") from None


def _taken(exc: DuplicateJobError) -> str:
    """The 409 for a name in use, with the ways out."""
    other = "submit it under another name (`gpuopt jobs submit FILE --name NEW`)"
    if exc.state in TERMINAL_JOB_STATES:
        return f"{exc}: {other}, or remove the ended job first (`gpuopt jobs rm {exc.name}`)"
    return (
        f"{exc}: {other}, or cancel it (`gpuopt jobs cancel {exc.name}`) and remove it "
        f"once it has ended (`gpuopt jobs rm {exc.name}`)"
    )


@router.get("/{name}", response_model=answers.JobDetail)
def show_job(name: str, state: StateDep) -> dict[str, Any]:
    """The job, and its attempts each with its cost lines (docs/costs.md)."""
    job = _job(state, name)
    loaded = state.policies.for_job(job)
    return {
        **_detail_view(state, job),
        "attempts": job_attempts(state, job.id),
        "gpu": gpu_view(state.store.telemetry.summary(job_id=job.id)),
        "deadline": deadline_view(
            state.store, job, None if loaded is None else loaded.policy, state.clock()
        ),
    }


def gpu_view(summary: GpuSummary | None) -> dict[str, Any] | None:
    """A job's GPU telemetry (docs/api.md): current and average utilization, peak memory;
    None before its agent reported any."""
    if summary is None:
        return None
    return {
        "current_utilization": summary.current_util,
        "current_at": utc_text(summary.current_at),
        "average_utilization": summary.average_util,
        "current_memory_used_gib": summary.current_memory_used_gib,
        "peak_memory_used_gib": summary.peak_memory_used_gib,
        "memory_total_gib": summary.memory_total_gib,
        "peak_memory_used_ratio": summary.peak_memory_used_ratio,
        "since": utc_text(summary.first_at),
        "samples": summary.samples,
        "attempt_id": summary.attempt_id,
        "throttle_reasons": summary.throttle_reasons,
        "xids": list(summary.xids),
        "simulated": summary.simulated,
    }


@router.get("/{name}/checkpoints", response_model=answers.CheckpointList)
def job_checkpoints(name: str, state: StateDep) -> dict[str, Any]:
    """The checkpoints the job's attempts uploaded to its bucket, newest first, pruned ones
    too (`deleted`), each with the attempts that restored it (`restored_by`, by number)."""
    job = _job(state, name)
    numbers = {a.id: head_number(a.number, a.gang) for a in state.store.jobs.attempts(job.id)}
    found = state.store.checkpoints.checkpoints(job.id)
    by = restorers(found, state.store.checkpoints.restores(job.id))
    return {
        "job": job.given_name,
        "checkpoints": [
            {
                "name": c.name,
                "step": c.step,
                "size_bytes": c.size_bytes,
                "uri": c.uri,
                "region": c.region,
                "committed_at": utc_text(c.committed_at),
                "attempt": numbers.get(c.attempt_id, 0),
                "final": c.final,
                "deleted": c.deleted_at is not None,
                "deleted_at": utc_text(c.deleted_at),
                "restored_by": sorted({numbers.get(a, 0) for a in by.get(c.id, [])}),
            }
            for c in found
        ],
    }


def restorers(
    checkpoints: list[CheckpointRecord], restores: list[RestoreRecord]
) -> dict[int, list[int]]:
    """Which attempts (ids) restored each checkpoint (by id): a restore names a checkpoint,
    and takes the newest of that name committed by its time (the newest of that name where
    the agents' clocks disagree)."""
    out: dict[int, list[int]] = {}
    for r in restores:
        named = [c for c in checkpoints if c.name == r.checkpoint_name]
        if not named:
            continue
        before = [c for c in named if c.committed_at <= r.at] or named
        chosen = max(before, key=lambda c: (c.committed_at, c.id))
        out.setdefault(chosen.id, []).append(r.attempt_id)
    return out


@router.get("/{name}/advice", response_model=answers.AdviceView)
def advise_job(name: str, state: StateDep) -> dict[str, Any]:
    """Rightsizing advice (docs/advice.md): from the job's measured peak GPU memory x (1 +
    its policy's buffer), utilization and duty cycle, the cheapest offer its policy allows
    that still fits, the saving per month and why; `status` is `cheaper_fit`,
    `no_cheaper_fit` or `no_telemetry`. 409 if the job's policy is not loaded."""
    job = _job(state, name)
    loaded = state.policies.for_job(job)
    if loaded is None:
        raise HTTPException(
            409, detail=f"job {name!r} runs under policy {job.policy!r}, which is not loaded"
        )
    now = state.clock()
    found = job_advice(state.store, job, loaded.policy, now)
    return {**found.to_dict(), "evaluated_at": utc_text(now)}


@router.post("/{name}/cancel", response_model=answers.JobView)
def cancel_job(name: str, state: StateDep) -> dict[str, Any]:
    """Ask for a job that has not ended to be cancelled (409 once it has succeeded, failed or
    been cancelled): the answer is the job in its current state with `cancel_requested_at`
    set; the reconcile loop, woken now, terminates its instance and moves it to `cancelled`."""
    job, _ = state.store.jobs.request_cancel(name)
    if job is None:
        raise HTTPException(404, detail=f"no job named {name!r}")
    if job.state in TERMINAL_JOB_STATES:
        raise HTTPException(409, detail=f"job {name!r} already ended ({job.state})")
    state.wakeup.set()
    return _view(state, job)


@router.delete("/{name}", response_model=answers.JobView)
def remove_job(name: str, state: StateDep) -> dict[str, Any]:
    """Remove an ended job (409 while it has not ended: cancel it first): it leaves the lists
    and its name is free for a new job; its attempts, events and costs stay under its id. The
    answer is the removed job, `removed_at` set; `job.removed` is recorded with it."""
    job = _job(state, name)
    if job.state not in TERMINAL_JOB_STATES:
        raise HTTPException(409, detail=_not_ended(job, job.state))
    # An ended job stays in its state, so the event drafted from this read is the truth;
    # the store's write is still a compare-and-set on the job having ended.
    event = state.emitter.draft(
        EventKind.JOB_REMOVED,
        f"job {name} removed ({job.state})",
        policy=job.policy,
        data={"job": name, "state": job.state},
    )
    try:
        removed = state.store.jobs.remove_job(name, event=event)
    except JobNotEndedError as exc:
        raise HTTPException(409, detail=_not_ended(job, exc.state)) from None
    if removed is None:  # removed by another request since the read
        raise HTTPException(404, detail=f"no job named {name!r}")
    return _view(state, removed)


def _not_ended(job: JobRecord, job_state: str) -> str:
    then = "remove it once it has ended"
    if job.cancel_requested_at is not None:
        step = f"its cancel is under way: {then}"
    else:
        step = f"cancel it first (`gpuopt jobs cancel {job.name}`) and {then}"
    return f"job {job.name!r} is {job_state}: only an ended job can be removed; {step}"
