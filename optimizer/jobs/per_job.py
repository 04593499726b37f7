"""The per-job pass: each live job decided (`machine.decide`) and the decision applied.

For every live job in the view: fold its current attempt (a gang folded into one), ask
`machine.decide` (with the recovery strategy the job's policy names, recovery.py — for a job
with a deadline, relaunching on the markets its deadline strategy chose, deadlines.py — and what
the utilization watch says, watch.py), and apply the actions — launch (launch.py: the best
offer the policy allows, minus pools in cooldown and pools the decision avoids), stop,
terminate, cool a pool down, alert — recording the transition and its events in one
transaction. A job the migration pass decided to move is moved instead (moving.py), where it
is healthy and running as the move was decided for. Before deciding: a launch left
unfinished is retried with its key, and a move that never committed is undone (`abandon`).

Each job on its own: one that raises is failed (or cancelled, when asked) with why, and the
others go on (`machine.unmanageable`). The database going away is no one job's fault: the
pass ends, and the next one tries again.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from optimizer.jobs.acting import Acting, attempt_fields, log
from optimizer.jobs.context import UNREACHABLE, ReconcileContext
from optimizer.jobs.gang import head_number
from optimizer.jobs.launch import LaunchOutcome
from optimizer.jobs.machine import (
    REGISTER_TIMEOUT,
    Alert,
    Cooldown,
    Decision,
    JobView,
    Launch,
    PolicyStop,
    Stop,
    Terminate,
    decide,
    unmanageable,
)
from optimizer.jobs.migration import Move
from optimizer.jobs.migration_inputs import why as describe_error
from optimizer.jobs.moving import migrate
from optimizer.jobs.recovery import Strategy, strategy_for, with_deadline
from optimizer.jobs.spares import promote
from optimizer.jobs.spec import pass_spec
from optimizer.jobs.utilization import rules_for
from optimizer.jobs.views import (
    PassView,
    Watched,
    attempt_view,
    current_rows,
    finished_earlier,
    gang_head,
    gang_view,
)
from optimizer.jobs.watch import Watch
from optimizer.lifecycle import FAILURES, AttemptEnd, AttemptState, Failure, JobState
from optimizer.model import EventKind
from optimizer.store import JobRecord, NewEvent
from optimizer.store.jobs import AttemptRecord
from policies.schedule import effective
from policies.schema import Policy

# The end reason of an attempt launched for a move that never committed (`abandon`).
ABANDONED = AttemptEnd.MOVE_ABANDONED


class PerJob:
    """The per-job pass (reconcile.py)."""

    def __init__(
        self,
        acting: Acting,
        watch: Watch,
        *,
        register_timeout: timedelta = REGISTER_TIMEOUT,
    ) -> None:
        self.acting = acting
        self.watch = watch
        self.register_timeout = register_timeout

    def __call__(self, ctx: ReconcileContext, view: PassView) -> None:
        self.watch.forget(view.open_keys())
        for job in view.live:
            try:
                self.job(
                    ctx,
                    job,
                    view.attempts.get(job.id, []),
                    view.moves.get(job.id),
                    view.deadlines.get(job.id),
                )
                self.acting.flush(ctx)  # events of a job whose pass made no transition
            except UNREACHABLE:
                raise
            except Exception as exc:
                self.unmanageable(ctx, job, exc)

    # -- a job that cannot be handled ------------------------------------------------------------

    def unmanageable(self, ctx: ReconcileContext, job: JobRecord, exc: Exception) -> None:
        """Fail (or cancel, when asked) a job whose handling raised, ending its attempt and
        terminating its instance (`machine.unmanageable`); logged once, with the traceback."""
        why = describe_error(exc)
        log.error("job %s could not be reconciled: %s", job.name, why, exc_info=exc)
        try:
            nodes = current_rows(ctx.store.jobs.attempts(job.id))
            current = nodes[0] if nodes else None
            view = JobView(
                id=job.id,
                name=job.name,
                state=JobState(job.state),
                restarts=job.restarts,
                cancel_requested=job.cancel_requested_at is not None,
            )
            attempt = None if current is None else attempt_view(current)
            decision = unmanageable(view, attempt, why)
            self.apply(ctx, job, current, decision, None, None, nodes=nodes)
        except UNREACHABLE:
            raise
        except Exception as again:
            self.acting.buffer.clear()
            self.acting.complain(f"failing job {job.name}", again)

    # -- one job -------------------------------------------------------------------------------

    def job(
        self,
        ctx: ReconcileContext,
        job: JobRecord,
        attempts: list[AttemptRecord],
        move: Move | None = None,
        deadline: Watched | None = None,
    ) -> None:
        nodes = current_rows(attempts)
        current = nodes[0] if nodes else None
        loaded = ctx.policies.get(job.policy)
        if loaded is None:
            self.acting.emit(
                ctx,
                job,
                Alert(EventKind.JOB_POLICY_MISSING, "error", f"policy {job.policy} is not loaded"),
                dedupe=f"job:{job.id}:no-policy",
            )
            return
        # The plain policy in force now: a schedule window's markets, bid, placement and
        # rank_by in place of the top-level ones while it is in force.
        policy = effective(loaded.policy, ctx.now)
        spec = pass_spec(job, ctx.memo)  # validated once this pass; the launch walk reuses it
        strategy = strategy_for(policy, max_restarts=spec.max_restarts)
        if deadline is not None and deadline.decision is not None:
            # The recovery seam: a job with a deadline relaunches on the markets its deadline
            # strategy chose at this pass (deadlines.py).
            strategy = with_deadline(strategy, deadline.markets, deadline.decision.reason)
        unlaunched = [
            a for a in nodes if a.instance_id is None and a.state == AttemptState.LAUNCHING
        ]
        if unlaunched:
            # A launch that did not finish (throttled, or the daemon died mid-call): retry it
            # with the same key, so the provider hands back the instance if it exists (every
            # node of a gang not launched yet, in rank order).
            launcher = self.acting.launcher
            outcome = LaunchOutcome.LAUNCHED
            for row in unlaunched:
                outcome = launcher.launch(ctx, job, row, strategy)
                if outcome is not LaunchOutcome.LAUNCHED:
                    break
            if len(nodes) > 1 and outcome is not LaunchOutcome.LAUNCHED and not outcome.pending:
                launcher.tear_down(ctx, job, nodes, why=f"a node failed: {outcome.value}")
            self.acting.flush(ctx)
            if outcome is not LaunchOutcome.LAUNCHED:
                # Still pending (throttled, or this replica stopped leading): next pass or the
                # new leader. Ended (an error): the next pass decides without it.
                return
            # Launched: move the job on in this pass rather than at the next tick.
            attempts = ctx.store.jobs.attempts(job.id)
            nodes = current_rows(attempts)
            current = nodes[0] if nodes else None
        if current is not None and self.abandon(ctx, job, attempts, nodes):
            return
        view = JobView(
            id=job.id,
            name=job.name,
            state=JobState(job.state),
            restarts=job.restarts,
            probes=spec.probes,
            cancel_requested=job.cancel_requested_at is not None,
            failures=tuple(  # a warm spare's own failures are not the job's (spares.py)
                (Failure(a.end_reason), a.ended_at)
                for a in attempts
                if a.end_reason in FAILURES and a.ended_at and not a.idle_spare
            ),
            migrations=sum(1 for a in attempts if a.end_reason == AttemptEnd.MIGRATED),
            finished_on=finished_earlier(ctx.store, attempts, nodes),
        )
        stop: PolicyStop | None = None
        rules = rules_for(policy, job.spec)
        if rules and current is not None and current.job_started_at is not None:
            stop = self.watch(ctx, job, current, attempts, rules)
        decision = decide(
            view,
            gang_view(ctx.store, nodes) if current else None,
            now=ctx.now,
            strategy=strategy,
            register_timeout=self.register_timeout,
            stop=stop,
        )
        if (
            move is not None
            and current is not None
            and len(nodes) <= 1  # a gang is not moved
            and decision.state is JobState.RUNNING
            and not decision.actions
            and decision.end_attempt is None
        ):
            # Healthy and running, as the move was decided for: move it instead.
            migrate(self.acting, ctx, job, current, move, policy, strategy)
            return
        self.apply(ctx, job, current, decision, policy, strategy, nodes=nodes, attempts=attempts)

    def abandon(
        self,
        ctx: ReconcileContext,
        job: JobRecord,
        attempts: list[AttemptRecord],
        nodes: list[AttemptRecord],
    ) -> bool:
        """Undo a move that never committed: the daemon stopped after launching the next
        attempt (`nodes`) and before the transaction that ends the older one and records the
        `job.migrated` event (`moving.migrate`). The job still runs on the older attempt, which
        stays; the newer one is ended and its instance terminated, and a later pass may
        decide the move again. True when it did so (the pass decides again next time)."""
        head = head_number(nodes[0].number, nodes[0].gang)
        older = [
            a
            for a in attempts
            if not a.ended and not a.idle_spare and head_number(a.number, a.gang) < head
        ]
        if not older:
            return False
        for node in nodes:
            ctx.store.jobs.update_attempt(
                node.key, state=AttemptState.ENDED, ended_at=ctx.now, end_reason=ABANDONED
            )
            if node.instance_id is not None:
                self.acting.terminate(ctx, node.key)
        log.warning(
            "job %s: attempt %d was launched for a move that did not commit; ended it, the job "
            "runs on attempt %d",
            job.name,
            head,
            older[-1].number,
        )
        return True

    # -- applying a decision -------------------------------------------------------------------

    def apply(
        self,
        ctx: ReconcileContext,
        job: JobRecord,
        current: AttemptRecord | None,
        decision: Decision,
        policy: Policy | None,
        strategy: Strategy | None,
        *,
        nodes: list[AttemptRecord] | None = None,
        attempts: list[AttemptRecord] | None = None,
    ) -> None:
        """Apply a decision; `policy` and `strategy` are needed only by one that launches, and
        `attempts` (the job's, as this pass read them) spares a launch reading them again."""
        events: list[NewEvent] = []
        launch: Launch | None = None
        # An action on a gang (named by its rank-0 key) is an action on each of its nodes.
        keys = {current.key: [n.key for n in nodes]} if current is not None and nodes else {}
        for action in decision.actions:
            if isinstance(action, Stop):
                for key in keys.get(action.key, [action.key]):
                    ctx.store.jobs.update_attempt(key, stop_sent_at=ctx.now)
            elif isinstance(action, Terminate):
                for key in keys.get(action.key, [action.key]):
                    self.acting.terminate(ctx, key)
            elif isinstance(action, Cooldown):
                ctx.store.jobs.add_cooldown(action.pool, action.until, action.reason)
            elif isinstance(action, Alert):
                events.append(self.acting.draft(ctx, job, action, attempt=current))
            elif isinstance(action, Launch):
                launch = action
        if current is not None and decision.end_attempt is not None:
            for node in nodes or [current]:
                ended: dict[str, Any] = {}
                if (
                    len(nodes or ()) > 1
                    and node.job_started_at is not None
                    and node.exit_code is None
                    and node.stop_sent_at is None
                    and not node.instance_gone
                ):
                    # Any node's end ends the gang: every node's job gets SIGTERM (rank 0
                    # checkpoints), and its instance goes once the job exited or the grace is
                    # over; the replacement's fence waits for them.
                    ended["stop_sent_at"] = ctx.now
                ctx.store.jobs.update_attempt(
                    node.key,
                    ended_at=ctx.now,
                    end_reason=decision.end_attempt,
                    state=AttemptState.ENDED,
                    **ended,
                )
        state, reason = decision.state, decision.reason
        subject = current  # the attempt the transition is about
        if launch is not None:
            assert policy is not None and strategy is not None, "a launch needs its policy"
            # A job's warm spare takes the job over where it can (no launch); else the walk.
            walked = None
            if pass_spec(job, ctx.memo).warm_spare:
                every = ctx.store.jobs.attempts(job.id) if attempts is None else attempts
                walked = promote(self.acting, ctx, job, launch, every)
            launched, why = walked or self.acting.launcher.walk(
                ctx, job, launch, policy, strategy, attempts=attempts
            )
            if launched:
                state = JobState.PROVISIONING
                reason = why if decision.state is JobState.PENDING else f"{reason}; {why}"
                subject = gang_head(ctx.store.jobs.attempts(job.id))  # the one just launched
            else:
                state, reason = JobState.PENDING, why
                if why != job.reason:  # once per reason, not every pass
                    events.append(
                        self.acting.draft(
                            ctx,
                            job,
                            Alert(EventKind.JOB_DEFERRED, "warning", f"job {job.name}: {why}"),
                            dedupe=f"job:{job.id}:pending:{why}",
                        )
                    )
        events = [*self.acting.take(), *events]
        if (
            state.value != job.state
            or reason != job.reason
            or decision.restarts is not None
            or events
        ):
            if state.value != job.state:
                events.append(
                    ctx.emitter.draft(
                        EventKind.JOB_STATE_CHANGED,
                        f"job {job.name}: {job.state} → {state.value} ({reason})",
                        policy=job.policy,
                        data={
                            "job": job.given_name,
                            **attempt_fields(subject),
                            "from": job.state,
                            "to": state.value,
                            "reason": reason,
                        },
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


__all__ = ["ABANDONED", "PerJob"]
