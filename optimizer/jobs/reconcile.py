"""The managed-jobs reconciler: applies the state machine's decisions through the providers.

Each pass, for every live job: fold the current attempt from the store (what its agent
reported) and the provider's describe, ask `machine.decide` (with the recovery strategy the
job's policy names, recovery.py), and apply the actions — launch (launch.py: the best offer
the policy allows, minus pools in cooldown and pools the decision avoids), stop, terminate,
cool a pool down, alert — recording the transition and its events in one transaction.
Launch errors are typed (`launch.LaunchOutcome`): capacity → the next offer now with the
pool cooled down; quota → the pool cooled down and the provider/region skipped, with an
alert; throttled → retried next pass with the same idempotency key; auth → the provider sits
out, with an alert.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta

from optimizer.jobs.bootstrap import AgentSettings
from optimizer.jobs.context import ReconcileContext
from optimizer.jobs.launch import Launcher, LaunchOutcome
from optimizer.jobs.machine import (
    LIVE,
    REGISTER_TIMEOUT,
    Alert,
    AttemptView,
    Cooldown,
    Decision,
    JobState,
    JobView,
    Launch,
    Stop,
    Terminate,
    decide,
    handing_over,
    handover,
    leftover,
    power_off_time,
)
from optimizer.jobs.recovery import Failure, Strategy, strategy_for
from optimizer.model import EventKind
from optimizer.store import Store
from optimizer.store.jobs import AttemptRecord
from optimizer.store.tables import JobRecord, NewEvent
from policies.schema import Policy
from providers.base import EndReason, InstanceRef, InstanceState, ProviderError

log = logging.getLogger(__name__)

STOP_GRACE = timedelta(seconds=45)
FAILURES = frozenset(f.value for f in Failure)  # end reasons a strategy counts as failures


class JobReconciler:
    """The daemon's reconciler of managed jobs (a `Reconciler`, optimizer/jobs/context.py)."""

    name = "jobs"

    def __init__(
        self,
        daemon_url: Callable[[], str],
        *,
        agent: AgentSettings | None = None,
        register_timeout: timedelta = REGISTER_TIMEOUT,
    ) -> None:
        self.launcher = Launcher(daemon_url, self._emit, agent=agent)
        self.register_timeout = register_timeout
        # Events raised while acting on a job, recorded with its transition (one transaction).
        self._buffer: list[NewEvent] = []

    def __call__(self, ctx: ReconcileContext) -> None:
        # Provider event queues (AWS EventBridge → SQS) are read by their own loop
        # (optimizer/daemon/loops/queue.py), which records notices and wakes this one.
        self._describe(ctx, ctx.store.jobs.open_attempts())
        self._buffer.clear()
        live = [job for job in ctx.jobs if JobState(job.state) in LIVE]
        # Read after describe, which may have ended attempts.
        attempts = ctx.store.jobs.attempts_of(job.id for job in live)
        for job in live:
            self._job(ctx, job, attempts.get(job.id, []))
            self._flush(ctx)  # events of a job whose pass made no transition
        self._clean_up(ctx)

    # -- observing ---------------------------------------------------------------------------

    def _describe(self, ctx: ReconcileContext, attempts: list[AttemptRecord]) -> None:
        """Mark attempts whose instance the provider reports ended (and why)."""
        by_provider: dict[str, list[AttemptRecord]] = {}
        for a in attempts:
            if a.instance_id:
                by_provider.setdefault(a.provider, []).append(a)
        for provider, group in by_provider.items():
            source = self.launcher.provider(ctx, provider)
            if source is None:
                continue
            refs = [InstanceRef(a.provider, a.region, a.zone, a.instance_id or "") for a in group]
            try:
                statuses = source.describe(refs)
            except ProviderError as exc:
                log.warning("describe on %s failed: %s", provider, exc)
                continue
            keys = {a.instance_id: a.key for a in group}
            for status in statuses:
                if status.state is InstanceState.TERMINATED:
                    ctx.store.jobs.update_attempt(
                        keys[status.ref.instance_id],
                        instance_gone=True,
                        preempted=status.end_reason is EndReason.PREEMPTED,
                    )

    # -- one job -------------------------------------------------------------------------------

    def _job(self, ctx: ReconcileContext, job: JobRecord, attempts: list[AttemptRecord]) -> None:
        current = next((a for a in reversed(attempts) if not a.ended), None)
        loaded = ctx.policies.get(job.policy)
        if loaded is None:
            self._emit(
                ctx,
                job,
                Alert(EventKind.JOB_POLICY_MISSING, "error", f"policy {job.policy} is not loaded"),
                dedupe=f"job:{job.id}:no-policy",
            )
            return
        policy = loaded.policy
        strategy = strategy_for(policy, max_restarts=job.spec.get("max_restarts"))
        if current is not None and current.instance_id is None and current.state == "launching":
            # A launch that did not finish (throttled, or the daemon died mid-call): retry it
            # with the same key, so the provider hands back the instance if it exists.
            outcome = self.launcher.launch(ctx, job, current, strategy)
            self._flush(ctx)
            if outcome is not LaunchOutcome.LAUNCHED:
                # Still pending (throttled, or this replica stopped leading): next pass or the
                # new leader. Ended (an error): the next pass decides without it.
                return
            # Launched: move the job on in this pass rather than at the next tick.
            attempts = ctx.store.jobs.attempts(job.id)
            current = next((a for a in reversed(attempts) if not a.ended), None)
        view = JobView(
            id=job.id,
            name=job.name,
            state=JobState(job.state),
            restarts=job.restarts,
            probes=job.spec.get("probes", "quick"),
            cancel_requested=job.cancel_requested_at is not None,
            failures=tuple(
                (Failure(a.end_reason), a.ended_at)
                for a in attempts
                if a.end_reason in FAILURES and a.ended_at
            ),
        )
        decision = decide(
            view,
            attempt_view(current) if current else None,
            now=ctx.now,
            strategy=strategy,
            register_timeout=self.register_timeout,
        )
        self._apply(ctx, job, current, decision, policy, strategy)

    def _apply(
        self,
        ctx: ReconcileContext,
        job: JobRecord,
        current: AttemptRecord | None,
        decision: Decision,
        policy: Policy,
        strategy: Strategy,
    ) -> None:
        events: list[NewEvent] = []
        launch: Launch | None = None
        for action in decision.actions:
            if isinstance(action, Stop):
                ctx.store.jobs.update_attempt(action.key, stop_sent_at=ctx.now)
            elif isinstance(action, Terminate):
                self._terminate(ctx, action.key)
            elif isinstance(action, Cooldown):
                ctx.store.jobs.add_cooldown(action.pool, action.until, action.reason)
            elif isinstance(action, Alert):
                events.append(self._draft(ctx, job, action))
            elif isinstance(action, Launch):
                launch = action
        if current is not None and decision.end_attempt is not None:
            ctx.store.jobs.update_attempt(
                current.key, ended_at=ctx.now, end_reason=decision.end_attempt, state="ended"
            )
        state, reason = decision.state, decision.reason
        if launch is not None:
            launched, why = self.launcher.walk(ctx, job, launch, policy, strategy)
            if launched:
                state = JobState.PROVISIONING
                reason = why if decision.state is JobState.PENDING else f"{reason}; {why}"
            else:
                state, reason = JobState.PENDING, why
                if why != job.reason:  # once per reason, not every pass
                    events.append(
                        self._draft(
                            ctx,
                            job,
                            Alert(EventKind.JOB_DEFERRED, "warning", f"job {job.name}: {why}"),
                            dedupe=f"job:{job.id}:pending:{why}",
                        )
                    )
        events = [*self._buffer, *events]
        self._buffer.clear()
        if (
            state.value != job.state
            or reason != job.reason
            or decision.restarts is not None
            or events
        ):
            changed = state.value != job.state
            if changed:
                events.append(
                    ctx.emitter.draft(
                        EventKind.JOB_STATE_CHANGED,
                        f"job {job.name}: {job.state} → {state.value} ({reason})",
                        policy=job.policy,
                        data={"from": job.state, "to": state.value, "reason": reason},
                    )
                )
            moved = ctx.store.jobs.transition_job(
                job.id,
                expected=job.state,
                state=state.value,
                reason=reason,
                restarts=decision.restarts,
                events=events,
                at=ctx.now,
            )
            if moved is None:
                # Someone moved the job since this pass read it: write nothing; the next
                # pass decides again from what is stored.
                log.info(
                    "job %s left %s while this pass decided it; deciding again next pass",
                    job.name,
                    job.state,
                )

    # -- acting --------------------------------------------------------------------------------

    def _terminate(self, ctx: ReconcileContext, key: str) -> None:
        attempt = ctx.store.jobs.attempt(key)
        if attempt is None or attempt.instance_id is None or attempt.instance_gone:
            return
        source = self.launcher.provider(ctx, attempt.provider)
        if source is None:
            return
        ref = InstanceRef(attempt.provider, attempt.region, attempt.zone, attempt.instance_id)
        try:
            source.terminate(ref)
        except ProviderError as exc:
            log.warning("terminate %s failed: %s", attempt.instance_id, exc)

    def _clean_up(self, ctx: ReconcileContext) -> None:
        """Terminate instances of ended attempts once their job exited or the grace passed,
        and open attempts of jobs that ended while their attempt stayed open (a state write
        from elsewhere; cancels are decided in a pass and end the attempt themselves)."""
        live = {job.id for job in ctx.jobs if JobState(job.state) in LIVE}
        jobs = {job.id: job for job in ctx.jobs}
        attempts = ctx.store.jobs.open_attempts()
        opened = [a for a in attempts if not a.ended]
        for attempt in attempts:
            if attempt.instance_id is None:
                continue
            if not attempt.ended and attempt.job_id not in live:
                self._terminate(ctx, attempt.key)
                ctx.store.jobs.update_attempt(
                    attempt.key,
                    state="ended",
                    ended_at=ctx.now,
                    end_reason="user",
                    instance_gone=True,
                )
                continue
            if not attempt.ended:
                continue
            if attempt.end_reason in ("succeeded", "failed") and attempt.exit_code is not None:
                continue  # terminated when the job ended
            old = attempt_view(attempt, power_off_at=power_off_at(ctx.store, attempt))
            if handing_over(old) and attempt.job_id in live:
                job = jobs.get(attempt.job_id)
                spec = job.spec if job is not None else {}
                current = next((a for a in opened if a.job_id == attempt.job_id), None)
                stop = handover(
                    old,
                    attempt_view(current) if current is not None else None,
                    now=ctx.now,
                    probes=spec.get("probes", "quick"),
                    allowance=timedelta(seconds=float(spec.get("checkpoint_allowance_s") or 20.0)),
                )
                if stop is not None:
                    ctx.store.jobs.update_attempt(attempt.key, stop_sent_at=ctx.now)
                    log.info("stopping %s: %s", attempt.key, stop.reason)
                continue  # its instance is left to the stop's grace
            action = leftover(
                attempt_view(attempt),
                stop_sent_at=attempt.stop_sent_at,
                now=ctx.now,
                grace=STOP_GRACE,
            )
            if action is not None:
                self._terminate(ctx, attempt.key)
                ctx.store.jobs.update_attempt(attempt.key, instance_gone=True)

    # -- events --------------------------------------------------------------------------------

    def _draft(
        self, ctx: ReconcileContext, job: JobRecord, alert: Alert, dedupe: str | None = None
    ) -> NewEvent:
        data = {"job": job.name}
        if alert.kind is EventKind.JOB_CANCELLED:
            data["state_before"] = job.state
        return ctx.emitter.draft(
            alert.kind,
            alert.message,
            severity=alert.severity,
            policy=job.policy,
            data=data,
            dedupe_key=dedupe,
        )

    def _emit(
        self, ctx: ReconcileContext, job: JobRecord, alert: Alert, dedupe: str | None = None
    ) -> None:
        """Queue an event for the job's transition (or the next flush)."""
        self._buffer.append(replace(self._draft(ctx, job, alert, dedupe), job_id=job.id))

    def _flush(self, ctx: ReconcileContext) -> None:
        if self._buffer:
            events, self._buffer = self._buffer, []
            ctx.store.events.record_events(events, ctx.now)


def power_off_at(store: Store, a: AttemptRecord) -> datetime | None:
    """When the instance of an attempt with an interruption notice goes (None: no notice)."""
    if a.notice_at is None:
        return None
    times = [
        power_off_time(e["data"], e["at"])
        for e in store.jobs.agent_events(a.key)
        if e["kind"] == "interruption_notice"
    ]
    return min((t for t in times if t is not None), default=None)


def attempt_view(a: AttemptRecord, *, power_off_at: datetime | None = None) -> AttemptView:
    """An attempt as the state machine sees it."""
    return AttemptView(
        number=a.number,
        key=a.key,
        pool=a.pool,
        launched_at=a.started_at,
        registered=a.registered_at is not None,
        probe_status=a.probe_status,
        job_started=a.job_started_at is not None,
        exit_code=a.exit_code,
        interruption_notice_at=a.notice_at,
        instance_gone=a.instance_gone,
        preempted=a.preempted,
        stop_sent=a.stop_sent_at is not None,
        power_off_at=power_off_at,
    )


__all__ = ["JobReconciler", "attempt_view", "power_off_at"]
