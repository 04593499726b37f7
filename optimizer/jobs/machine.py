"""The managed-job state machine: pure transitions from what was observed to what to do.

`decide(job, attempt, now=…, strategy=…)` looks at one job and its current attempt, as the
reconcile loop folded them from the store, the agent's events and the provider's describe,
and returns the job's next state with the actions that get it there. Where a job goes after
a failed attempt (which pools to avoid and cool down, which markets, or to give up) is the
recovery strategy's answer (recovery.py). It does no I/O; the reconciler applies the actions
(launch, stop, terminate, cooldown, alert) and records every transition as an event. The
same inputs always give the same answer.

    pending → provisioning → probing → running → succeeded | failed | cancelled | stopped
                  ▲                        │
                  └──── interrupted ◄──────┘   (a preemption, a failed probe, a lost instance)

A job that gpuopt moves to other capacity (migration.py decides which) leaves its attempt as
an interruption does, with the end reason `migrated`: its job keeps running while the next
attempt boots and probes, and `handover.handover` stops it once that one is ready; the fence
(handover.py) keeps the new job from starting until the old one has exited. An old job that
finishes meanwhile (exits 0 before any stop reached it) has done the work: the job succeeds
there, and its replacement never starts it (`finished_on`).

A running job is `stopped` when a rule of its policy or spec says so (utilization.py: a
utilization rule with `action: stop`, or `max_duration`): its job gets SIGTERM to checkpoint,
and its instance is terminated once the job has exited or the stop's grace is over.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from optimizer.jobs.recovery import Failover, GiveUp, Past, Strategy
from optimizer.lifecycle import TERMINAL_JOB_STATES as TERMINAL
from optimizer.lifecycle import AttemptEnd, Failure, JobState
from optimizer.model import EventKind, Market, Pool

REGISTER_TIMEOUT = timedelta(minutes=10)  # how long a launch's agent may take to check in


# The job's states and the attempts' end reasons are the vocabulary's (optimizer/lifecycle.py);
# these two names are kept for the modules that read them here.
MIGRATED = AttemptEnd.MIGRATED
FINISHED_EARLIER = AttemptEnd.FINISHED_EARLIER


@dataclass(frozen=True, slots=True)
class JobView:
    id: int
    name: str
    state: JobState
    restarts: int = 0
    probes: str = "quick"  # quick | deep | none
    cancel_requested: bool = False
    failures: tuple[Past, ...] = ()  # how and when earlier attempts failed
    migrations: int = 0  # restarts that were moves: they do not count toward max_restarts
    finished_on: int | None = None  # an earlier attempt whose job finished (`finished_on`)


@dataclass(frozen=True, slots=True)
class AttemptView:
    """One attempt as observed: launch facts, the agent's reports, the provider's describe."""

    number: int
    key: str
    pool: Pool
    launched_at: datetime
    registered: bool = False
    probe_status: str | None = None  # pass | warn | fail
    job_started: bool = False
    exit_code: int | None = None
    interruption_notice_at: datetime | None = None
    instance_gone: bool = False  # the provider says the instance no longer runs
    preempted: bool = False  # … because the cloud took it back
    stop_sent: bool = False
    power_off_at: datetime | None = None  # when the notice says the instance goes
    instance_launched_at: datetime | None = None  # the provider's launch time, once known
    probe_reason: str = ""  # what failed, where a gang's probe names a node or a link
    migrated: bool = False  # gpuopt ended it to move the job (a hot handover, as a notice)
    finished: bool = False  # its job exited 0 on its own: no stop had reached it (job_exited)
    # Its agent reported the job's final checkpoint committed to the job's bucket (a job with
    # `checkpoint`): the job's last state is safe there, so it no longer holds the fence.
    final_checkpoint: bool = False
    # A failed job's `job_exited` report: the phase that failed (setup, run, code, restore)
    # and its error (stderr's last line), read only for attempts that exited non-zero.
    exit_phase: str | None = None
    exit_error: str | None = None
    # A replacement whose job runs in standby (docs/standby.md): that job has started up and
    # waits for its go (jobs/standby.py); True for any other attempt, which has nothing to wait for.
    standby_ready: bool = True


def exit_text(attempt: AttemptView, code: int) -> str:
    """How a job's non-zero exit is said in its state reason and alert: which phase failed
    and, where the agent sent it, the last line of its stderr ("setup exited 1: No module
    named 'x'"); a job that could not start names why ("code failed: …")."""
    phase = attempt.exit_phase or "run"
    if phase in ("setup", "run"):
        text = f"{'setup' if phase == 'setup' else 'job'} exited {code}"
    else:
        text = f"{phase} failed"
    return f"{text}: {attempt.exit_error}" if attempt.exit_error else text


@dataclass(frozen=True, slots=True)
class Launch:
    """Start the next attempt on the best offer the policy allows, avoiding these pools."""

    avoid: frozenset[Pool] = frozenset()
    markets: tuple[Market, ...] | None = None  # None: the policy's own markets
    only: frozenset[Pool] | None = None  # a move's targets: no other pool (None: any)
    # The job's warm spare (spares.py), launched apart from the running attempt's pool.
    spare: bool = False
    apart_from: Pool | None = None


@dataclass(frozen=True, slots=True)
class Stop:
    """Tell the attempt's agent to send the job SIGTERM so it can checkpoint."""

    key: str
    reason: str


@dataclass(frozen=True, slots=True)
class Terminate:
    key: str
    reason: str


@dataclass(frozen=True, slots=True)
class Cooldown:
    pool: Pool
    until: datetime
    reason: str


@dataclass(frozen=True, slots=True)
class Alert:
    kind: EventKind
    severity: str
    message: str
    data: tuple[tuple[str, Any], ...] = ()  # extra fields for the event's data


@dataclass(frozen=True, slots=True)
class PolicyStop:
    """A rule that says a running job must stop (utilization.watch): its name and why."""

    rule: str  # idle | low | max_duration
    reason: str


Action = Launch | Stop | Terminate | Cooldown | Alert


@dataclass(frozen=True, slots=True)
class Decision:
    state: JobState
    reason: str = ""
    actions: tuple[Action, ...] = ()
    end_attempt: str | None = None  # why the current attempt is over, when it is
    restarts: int | None = None  # the new restart count, when it changes

    @property
    def launches(self) -> bool:
        return any(isinstance(a, Launch) for a in self.actions)


@dataclass(frozen=True, slots=True)
class _Relaunch:
    why: Failure
    alert_kind: EventKind
    message: str
    stop_job: bool = False  # let the job checkpoint instead of killing the instance


def relaunch_reason(
    attempt: AttemptView, now: datetime, register_timeout: timedelta
) -> _Relaunch | None:
    where = Pool(*attempt.pool).label
    if attempt.interruption_notice_at is not None or attempt.preempted:
        return _Relaunch(
            Failure.PREEMPTED,
            EventKind.JOB_INTERRUPTED,
            # An owned machine's notice is the team taking it back (a drain), not a cloud's.
            f"machine taken back on {where}"
            if Pool(*attempt.pool).market == "owned"
            else f"spot capacity reclaimed on {where}",
            stop_job=True,
        )
    if attempt.probe_status == "fail":
        what = attempt.probe_reason or "GPU probe failed"
        return _Relaunch(Failure.PROBE_FAILED, EventKind.JOB_PROBE_FAILED, f"{what} on {where}")
    if attempt.instance_gone and attempt.exit_code is None:
        return _Relaunch(
            Failure.LOST, EventKind.JOB_INSTANCE_LOST, f"instance on {where} ended unexpectedly"
        )
    if not attempt.registered and now - attempt.launched_at > register_timeout:
        minutes = register_timeout.total_seconds() / 60
        return _Relaunch(
            Failure.NOT_REGISTERED,
            EventKind.JOB_LAUNCH_TIMED_OUT,
            f"agent on {where} did not check in within {minutes:g} minutes",
        )
    return None


def _progress(job: JobView, attempt: AttemptView) -> JobState:
    if not attempt.registered:
        return JobState.PROVISIONING
    if attempt.job_started:
        return JobState.RUNNING
    if job.probes != "none":
        return JobState.PROBING
    return JobState.PROVISIONING


def _finished(job: JobView, attempt: AttemptView, code: int) -> Decision:
    if code == 0:
        return Decision(
            JobState.SUCCEEDED,
            "job exited 0",
            (
                Terminate(attempt.key, "job finished"),
                Alert(EventKind.JOB_SUCCEEDED, "info", f"job {job.name} finished"),
            ),
            end_attempt=AttemptEnd.SUCCEEDED,
        )
    said = exit_text(attempt, code)
    return Decision(
        JobState.FAILED,
        said,
        (
            Terminate(attempt.key, "job failed"),
            Alert(EventKind.JOB_FAILED, "error", f"job {job.name}: {said}"),
        ),
        end_attempt=AttemptEnd.FAILED,
    )


def _finished_earlier(job: JobView, attempt: AttemptView | None, number: int) -> Decision:
    """The job finished on attempt `number` while it was handed over: it succeeded, and the
    current attempt (its replacement, fenced) is ended without running it."""
    gone: tuple[Action, ...] = ()
    if attempt is not None and not attempt.instance_gone:
        gone = (Terminate(attempt.key, f"the job finished on attempt {number}"),)
    return Decision(
        JobState.SUCCEEDED,
        f"job exited 0 on attempt {number} during its handover",
        (
            *gone,
            Alert(
                EventKind.JOB_SUCCEEDED,
                "info",
                f"job {job.name} finished on attempt {number}, before its replacement started it",
            ),
        ),
        end_attempt=FINISHED_EARLIER if attempt is not None else None,
    )


def decide(
    job: JobView,
    attempt: AttemptView | None,
    *,
    now: datetime,
    strategy: Strategy | None = None,
    register_timeout: timedelta = REGISTER_TIMEOUT,
    stop: PolicyStop | None = None,
) -> Decision:
    """The job's next state and the actions that get it there (`strategy`: failover).

    `stop`: why a rule (utilization.watch) says the running job must stop; it is stopped
    only while it runs, healthy, on its attempt (an exit, a cancel or a failure wins)."""
    strategy = strategy or Failover()
    if job.state in TERMINAL:
        return Decision(job.state)

    if job.finished_on is not None:
        return _finished_earlier(job, attempt, job.finished_on)

    if job.cancel_requested:
        gone_now: tuple[Action, ...] = ()
        if attempt is not None and not attempt.instance_gone:
            gone_now = (Terminate(attempt.key, "job cancelled"),)
        return Decision(
            JobState.CANCELLED,
            "cancelled by request",
            (
                *gone_now,
                Alert(
                    EventKind.JOB_CANCELLED,
                    "info",
                    f"job {job.name} cancelled (was {job.state.value})",
                ),
            ),
            end_attempt=AttemptEnd.USER if attempt is not None else None,
        )

    if attempt is None:
        look = strategy.while_pending(job.failures, now)
        return Decision(
            JobState.PENDING,
            f"waiting for an offer{look.note}",
            (Launch(avoid=look.avoid, markets=look.markets),),
        )

    # A job that exits after an interruption notice was stopped for it: not a job failure.
    if attempt.exit_code is not None and attempt.interruption_notice_at is None:
        return _finished(job, attempt, attempt.exit_code)

    relaunch = relaunch_reason(attempt, now, register_timeout)
    if relaunch is None:
        state = _progress(job, attempt)
        if stop is not None and state is JobState.RUNNING and attempt.exit_code is None:
            return Decision(
                JobState.STOPPED,
                f"stopped by {stop.rule}: {stop.reason}",
                (
                    Stop(attempt.key, f"stopped by {stop.rule}"),
                    Alert(
                        EventKind.JOB_STOPPED,
                        "warning",
                        f"job {job.name} stopped by {stop.rule}: {stop.reason}",
                        data=(("rule", stop.rule), ("reason", stop.reason)),
                    ),
                ),
                end_attempt=AttemptEnd.STOPPED,
            )
        return Decision(state, f"attempt {attempt.number}: {state.value}")

    restarts = job.restarts + 1
    where = strategy.after_failure(
        relaunch.why,
        attempt.pool,
        restarts=job.restarts - job.migrations,
        history=job.failures,
        now=now,
    )
    if isinstance(where, GiveUp):
        gone: tuple[Action, ...] = ()
        if not attempt.instance_gone:
            gone = (Terminate(attempt.key, where.reason),)
        return Decision(
            JobState.FAILED,
            f"{relaunch.message}; {where.reason}",
            (
                *gone,
                Alert(
                    EventKind.JOB_FAILED,
                    "error",
                    f"job {job.name}: {relaunch.message}; {where.alert}",
                ),
            ),
            end_attempt=relaunch.why.value,
            restarts=restarts,
        )

    # A preempted job keeps running while its replacement boots and probes (a hot handover):
    # `handover.handover` says when it gets SIGTERM to checkpoint, and its instance is
    # terminated once the job has exited (`handover.leftover`). A sick or silent instance is
    # terminated at once.
    ending: list[Action] = []
    if not attempt.instance_gone and not relaunch.stop_job:
        ending.append(Terminate(attempt.key, relaunch.message))

    told = f"{relaunch.message}; relaunching (restart {restarts}){where.note}"
    return Decision(
        JobState.PROVISIONING,
        told,
        (
            *ending,
            *(Cooldown(pool, until, relaunch.message) for pool, until in where.cooldowns),
            Launch(avoid=where.avoid, markets=where.markets),
            Alert(relaunch.alert_kind, "warning", f"job {job.name}: {told}"),
        ),
        end_attempt=relaunch.why.value,
        restarts=restarts,
    )


def unmanageable(job: JobView, attempt: AttemptView | None, why: str) -> Decision:
    """A job whose reconciling raised (a stored spec or a policy the daemon cannot work with,
    `why`): it fails, saying why, or ends cancelled when a cancel was asked, and its instance
    goes either way, so one job that cannot be handled never holds up the others, never runs
    on unwatched and can always be cancelled and removed."""
    if job.state in TERMINAL:
        return Decision(job.state)
    gone: tuple[Action, ...] = ()
    if attempt is not None and not attempt.instance_gone:
        gone = (Terminate(attempt.key, "job could not be reconciled"),)
    if job.cancel_requested:
        return Decision(
            JobState.CANCELLED,
            "cancelled by request",
            (
                *gone,
                Alert(
                    EventKind.JOB_CANCELLED,
                    "info",
                    f"job {job.name} cancelled (was {job.state.value}); it could not be "
                    f"reconciled: {why}",
                ),
            ),
            end_attempt=AttemptEnd.USER if attempt is not None else None,
        )
    reason = f"could not be reconciled: {why}"
    return Decision(
        JobState.FAILED,
        reason,
        (*gone, Alert(EventKind.JOB_FAILED, "error", f"job {job.name} {reason}")),
        end_attempt=AttemptEnd.FAILED if attempt is not None else None,
    )


def finished_on(attempts: Sequence[AttemptView]) -> AttemptView | None:
    """An attempt whose job finished while it was handed over (None: none did), among a job's
    `attempts` (one view per attempt, a gang's by its rank 0).

    After a notice or a move the old job keeps running until its replacement is ready; if it
    exits 0 before any stop reached it (`finished`: the agent's `job_exited` says it was not
    stopped), it did the work, and a replacement that ran it again would only repeat its
    end. A job that exits 0 after its stop has only checkpointed. Once a later attempt has
    started the job, the job is that attempt's: an older one's report never ends it."""
    for a in attempts:
        if not a.finished or not (
            a.migrated or a.interruption_notice_at is not None or a.preempted
        ):
            continue
        if any(b.job_started and b.number > a.number for b in attempts):
            continue
        return a
    return None
