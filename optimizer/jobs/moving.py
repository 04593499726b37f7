"""The migration pass: which running jobs to move this pass, and the move itself.

`Moves.__call__` plans over the whole view (migration.plan over what migration_inputs
gathers) and leaves its decisions in the view (`PassView.moves`); the per-job pass
(per_job.py) applies a job's move where the job is healthy and running, as the move was
decided for (`migrate`). Moves held back are logged once per reason; a policy or job
that cannot be gathered is left out (a `policy.skipped` event once per reason, for a policy),
and a plan that raises moves nothing this pass: the jobs themselves are still reconciled.
"""

from __future__ import annotations

from collections.abc import Mapping

from optimizer.jobs.acting import Acting, attempt_fields, log
from optimizer.jobs.context import UNREACHABLE, ReconcileContext
from optimizer.jobs.machine import Alert, Launch
from optimizer.jobs.measured import DEFAULT_WINDOW, ProbeWindow
from optimizer.jobs.migration import Move, Plan, Reason, describe, plan
from optimizer.jobs.migration_inputs import (
    InForce,
    Overheads,
    WindowName,
    gather,
    in_force_now,
    window_now,
)
from optimizer.jobs.recovery import Strategy
from optimizer.jobs.spares import promote
from optimizer.jobs.spec import pass_spec
from optimizer.jobs.views import PassView
from optimizer.lifecycle import AttemptEnd, AttemptState, JobState
from optimizer.model import EventKind
from optimizer.store import JobRecord
from optimizer.store.jobs import AttemptRecord
from policies.schema import Policy


class Moves:
    """The migration pass (reconcile.py); remembers each policy's measured restart overhead
    and what it last said about held moves and skipped policies."""

    def __init__(
        self,
        acting: Acting,
        *,
        probe_window: ProbeWindow = DEFAULT_WINDOW,
        in_force: InForce = in_force_now,
        window_name: WindowName = window_now,
    ) -> None:
        self.acting = acting
        self.probe_window = probe_window
        # The policy in force at an instant (a schedule window's values), and the window's name.
        self.in_force = in_force
        self.window_name = window_name
        self._overheads = Overheads()  # each policy's measured restart overhead, for a while
        self._held: dict[int, str] = {}  # job id -> why its move waits (logged when it changes)
        self._skipped: dict[str, str] = {}  # policy -> why the migration pass left it out

    def __call__(self, ctx: ReconcileContext, view: PassView) -> None:
        view.moves.update({m.job_id: m for m in self.plan(ctx, view).moves})

    def plan(self, ctx: ReconcileContext, view: PassView) -> Plan:
        """The pass's moves; the moves it holds back are logged once per reason."""
        live = list(view.live)
        try:
            inputs = gather(
                ctx.store,
                live,
                dict(view.attempts),
                {name: p.policy for name, p in ctx.policies.items()},
                ctx.now,
                overheads=self._overheads,
                probe_window=self.probe_window,
                in_force=self.in_force,
                window_name=self.window_name,
                memo=ctx.memo,
            )
            if inputs is not None:
                self._skip(ctx, inputs.skipped_policies, inputs.skipped_jobs, live)
            if inputs is None or not inputs.markets:
                self._held.clear()
                return Plan()
            decided = plan(inputs.jobs, inputs.markets, ctx.now)
        except UNREACHABLE:
            raise
        except Exception as exc:
            self.acting.complain("planning moves", exc)
            return Plan()
        held = {h.job_id: f"{h.reason.value}: {h.why}" for h in decided.held}
        names = {j.id: j.name for j in live}
        for job_id, why in held.items():
            if self._held.get(job_id) != why:
                log.info("job %s: not moved yet (%s)", names.get(job_id, job_id), why)
        self._held = held
        return decided

    def _skip(
        self,
        ctx: ReconcileContext,
        policies: Mapping[str, str],
        jobs: Mapping[int, str],
        live: list[JobRecord],
    ) -> None:
        """Say once per reason that the migration pass left a policy (an event) or a job (a
        log line: the job's own handling says the rest) out."""
        names = {j.id: j.name for j in live}
        for job_id, why in jobs.items():
            self.acting.complain(
                f"gathering job {names.get(job_id, job_id)} for moves", ValueError(why)
            )
        for name, why in policies.items():
            if self._skipped.get(name) == why:
                continue
            self._skipped[name] = why
            log.error("policy %s: its jobs are not moved: %s", name, why)
            event = ctx.emitter.draft(
                EventKind.POLICY_SKIPPED,
                f"policy {name}: its running jobs are not moved, it could not be read: {why}",
                severity="error",
                policy=name,
                data={"policy": name, "step": "migration", "reason": why},
                dedupe_key=f"policy:{name}:skipped:{why}",
            )
            ctx.store.events.record_events([event], ctx.now)
        for name in [n for n in self._skipped if n not in policies]:
            del self._skipped[name]


