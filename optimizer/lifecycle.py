"""A managed job's lifecycle words: the job's states, its attempts' states and why an attempt
ended, with the sets every layer asks about (ended or live, a failure, a handover).

The store keeps these as their text (`StrEnum`: each member is its string, so it compares,
hashes and serialises as that string); the state machine (`optimizer.jobs.machine`) is the
only writer of job states.
"""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    """Where a managed job is (docs/jobs.md draws the machine)."""

    PENDING = "pending"
    PROVISIONING = "provisioning"
    PROBING = "probing"
    RUNNING = "running"
    INTERRUPTED = "interrupted"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    STOPPED = "stopped"


# The states after which nothing happens to a job: the store keeps them off the live queries
# and never cancels such a job.
TERMINAL_JOB_STATES: frozenset[JobState] = frozenset(
    {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.STOPPED}
)
LIVE_JOB_STATES: frozenset[JobState] = frozenset(JobState) - TERMINAL_JOB_STATES


class AttemptState(StrEnum):
    """Where one attempt (one placement of a job) is."""

    LAUNCHING = "launching"  # its row is written; the launch call may not have been made
    LAUNCHED = "launched"  # the provider started (or handed back) its instance
    ENDED = "ended"  # over; its end reason says why


class Failure(StrEnum):
    """Why an attempt ended without the job finishing, as a recovery strategy counts it
    (also the attempt's end reason)."""

    PREEMPTED = "preempted"  # the cloud took the instance back (or gave notice)
    PROBE_FAILED = "probe_failed"  # the GPU probe failed on the instance
    LOST = "lost"  # the instance ended with no exit from the job
    NOT_REGISTERED = "not_registered"  # the agent never checked in


class AttemptEnd(StrEnum):
    """Why an attempt ended: its `end_reason` (a launch error's text may also stand there)."""

    # the job's own end
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"  # a rule of its policy or spec stopped it
    USER = "user"  # cancelled
    # a failure (Failure's, which the recovery strategy counts)
    PREEMPTED = Failure.PREEMPTED.value
    PROBE_FAILED = Failure.PROBE_FAILED.value
    LOST = Failure.LOST.value
    NOT_REGISTERED = Failure.NOT_REGISTERED.value
    # a move
    MIGRATED = "migrated"  # gpuopt moved its job away from it
    MOVE_ABANDONED = "move_abandoned"  # the move's new attempt, given up before it took over
    # the job finished on an earlier attempt during its handover: this one never needed to run
    FINISHED_EARLIER = "finished_earlier"
    # a warm spare that never took the job over: the job ended, or no longer wants one
    SPARE_RELEASED = "spare_released"
    # the launch walk: the launch did not give an instance
    GANG_INCOMPLETE = "gang_incomplete"
    PROVIDER_UNAVAILABLE = "provider unavailable"
    OFFER_GONE = "offer gone"
    LAUNCH_ERROR = "launch_error"
    CAPACITY = "capacity"
    QUOTA = "quota"
    AUTH = "auth"


# The ends a recovery strategy counts as failures.
FAILURES: frozenset[AttemptEnd] = frozenset(AttemptEnd(f.value) for f in Failure)
# The ends that leave the job running on its instance while the next attempt boots.
HANDED_OVER: frozenset[AttemptEnd] = frozenset({AttemptEnd.PREEMPTED, AttemptEnd.MIGRATED})


__all__ = [
    "FAILURES",
    "HANDED_OVER",
    "LIVE_JOB_STATES",
    "TERMINAL_JOB_STATES",
    "AttemptEnd",
    "AttemptState",
    "Failure",
    "JobState",
]
