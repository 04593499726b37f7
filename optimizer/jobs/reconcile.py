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
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from sqlalchemy import select

from optimizer.costs.billing import rule_for
from optimizer.jobs.bootstrap import AgentSettings
from optimizer.jobs.context import UNREACHABLE, ReconcileContext
from optimizer.jobs.gang import fold, head_number
from optimizer.jobs.launch import Launcher, LaunchOutcome
from optimizer.jobs.machine import (
    MIGRATED,
    REGISTER_TIMEOUT,
    Alert,
    AttemptView,
    Cooldown,
    Decision,
    JobView,
    Launch,
    LeaveToCloud,
    PolicyStop,
    Stop,
    Terminate,
    decide,
    finished_on,
    handing_over,
    handover,
    power_off_time,
    reclaim,
    unmanageable,
)
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
from optimizer.jobs.migration_inputs import why as describe_error
from optimizer.jobs.placements import release_placements
from optimizer.jobs.recovery import Failure, Strategy, strategy_for
from optimizer.jobs.utilization import Rules, Sample, rules_for, watch
from optimizer.lifecycle import LIVE_JOB_STATES as LIVE
from optimizer.lifecycle import JobState
from optimizer.model import EventKind, Market
from optimizer.store import JobRecord, NewEvent, Store
from optimizer.store.jobs import AttemptRecord
from optimizer.store.tables import GpuSample
from policies.schedule import effective
from policies.schema import Policy
from providers.base import EndReason, InstanceRef, InstanceState, InstanceStatus, ProviderError

log = logging.getLogger(__name__)