def migrate(
    acting: Acting,
    ctx: ReconcileContext,
    job: JobRecord,
    current: AttemptRecord,
    move: Move,
    policy: Policy,
    strategy: Strategy,
) -> None:
    """Move a running job: launch the next attempt on the move's targets, then end the
    current one as `migrated` (its job keeps running: a hot handover, stopped once the
    next attempt is ready) in the transaction that records the `job.migrated` event and
    the job's transition. Until that commits the old attempt stays open and the new one's
    fence holds (the old job has not exited), so a daemon that stops in between leaves a
    move that did not happen, which the next pass undoes (`per_job.abandon`). A launch
    that finds no capacity leaves the job where it was, with no event."""
    launch = Launch(avoid=frozenset({current.pool}), only=frozenset(move.targets))
    walked = None
    if pass_spec(job, ctx.memo).warm_spare:  # a spare on one of the targets takes it over
        walked = promote(acting, ctx, job, launch, ctx.store.jobs.attempts(job.id))
    launched, why = walked or acting.launcher.walk(ctx, job, launch, policy, strategy)
    if not launched:
        acting.flush(ctx)  # what the failed launches raised
        log.info("job %s: not moved (%s): %s", job.name, move.reason.value, why)
        return
    subject = ctx.store.jobs.attempts(job.id)[-1]  # the one just launched
    forced = move.reason in (Reason.BID_CAP, Reason.NOT_ALLOWED)
    told = f"moved ({move.reason.value}): {move.message}; {why}"
    events = acting.take()
    events.append(
        acting.draft(
            ctx,
            job,
            Alert(
                EventKind.JOB_MIGRATED,
                "warning" if forced else "info",
                f"job {job.name}: {move.message}",
                data=(
                    ("reason", move.reason.value),
                    ("from_pool", str(current.pool)),
                    ("to_pool", str(subject.pool)),
                    ("from_usd_per_hour", move.from_usd),
                    ("to_usd_per_hour", subject.usd_per_hour),
                    ("expected_saving_usd", round(move.expected_saving_usd, 4)),
                    ("overhead_usd", round(move.overhead_usd, 4)),
                    ("explanation", move.message),
                    ("to", describe(subject.pool)),
                ),
            ),
            dedupe=f"attempt:{current.key}:migrated",
            attempt=current,
        )
    )
    events.append(
        ctx.emitter.draft(
            EventKind.JOB_STATE_CHANGED,
            f"job {job.name}: {job.state} → {JobState.PROVISIONING.value} ({told})",
            policy=job.policy,
            data={
                "job": job.given_name,
                **attempt_fields(subject),
                "from": job.state,
                "to": JobState.PROVISIONING.value,
                "reason": told,
            },
        )
    )
    moved = ctx.store.jobs.transition_job(
        job.id,
        expected=job.state,
        state=JobState.PROVISIONING.value,
        reason=told,
        restarts=job.restarts + 1,
        events=events,
        at=ctx.now,
        attempts={
            current.key: {
                "ended_at": ctx.now,
                "end_reason": AttemptEnd.MIGRATED,
                "state": AttemptState.ENDED,
            }
        },
    )
    if moved is None:
        # Nothing was written: the next pass drops the attempt just launched (`abandon`).
        log.info("job %s changed while it was being moved; deciding again next pass", job.name)


__all__ = ["Moves", "migrate"]
