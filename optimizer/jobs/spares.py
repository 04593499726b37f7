"""The spares pass: each job's warm spare kept, replaced or released; and a spare's promotion.

After the per-job pass (which has just ended, relaunched or promoted attempts) and before the
clean-up: for each live job that asks for a warm spare, or holds one, the job and its
attempts are read again and `spare.decide_spare` says what to do; a spare to end is ended
(its instance terminated now, or left for the cloud to end where that costs less, as
`handover.reclaim` decides), and a new one is launched by the launch walk (launch.py) on
the policy's ranking, ordered apart from the running attempt (`spare.spare_order`).

`promote` is the per-job pass's and the move's seam: where a launch would replace the job's
attempt, a healthy idle spare takes the job over instead (no launch, no boot, no probe).
Every change is an event, `job.spare_changed`, whose `action` says which: `launched`,
`promoted` or `ended`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from optimizer.jobs.acting import Acting, log
from optimizer.jobs.cleanup import free_window
from optimizer.jobs.context import UNREACHABLE, ReconcileContext
from optimizer.jobs.handover import reclaim
from optimizer.jobs.launch import LaunchOutcome, Walk, next_number
from optimizer.jobs.machine import REGISTER_TIMEOUT, Alert, Launch, Terminate
from optimizer.jobs.recovery import strategy_for
from optimizer.jobs.spare import decide_spare, promotable
from optimizer.jobs.spec import pass_spec
from optimizer.jobs.views import PassView, attempt_view, current_rows, power_off_at, preempting
from optimizer.lifecycle import AttemptEnd, AttemptState, JobState
from optimizer.model import EventKind, Pool
from optimizer.store import JobRecord
from optimizer.store.jobs import AttemptRecord
from policies.schedule import effective


def idle_spare(attempts: Sequence[AttemptRecord]) -> AttemptRecord | None:
    """The job's open idle spare (None: none)."""
    return next((a for a in attempts if a.idle_spare and not a.ended), None)


def _event(
    acting: Acting,
    ctx: ReconcileContext,
    job: JobRecord,
    spare: AttemptRecord,
    action: str,
    message: str,
    severity: str = "info",
) -> None:
    alert = Alert(
        EventKind.JOB_SPARE_CHANGED,
        severity,
        f"job {job.name}: {message}",
        data=(("action", action), ("pool", str(spare.pool)), ("attempt_key", spare.key)),
    )
    acting.emit(ctx, job, alert, attempt=spare)


def promote(
    acting: Acting,
    ctx: ReconcileContext,
    job: JobRecord,
    launch: Launch,
    attempts: Sequence[AttemptRecord],
) -> Walk | None:
    """Let the job's idle spare take the job over in place of `launch` (None: it has none, or
    the launch would not allow its pool: the walk launches as usual). The spare becomes the
    job's newest attempt (the next number), so the fence holds it until the attempts before
    it have let go, and the handover stops the old job as soon as the spare is ready."""
    spare = idle_spare(attempts)
    if spare is None or not promotable(attempt_view(spare), spare.market, launch):
        return None
    number = next_number(ctx, job, attempts)
    ctx.store.jobs.update_attempt(spare.key, number=number, promoted_at=ctx.now)
    where = f"attempt {number} on {spare.pool.label} at ${spare.usd_per_hour:.4f}/h"
    ready = "ready" if spare.registered_at is not None else "still booting"
    taken = ctx.store.jobs.attempt(spare.key) or spare
    _event(acting, ctx, job, taken, "promoted", f"warm spare takes the job over as {where}")
    return Walk(True, f"warm spare takes over as {where} ({ready}; no launch)")