STOP_GRACE = timedelta(seconds=45)
# The end reason of an attempt launched for a move that never committed (`_abandon`).
ABANDONED = "move_abandoned"
Asked = Literal["asked", "failed", "unavailable"]
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
        probe_window: ProbeWindow = DEFAULT_WINDOW,
        in_force: InForce = in_force_now,
        window_name: WindowName = window_now,
    ) -> None:
        self.launcher = Launcher(daemon_url, self._emit, agent=agent, probe_window=probe_window)
        self.register_timeout = register_timeout
        self.probe_window = probe_window
        # The policy in force at an instant (a schedule window's values), and the window's name.
        self.in_force = in_force
        self.window_name = window_name
        self._overheads = Overheads()  # each policy's measured restart overhead, for a while
        self._held: dict[int, str] = {}  # job id -> why its move waits (logged when it changes)
        # Events raised while acting on a job, recorded with its transition (one transaction).
        self._buffer: list[NewEvent] = []
        # Attempts whose instance this reconciler has recorded leaving to the cloud.
        self._left: set[str] = set()
        # (attempt key, rule) -> the end of the window it last alerted on (read from the
        # events after a restart or a change of leader).
        self._alerted: dict[tuple[str, str], datetime | None] = {}
        # What raised in a pass, already logged with its traceback (logged once each).
        self._complaints: set[str] = set()
        self._skipped: dict[str, str] = {}  # policy -> why the migration pass left it out

    def __call__(self, ctx: ReconcileContext) -> None:
        # Provider event queues (AWS EventBridge → SQS) are read by their own loop
        # (optimizer/daemon/loops/queue.py), which records notices and wakes this one.
        self._describe(ctx, ctx.store.jobs.open_attempts())
        self._buffer.clear()
        live = [job for job in ctx.jobs if JobState(job.state) in LIVE]
        # Read after describe, which may have ended attempts.
        attempts = ctx.store.jobs.attempts_of(job.id for job in live)
        open_keys = {a.key for rows in attempts.values() for a in rows if not a.ended}
        self._alerted = {k: v for k, v in self._alerted.items() if k[0] in open_keys}
        moves = {m.job_id: m for m in self._plan(ctx, live, attempts).moves}
        # Each job on its own: one that raises is failed (or cancelled, when asked) with why,
        # and the others go on (`machine.unmanageable`). The database going away is no one
        # job's fault: the pass ends, and the next one tries again.
        for job in live:
            try:
                self._job(ctx, job, attempts.get(job.id, []), moves.get(job.id))
                self._flush(ctx)  # events of a job whose pass made no transition
            except UNREACHABLE:
                raise
            except Exception as exc:
                self._unmanageable(ctx, job, exc)
        try:
            self._clean_up(ctx)
            release_placements(ctx, self.launcher.provider)  # of gangs that are over
        except UNREACHABLE:
            raise
        except Exception as exc:
            self._complain("cleaning up ended attempts", exc)

    # -- a job that cannot be handled ------------------------------------------------------------

    def _unmanageable(self, ctx: ReconcileContext, job: JobRecord, exc: Exception) -> None:
        """Fail (or cancel, when asked) a job whose handling raised, ending its attempt and
        terminating its instance (`machine.unmanageable`); logged once, with the traceback."""
        why = describe_error(exc)
        log.error("job %s could not be reconciled: %s", job.name, why, exc_info=exc)
        try:
            attempts = ctx.store.jobs.attempts(job.id)
            current = next((a for a in reversed(attempts) if not a.ended), None)
            nodes = gang_rows(attempts, current)
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
            self._apply(ctx, job, current, decision, None, None, nodes=nodes)
        except UNREACHABLE:
            raise
        except Exception as again:
            self._buffer.clear()
            self._complain(f"failing job {job.name}", again)

    def _complain(self, what: str, exc: Exception) -> None:
        """Log a step that raised: with its traceback the first time, then once per change."""
        said = f"{what}: {describe_error(exc)}"
        if said not in self._complaints:
            if len(self._complaints) >= 1000:  # a bound on what is remembered, not on logging
                self._complaints.clear()
            self._complaints.add(said)
            log.error("reconcile: %s", said, exc_info=exc)

    # -- observing ---------------------------------------------------------------------------

    def _describe(self, ctx: ReconcileContext, attempts: list[AttemptRecord]) -> None:
        """Mark attempts whose instance the provider reports ended (and why), and record the
        billing facts it reports: the launch and termination times, and who ended it."""
        by_provider: dict[str, list[AttemptRecord]] = {}
        for a in attempts:
            if a.instance_id:
                by_provider.setdefault(a.provider, []).append(a)
        for provider, group in by_provider.items():
            try:
                self._describe_on(ctx, provider, group)
            except UNREACHABLE:
                raise
            except Exception as exc:  # one provider's trouble never stops the others' describe
                self._complain(f"describing instances on {provider}", exc)

    def _describe_on(
        self, ctx: ReconcileContext, provider: str, group: list[AttemptRecord]
    ) -> None:
        source = self.launcher.provider(ctx, provider)
        if source is None:
            return
        refs = [InstanceRef(a.provider, a.region, a.zone, a.instance_id or "") for a in group]
        try:
            statuses = source.describe(refs)
        except ProviderError as exc:
            log.warning("describe on %s failed: %s", provider, exc)
            return
        by_instance = {a.instance_id: a for a in group}
        for status in statuses:
            attempt = by_instance[status.ref.instance_id]
            launched = status.launched_at if attempt.launched_at is None else None
            if status.state is InstanceState.TERMINATED:
                preempted = status.end_reason is EndReason.PREEMPTED
                ctx.store.jobs.record_billing(
                    attempt.key,
                    launched_at=launched,
                    terminated_at=termination(ctx, attempt, status),
                    # The cloud ended it; gpuopt's own terminate was recorded at the call.
                    terminated_by="cloud" if preempted else None,
                    instance_gone=True,
                    preempted=preempted,
                )
            elif launched is not None:
                ctx.store.jobs.record_billing(attempt.key, launched_at=launched)

    # -- moving running jobs ---------------------------------------------------------------------

    def _plan(
        self,
        ctx: ReconcileContext,
        live: list[JobRecord],
        attempts: dict[int, list[AttemptRecord]],
    ) -> Plan:
        """The pass's moves (migration.plan over what migration_inputs gathers); the moves it
        holds back are logged once per reason. A policy or job that cannot be gathered is left
        out (a `policy.skipped` event once per reason, for a policy), and a plan that raises
        moves nothing this pass: the jobs themselves are still reconciled."""
        try:
            inputs = gather(
                ctx.store,
                live,
                attempts,
                {name: p.policy for name, p in ctx.policies.items()},
                ctx.now,
                overheads=self._overheads,
                probe_window=self.probe_window,
                in_force=self.in_force,
                window_name=self.window_name,
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
            self._complain("planning moves", exc)
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
            self._complain(f"gathering job {names.get(job_id, job_id)} for moves", ValueError(why))
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

    def _migrate(
        self,
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
        move that did not happen, which the next pass undoes (`_abandon`). A launch that finds
        no capacity leaves the job where it was, with no event."""
        launch = Launch(avoid=frozenset({current.pool}), only=frozenset(move.targets))
        launched, why = self.launcher.walk(ctx, job, launch, policy, strategy)
        if not launched:
            self._flush(ctx)  # what the failed launches raised
            log.info("job %s: not moved (%s): %s", job.name, move.reason.value, why)
            return
        subject = ctx.store.jobs.attempts(job.id)[-1]  # the one just launched
        forced = move.reason in (Reason.BID_CAP, Reason.NOT_ALLOWED)
        told = f"moved ({move.reason.value}): {move.message}; {why}"
        events = [*self._buffer]
        self._buffer.clear()
        events.append(
            self._draft(
                ctx,
                job,
                Alert(
                    EventKind.JOB_MIGRATED,
                    "warning" if forced else "info",
                    f"job {job.name}: {move.message}",
                    data=(
                        ("reason", move.reason.value),
                        ("from_pool", _pool_text(current.pool)),
                        ("to_pool", _pool_text(subject.pool)),
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
                    **_attempt_fields(subject),
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
            attempts={current.key: {"ended_at": ctx.now, "end_reason": MIGRATED, "state": "ended"}},
        )
        if moved is None:
            # Nothing was written: the next pass drops the attempt just launched (`_abandon`).
            log.info("job %s changed while it was being moved; deciding again next pass", job.name)

    # -- one job -------------------------------------------------------------------------------

    def _job(
        self,
        ctx: ReconcileContext,
        job: JobRecord,
        attempts: list[AttemptRecord],
        move: Move | None = None,
    ) -> None:
        current = next((a for a in reversed(attempts) if not a.ended), None)
        nodes = gang_rows(attempts, current)
        if nodes:
            current = nodes[0]
        loaded = ctx.policies.get(job.policy)
        if loaded is None:
            self._emit(
                ctx,
                job,
                Alert(EventKind.JOB_POLICY_MISSING, "error", f"policy {job.policy} is not loaded"),
                dedupe=f"job:{job.id}:no-policy",
            )
            return
        # The plain policy in force now: a schedule window's markets, bid, placement and
        # rank_by in place of the top-level ones while it is in force.
        policy = effective(loaded.policy, ctx.now)
        strategy = strategy_for(policy, max_restarts=job.spec.get("max_restarts"))
        unlaunched = [a for a in nodes if a.instance_id is None and a.state == "launching"]
        if unlaunched:
            # A launch that did not finish (throttled, or the daemon died mid-call): retry it
            # with the same key, so the provider hands back the instance if it exists (every
            # node of a gang not launched yet, in rank order).
            outcome = LaunchOutcome.LAUNCHED
            for row in unlaunched:
                outcome = self.launcher.launch(ctx, job, row, strategy)
                if outcome is not LaunchOutcome.LAUNCHED:
                    break
            if len(nodes) > 1 and outcome is not LaunchOutcome.LAUNCHED and not outcome.pending:
                self.launcher.tear_down(ctx, job, nodes, why=f"a node failed: {outcome.value}")
            self._flush(ctx)
            if outcome is not LaunchOutcome.LAUNCHED:
                # Still pending (throttled, or this replica stopped leading): next pass or the
                # new leader. Ended (an error): the next pass decides without it.
                return
            # Launched: move the job on in this pass rather than at the next tick.
            attempts = ctx.store.jobs.attempts(job.id)
            current = next((a for a in reversed(attempts) if not a.ended), None)
            nodes = gang_rows(attempts, current)
            if nodes:
                current = nodes[0]
        if current is not None and self._abandon(ctx, job, attempts, nodes):
            return
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
            migrations=sum(1 for a in attempts if a.end_reason == MIGRATED),
            finished_on=finished_earlier(ctx.store, attempts, nodes),
        )
        stop: PolicyStop | None = None
        rules = rules_for(policy, job.spec)
        if rules and current is not None and current.job_started_at is not None:
            stop = self._watch(ctx, job, current, attempts, rules)
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
            self._migrate(ctx, job, current, move, policy, strategy)
            return
        self._apply(ctx, job, current, decision, policy, strategy, nodes=nodes)

    def _abandon(
        self,
        ctx: ReconcileContext,
        job: JobRecord,
        attempts: list[AttemptRecord],
        nodes: list[AttemptRecord],
    ) -> bool:
        """Undo a move that never committed: the daemon stopped after launching the next
        attempt (`nodes`) and before the transaction that ends the older one and records the
        `job.migrated` event (`_migrate`). The job still runs on the older attempt, which
        stays; the newer one is ended and its instance terminated, and a later pass may
        decide the move again. True when it did so (the pass decides again next time)."""
        head = head_number(nodes[0].number, nodes[0].gang)
        older = [a for a in attempts if not a.ended and head_number(a.number, a.gang) < head]
        if not older:
            return False
        for node in nodes:
            ctx.store.jobs.update_attempt(
                node.key, state="ended", ended_at=ctx.now, end_reason=ABANDONED
            )
            if node.instance_id is not None:
                self._terminate(ctx, node.key)
        log.warning(
            "job %s: attempt %d was launched for a move that did not commit; ended it, the job "
            "runs on attempt %d",
            job.name,
            head,
            older[-1].number,
        )
        return True

    def _watch(
        self,
        ctx: ReconcileContext,
        job: JobRecord,
        current: AttemptRecord,
        attempts: list[AttemptRecord],
        rules: Rules,
    ) -> PolicyStop | None:
        """Hold a running attempt to its utilization rules and max_duration: queue an
        `job.underused` event per alert rule's window, and say why to stop, if a rule does."""
        if current.ended or current.exit_code is not None or current.job_started_at is None:
            return None
        started = current.job_started_at
        first = min(a.job_started_at for a in attempts if a.job_started_at is not None)
        longest = max((r.window for r in rules.rules), default=timedelta(0))
        samples = gpu_samples(ctx.store, current.id, since=max(started, ctx.now - longest))
        alerted = {
            r.name: at
            for r in rules.rules
            if r.action == "alert"
            and (at := self._last_alert(ctx, job, current, r.name)) is not None
        }
        verdict = watch(
            rules,
            samples,
            started_at=started,
            first_started_at=first,
            now=ctx.now,
            alerted=alerted,
        )
        for fired in verdict.alerts:
            self._alerted[(current.key, fired.rule.name)] = fired.end
            window_start = fired.start.isoformat()
            self._emit(
                ctx,
                job,
                Alert(
                    EventKind.JOB_UNDERUSED,
                    "warning",
                    f"job {job.name}: {fired.message}",
                    data=(
                        ("rule", fired.rule.name),
                        ("below", fired.rule.below),
                        ("window_s", fired.rule.window.total_seconds()),
                        ("window_start", window_start),
                        ("window_end", fired.end.isoformat()),
                        ("peak", round(fired.peak, 4)),
                    ),
                ),
                dedupe=f"attempt:{current.key}:underused:{fired.rule.name}:{window_start}",
                attempt=current,
            )
        if verdict.stop is None or verdict.stopped_by is None:
            return None
        return PolicyStop(verdict.stopped_by, verdict.stop)

    def _last_alert(
        self, ctx: ReconcileContext, job: JobRecord, attempt: AttemptRecord, rule: str
    ) -> datetime | None:
        """The end of the window `rule` last alerted on for the attempt (None: never)."""
        key = (attempt.key, rule)
        if key not in self._alerted:
            found = [
                e
                for e in ctx.store.events.list_events(
                    kind=EventKind.JOB_UNDERUSED, job_id=job.id, limit=100
                )
                if (e.data or {}).get("attempt") == attempt.number
                and (e.data or {}).get("rule") == rule
            ]
            end = str((found[0].data or {})["window_end"]) if found else None
            self._alerted[key] = None if end is None else datetime.fromisoformat(end)
        return self._alerted[key]

    def _apply(
        self,
        ctx: ReconcileContext,
        job: JobRecord,
        current: AttemptRecord | None,
        decision: Decision,
        policy: Policy | None,
        strategy: Strategy | None,
        *,
        nodes: list[AttemptRecord] | None = None,
    ) -> None:
        """Apply a decision; `policy` and `strategy` are needed only by one that launches."""
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
                    self._terminate(ctx, key)
            elif isinstance(action, Cooldown):
                ctx.store.jobs.add_cooldown(action.pool, action.until, action.reason)
            elif isinstance(action, Alert):
                events.append(self._draft(ctx, job, action, attempt=current))
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
                    state="ended",
                    **ended,
                )
        state, reason = decision.state, decision.reason
        subject = current  # the attempt the transition is about
        if launch is not None:
            assert policy is not None and strategy is not None, "a launch needs its policy"
            launched, why = self.launcher.walk(ctx, job, launch, policy, strategy)
            if launched:
                state = JobState.PROVISIONING
                reason = why if decision.state is JobState.PENDING else f"{reason}; {why}"
                subject = gang_head(ctx.store.jobs.attempts(job.id))  # the one just launched
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
                        data={
                            "job": job.given_name,
                            **_attempt_fields(subject),
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

    # -- acting --------------------------------------------------------------------------------

    def _terminate(self, ctx: ReconcileContext, key: str) -> Asked:
        """Ask the cloud to end the attempt's instance: `asked` (or nothing left to ask),
        `failed` (the call failed; a later pass asks again) or `unavailable` (no provider
        here to ask)."""
        attempt = ctx.store.jobs.attempt(key)
        if attempt is None or attempt.instance_id is None or attempt.instance_gone:
            return "asked"
        source = self.launcher.provider(ctx, attempt.provider)
        if source is None:
            return "unavailable"
        ref = InstanceRef(attempt.provider, attempt.region, attempt.zone, attempt.instance_id)
        try:
            source.terminate(ref)
        except ProviderError as exc:
            log.warning("terminate %s failed: %s", attempt.instance_id, exc)
            return "failed"
        # Who ends an instance decides what it costs (a spot instance the cloud interrupts in
        # its first hour is free on AWS; one terminated by its owner is not): recorded now,
        # unless the cloud was already known to have ended it.
        ctx.store.jobs.record_billing(key, terminated_by="gpuopt")
        return "asked"

    def _clean_up(self, ctx: ReconcileContext) -> None:
        """Terminate instances of ended attempts once their job exited or the grace passed,
        and open attempts of jobs that ended while their attempt stayed open (a state write
        from elsewhere; cancels are decided in a pass and end the attempt themselves)."""
        live = {job.id for job in ctx.jobs if JobState(job.state) in LIVE}
        jobs = {job.id: job for job in ctx.jobs}
        attempts = ctx.store.jobs.open_attempts()
        opened = [a for a in attempts if not a.ended]
        for attempt in attempts:
            try:
                self._clean_up_one(ctx, attempt, live, jobs, opened)
            except UNREACHABLE:
                raise
            except Exception as exc:  # the other attempts are still cleaned up
                self._complain(f"cleaning up attempt {attempt.key}", exc)

    def _clean_up_one(
        self,
        ctx: ReconcileContext,
        attempt: AttemptRecord,
        live: set[int],
        jobs: dict[int, JobRecord],
        opened: list[AttemptRecord],
    ) -> None:
        """One attempt's part of `_clean_up`."""
        if attempt.instance_id is None:
            return
        if not attempt.ended and attempt.job_id not in live:
            asked = self._terminate(ctx, attempt.key)
            # Its end (and the time the provider reports for it) comes from describe; a
            # failed call is asked again as a leftover.
            gone = {"instance_gone": True} if asked == "unavailable" else {}
            ctx.store.jobs.update_attempt(
                attempt.key, state="ended", ended_at=ctx.now, end_reason="user", **gone
            )
            return
        if not attempt.ended:
            return
        # (A finished job's instance was terminated as it ended: skipped below once that
        # call went through, asked again here when it failed.)
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
            return  # its instance is left to the stop's grace
        action = reclaim(
            old,
            stop_sent_at=attempt.stop_sent_at,
            now=ctx.now,
            grace=STOP_GRACE,
            free_window=free_window(attempt),
            preempting=preempting(ctx.store, attempt),
        )
        if isinstance(action, LeaveToCloud):
            self._leave_to_cloud(ctx, attempt, action, jobs.get(attempt.job_id))
        elif (
            isinstance(action, Terminate)
            and attempt.terminated_by != "gpuopt"  # else asked: describe brings the end
            and self._terminate(ctx, attempt.key) == "unavailable"
        ):
            ctx.store.jobs.update_attempt(attempt.key, instance_gone=True)

    def _leave_to_cloud(
        self,
        ctx: ReconcileContext,
        attempt: AttemptRecord,
        leave: LeaveToCloud,
        job: JobRecord | None,
    ) -> None:
        """Record once (an event) that gpuopt leaves the instance for the cloud to end."""
        if attempt.key in self._left:
            return
        kind = EventKind.JOB_INSTANCE_LEFT_TO_CLOUD
        earlier = ctx.store.events.list_events(kind=kind, job_id=attempt.job_id, limit=100)
        if not any(_attempt_key(e.data) == attempt.key for e in earlier):
            job = job or ctx.store.jobs.get_job_by_id(attempt.job_id)
            name = job.name if job is not None else str(attempt.job_id)
            at = leave.at.isoformat(timespec="seconds")
            event = ctx.emitter.draft(
                kind,
                f"job {name}: instance {attempt.instance_id} of attempt {attempt.number} is "
                f"left for the cloud to end at {at} ({leave.reason})",
                policy=job.policy if job is not None else None,
                data={
                    "job": name,
                    **_attempt_fields(attempt),
                    "attempt_key": attempt.key,
                    "power_off_at": leave.at.isoformat(),
                    "reason": leave.reason,
                },
                dedupe_key=f"attempt:{attempt.key}:left-to-cloud",
            )
            ctx.store.events.record_events([replace(event, job_id=attempt.job_id)], ctx.now)
            log.info("leaving %s to the cloud: %s", attempt.instance_id, leave.reason)
        self._left.add(attempt.key)

    # -- events --------------------------------------------------------------------------------

    def _draft(
        self,
        ctx: ReconcileContext,
        job: JobRecord,
        alert: Alert,
        dedupe: str | None = None,
        attempt: AttemptRecord | None = None,
    ) -> NewEvent:
        data: dict[str, Any] = {"job": job.given_name, **_attempt_fields(attempt)}
        data.update(alert.data)
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
        self,
        ctx: ReconcileContext,
        job: JobRecord,
        alert: Alert,
        dedupe: str | None = None,
        attempt: AttemptRecord | None = None,
    ) -> None:
        """Queue an event for the job's transition (or the next flush)."""
        drafted = self._draft(ctx, job, alert, dedupe, attempt)
        self._buffer.append(replace(drafted, job_id=job.id))

    def _flush(self, ctx: ReconcileContext) -> None:
        if self._buffer:
            events, self._buffer = self._buffer, []
            ctx.store.events.record_events(events, ctx.now)


def _pool_text(pool: tuple[str, str, str | None, str, str]) -> str:
    """A pool as events name it: provider/region/zone/type/market (`-` for no zone)."""
    provider, region, zone, kind, market = pool
    return "/".join((provider, region, zone or "-", kind, market))


def _attempt_key(data: dict[str, Any] | None) -> object:
    """The attempt key a `job.instance_left_to_cloud` event names (`attempt` held the key in
    events recorded before `attempt` became the number)."""
    data = data or {}
    return data.get("attempt_key", data.get("attempt"))


def _attempt_fields(attempt: AttemptRecord | None) -> dict[str, Any]:
    """An event's `attempt` (its number) and `instance` (once known), for its data."""
    if attempt is None:
        return {}
    fields: dict[str, Any] = {"attempt": head_number(attempt.number, attempt.gang)}
    if attempt.nodes > 1:
        fields["nodes"] = attempt.nodes  # one attempt of N instances (rank 0's is `instance`)
    if attempt.instance_id:
        fields["instance"] = attempt.instance_id
    return fields


def gang_rows(attempts: list[AttemptRecord], current: AttemptRecord | None) -> list[AttemptRecord]:
    """The rows of `current`'s attempt, rank 0 first ([current] for a single node)."""
    if current is None:
        return []
    if current.gang is None:
        return [current]
    rows = [a for a in attempts if a.gang == current.gang]
    return sorted(rows, key=lambda a: a.node_rank)


def gang_head(attempts: list[AttemptRecord]) -> AttemptRecord:
    """The newest attempt's rank-0 row."""
    last = attempts[-1]
    return gang_rows(attempts, last)[0]


def gang_view(store: Store, nodes: list[AttemptRecord]) -> AttemptView:
    """The attempt as the state machine sees it: a gang folded into one (gang.fold)."""
    views = [attempt_view(n, power_off_at=power_off_at(store, n)) for n in nodes]
    if len(nodes) == 1:
        return attempt_view(nodes[0])
    internode = {n.node_rank: (n.internode_status, n.internode_reason) for n in nodes}
    return fold(views, internode=internode)


def _notices(store: Store, a: AttemptRecord) -> list[dict[str, Any]]:
    if a.notice_at is None:
        return []
    return [e for e in store.jobs.agent_events(a.key) if e["kind"] == "interruption_notice"]


def power_off_at(store: Store, a: AttemptRecord) -> datetime | None:
    """When the instance of an attempt with an interruption notice goes (None: no notice)."""
    times = [power_off_time(e["data"], e["at"]) for e in _notices(store, a)]
    return min((t for t in times if t is not None), default=None)


def preempting(store: Store, a: AttemptRecord) -> bool:
    """Whether a notice says the cloud is already ending the instance, rather than announcing
    an end: GCP's `preempted` comes with the VM's soft power-off, and the VM is stopped 30 s
    later (Compute Engine's Spot VM preemption process), whatever gpuopt does."""
    return any(e["data"].get("action") == "preempted" for e in _notices(store, a))


def free_window(a: AttemptRecord) -> timedelta | None:
    """How soon after its launch a spot instance the cloud interrupts costs nothing on the
    attempt's provider (optimizer/costs/billing.py); None for on-demand."""
    if a.market != Market.SPOT.value:
        return None
    seconds = rule_for(a.provider).interrupted_free_s
    return None if seconds is None else timedelta(seconds=seconds)


def termination(ctx: ReconcileContext, a: AttemptRecord, status: InstanceStatus) -> datetime:
    """When an instance the provider reports terminated ended: the provider's own time; for
    one the cloud interrupted without saying when, the power-off its notice announced (AWS's
    notice names the action's time); else now, when gpuopt saw it gone (docs/costs.md)."""
    if status.terminated_at is not None:
        return status.terminated_at
    if status.end_reason is EndReason.PREEMPTED:
        announced = power_off_at(ctx.store, a)
        if announced is not None and announced <= ctx.now:
            return announced
    return ctx.now


def gpu_samples(store: Store, attempt_id: int, *, since: datetime) -> list[Sample]:
    """An attempt's GPU readings (`gpu_sample`) whose span ends after `since`, oldest first."""
    table = GpuSample.__table__  # type: ignore[attr-defined]
    # Spans are at most an hour (the downsampled rows): any that ends after `since` starts
    # after `since - 1 h`.
    query = (
        select(table.c.start, table.c.span_s, table.c.util_mean)
        .where(table.c.attempt_id == attempt_id, table.c.start > since - timedelta(hours=1))
        .order_by(table.c.start)
    )
    with store.engine.connect() as conn:
        rows = conn.execute(query).all()
    samples = []
    for start, span_s, util in rows:
        start = start if start.tzinfo is not None else start.replace(tzinfo=UTC)
        sample = Sample(start, timedelta(seconds=span_s), util)
        if sample.end > since:
            samples.append(sample)
    return samples


HANDED_OVER = frozenset({Failure.PREEMPTED.value, MIGRATED})  # ends that leave the job running


def finished_keys(store: Store, attempts: list[AttemptRecord]) -> frozenset[str]:
    """The attempts among `attempts` ended by a handover (a notice, a move) whose job then
    exited 0 on its own: its agent's `job_exited` says no stop reached it (rank 0's, for a
    gang). Reads the agents' reports only for attempts that exited 0 after such an end."""
    exited = [
        a.key
        for a in attempts
        if a.ended and a.exit_code == 0 and a.end_reason in HANDED_OVER and a.node_rank == 0
    ]
    if not exited:
        return frozenset()
    reports = store.jobs.exit_reports(exited)
    return frozenset(
        key
        for key, data in reports.items()
        if data.get("exit_code") == 0 and data.get("stopped") is False and not data.get("adopted")
    )


def finished_earlier(
    store: Store, attempts: list[AttemptRecord], current: list[AttemptRecord]
) -> int | None:
    """The attempt (its number) on which the job finished during its handover, if it did
    (`machine.finished_on`): an earlier one than `current`'s rows."""
    mine = {a.key for a in current}
    done = finished_keys(store, [a for a in attempts if a.key not in mine])
    if not done:
        return None
    heads = [attempt_view(a, finished=a.key in done) for a in attempts if a.node_rank == 0]
    found = finished_on(heads)
    return None if found is None else found.number


def attempt_view(
    a: AttemptRecord, *, power_off_at: datetime | None = None, finished: bool = False
) -> AttemptView:
    """An attempt as the state machine sees it (`finished`: see `finished_keys`)."""
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
        instance_launched_at=a.launched_at,
        migrated=a.end_reason == MIGRATED,
        finished=finished,
    )


__all__ = [
    "JobReconciler",
    "attempt_view",
    "finished_keys",
    "free_window",
    "power_off_at",
    "preempting",
    "termination",
]
