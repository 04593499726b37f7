"""/jobs: submit, list, show and cancel managed jobs. Submitting stores the job as
`pending`; the reconcile loop runs it. Cancelling records a request on the job; the reconcile
loop decides it (terminates the job's instance, moves the job to `cancelled`): the state
machine is the only writer of job states. Submit and cancel wake the reconcile loop."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, status

from optimizer.api.state import MAX_ID, MIN_ID, ApiState, StateDep, utc_text
from optimizer.jobs.machine import JobState
from optimizer.jobs.spec import JobSpec
from optimizer.model import EventKind
from optimizer.store import DuplicateJobError, JobRecord
from optimizer.store.tables import TERMINAL_JOB_STATES

router = APIRouter(prefix="/jobs", tags=["jobs"])


def job_view(job: JobRecord) -> dict[str, Any]:
    return {
        "id": job.id,
        "name": job.name,
        "policy": job.policy,
        "state": job.state,
        "reason": job.reason,
        "restarts": job.restarts,
        "created_at": utc_text(job.created_at),
        "updated_at": utc_text(job.updated_at),
        "cancel_requested_at": (
            None if job.cancel_requested_at is None else utc_text(job.cancel_requested_at)
        ),
        "spec": job.spec,
    }


def _job(state: ApiState, name: str) -> JobRecord:
    job = state.store.jobs.get_job(name)
    if job is None:
        raise HTTPException(404, detail=f"no job named {name!r}")
    return job


@router.get("")
def list_jobs(
    state: StateDep,
    job_state: Annotated[JobState | None, Query(alias="state")] = None,
    before: Annotated[
        int | None, Query(ge=MIN_ID, le=MAX_ID, description="Only jobs with an id below this.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    """Jobs newest first."""
    jobs = state.store.jobs.jobs_page(
        state=job_state.value if job_state else None, before_id=before, limit=limit
    )
    return {"jobs": [job_view(j) for j in jobs]}


@router.post("", status_code=status.HTTP_201_CREATED)
def submit_job(spec: JobSpec, state: StateDep) -> dict[str, Any]:
    """Store a job to run under a loaded policy (409 if the name is taken)."""
    if state.policies.get(spec.policy) is None:
        known = ", ".join(sorted(state.policies.snapshot())) or "none"
        raise HTTPException(
            422,
            detail=[
                {
                    "loc": ["body", "policy"],
                    "msg": f"no policy named {spec.policy!r} is loaded (loaded: {known})",
                    "type": "value_error",
                }
            ],
        )
    body = spec.model_dump(mode="json", exclude={"api_version", "kind", "name", "policy"})
    event = state.emitter.draft(
        EventKind.JOB_SUBMITTED,
        f"job {spec.name} submitted under policy {spec.policy}",
        policy=spec.policy,
        data={"job": spec.name},
    )
    try:
        state.store.jobs.add_job(spec.name, spec.policy, body, event=event)
    except DuplicateJobError as exc:
        raise HTTPException(409, detail=str(exc)) from None
    state.wakeup.set()
    return job_view(_job(state, spec.name))


@router.get("/{name}")
def show_job(name: str, state: StateDep) -> dict[str, Any]:
    return job_view(_job(state, name))


@router.post("/{name}/cancel")
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
    return job_view(job)