class Spares:
    """The spares pass (reconcile.py)."""

    def __init__(self, acting: Acting, *, register_timeout: timedelta = REGISTER_TIMEOUT) -> None:
        self.acting = acting
        self.register_timeout = register_timeout
        self._unlaunched: dict[int, str] = {}  # job id -> why its spare was not launched (said)

    def __call__(self, ctx: ReconcileContext, view: PassView) -> None:
        for job in view.live:
            rows = view.attempts.get(job.id, [])
            try:
                if pass_spec(job, ctx.memo).warm_spare or idle_spare(rows) is not None:
                    self.job(ctx, job)
                self.acting.flush(ctx)
            except UNREACHABLE:
                raise
            except Exception as exc:  # the other jobs' spares are still kept
                self.acting.buffer.clear()
                self.acting.complain(f"keeping job {job.name}'s warm spare", exc)

    def job(self, ctx: ReconcileContext, seen: JobRecord) -> None:
        job = ctx.store.jobs.get_job_by_id(seen.id) or seen  # the per-job pass may have moved it
        attempts = ctx.store.jobs.attempts(job.id)
        spare = idle_spare(attempts)
        nodes = current_rows(attempts)
        current = nodes[0] if nodes else None
        if len(nodes) > 1:
            current = None  # a gang has no spare (the spec refuses one; a policy may say nodes)
        decision = decide_spare(
            wanted=pass_spec(job, ctx.memo).warm_spare,
            state=JobState(job.state),
            current=None if current is None else attempt_view(current),
            spare=None if spare is None else attempt_view(spare),
            now=ctx.now,
            register_timeout=self.register_timeout,
        )
        avoid: frozenset[Pool] = frozenset()
        if spare is not None and decision.end is not None:
            self.end(ctx, job, spare, decision.end, decision.why)
            avoid = frozenset({spare.pool})
        elif spare is not None and spare.instance_id is None:
            if spare.state == AttemptState.LAUNCHING:  # a launch left unfinished: its key again
                self._retry(ctx, job, spare)
            return
        if decision.launch and current is not None:
            self.launch(ctx, job, current, avoid)

    def end(
        self,
        ctx: ReconcileContext,
        job: JobRecord,
        spare: AttemptRecord,
        why: AttemptEnd,
        told: str,
    ) -> None:
        """End the spare, and end its instance now unless the cloud's own end costs less."""
        ctx.store.jobs.update_attempt(
            spare.key,
            state=AttemptState.ENDED,
            ended_at=ctx.now,
            end_reason=why,
            stop_sent_at=ctx.now,  # its agent is told to stop; it never ran the job
        )
        view = attempt_view(spare, power_off_at=power_off_at(ctx.store, spare))
        action = reclaim(
            view,
            stop_sent_at=None,
            now=ctx.now,
            grace=timedelta(0),
            free_window=free_window(spare),
            preempting=preempting(ctx.store, spare),
        )
        if isinstance(action, Terminate) and spare.instance_id is not None:
            self.acting.terminate(ctx, spare.key)
        # (Left to the cloud: the clean-up records it, and ends it past the power-off.)
        replaced = why is not AttemptEnd.SPARE_RELEASED
        _event(
            self.acting,
            ctx,
            job,
            spare,
            "ended",
            f"warm spare attempt {spare.number} on {spare.pool.label} ended ({why.value}: {told})"
            + ("; launching another" if replaced else ""),
            severity="warning" if replaced else "info",
        )
        log.info("job %s: warm spare %s ended: %s", job.name, spare.key, told)

    def launch(
        self,
        ctx: ReconcileContext,
        job: JobRecord,
        current: AttemptRecord,
        avoid: frozenset[Pool],
    ) -> None:
        """Launch a new spare on the policy's ranking, apart from the running attempt."""
        loaded = ctx.policies.get(job.policy)
        if loaded is None:
            return  # the per-job pass says so
        policy = effective(loaded.policy, ctx.now)
        strategy = strategy_for(policy, max_restarts=pass_spec(job, ctx.memo).max_restarts)
        launch = Launch(avoid=avoid, spare=True, apart_from=current.pool)
        attempts = ctx.store.jobs.attempts(job.id)
        launched, why = self.acting.launcher.walk(
            ctx, job, launch, policy, strategy, attempts=attempts
        )
        new = idle_spare(ctx.store.jobs.attempts(job.id)) if launched else None
        if new is not None:
            self._unlaunched.pop(job.id, None)
            _event(self.acting, ctx, job, new, "launched", why)
        elif self._unlaunched.get(job.id) != why:  # once per reason, not every pass
            if len(self._unlaunched) >= 1000:
                self._unlaunched.clear()
            self._unlaunched[job.id] = why
            log.info("job %s: no warm spare launched: %s", job.name, why)

    def _retry(self, ctx: ReconcileContext, job: JobRecord, spare: AttemptRecord) -> None:
        loaded = ctx.policies.get(job.policy)
        if loaded is None:
            return
        policy = effective(loaded.policy, ctx.now)
        strategy = strategy_for(policy, max_restarts=pass_spec(job, ctx.memo).max_restarts)
        outcome = self.acting.launcher.launch(ctx, job, spare, strategy)
        if outcome is not LaunchOutcome.LAUNCHED:
            log.info("job %s: warm spare %s: %s", job.name, spare.key, outcome.value)


__all__ = ["Spares", "idle_spare", "promote"]
