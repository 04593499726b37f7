"""The managed-jobs reconciler: applies the state machine's decisions through the providers.

Each pass, for every live job: fold the current attempt from the store (what its agent
reported) and the provider's describe, ask `machine.decide`, and apply the actions — launch
on the best offer the policy allows (minus pools in cooldown and pools the decision avoids),
stop, terminate, cool a pool down, alert — recording the transition and its events in one
transaction. Launch errors are typed: capacity → next offer now with the pool cooled down;
quota → the provider/region skipped for an hour with an alert; throttled → retry next pass
with the same idempotency key; auth → the provider skipped with an alert.
"""

from __future__ import annotations

import logging
import secrets
import sys
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from optimizer.jobs import budget
from optimizer.jobs.bootstrap import DEFAULT_INSTALL, bootstrap_script
from optimizer.jobs.context import ReconcileContext
from optimizer.jobs.machine import (
    LIVE,
    Alert,
    AttemptView,
    Cooldown,
    Decision,
    JobState,
    JobView,
    Launch,
    Recovery,
    Stop,
    Terminate,
    decide,
    describe_pool,
    leftover,
)
from optimizer.model import Market, Offer
from optimizer.store.jobs import AttemptRecord, token_sha256
from optimizer.store.tables import JobRecord, NewEvent
from policies.engine import evaluate
from providers.base import (
    AuthError,
    CapacityError,
    EndReason,
    InstanceRef,
    InstanceState,
    LaunchSpec,
    ProviderError,
    QuotaError,
    ThrottledError,
)

log = logging.getLogger(__name__)

QUOTA_COOLDOWN = timedelta(hours=1)
AUTH_DISABLE = timedelta(hours=1)  # a provider that refused our credentials sits out this long
STOP_GRACE = timedelta(seconds=45)
MAX_OFFERS_TRIED = 25  # per launch, so a run of capacity errors ends in a clear pending reason


class JobReconciler:
    """The daemon's reconciler of managed jobs (a `Reconciler`, optimizer/jobs/context.py)."""

    name = "jobs"

    def __init__(
        self,
        daemon_url: Callable[[], str],
        *,
        install: Mapping[str, str | None] | None = None,
        agent_env: Mapping[str, str] | None = None,
        register_timeout: timedelta = timedelta(minutes=10),
    ) -> None:
        self.daemon_url = daemon_url
        # How each cloud's bootstrap gets gpuopt: the local cloud already has it.
        self.install = {"local": None, **(install or {})}
        self.agent_env = dict(agent_env or {})
        self.register_timeout = register_timeout
        self.disabled: dict[str, datetime] = {}  # provider -> until, after an AuthError
        # Events raised while acting on a job, recorded with its transition (one transaction).
        self._buffer: list[NewEvent] = []

    def __call__(self, ctx: ReconcileContext) -> None:
        # Provider event queues (AWS EventBridge → SQS) are read by their own loop
        # (optimizer/daemon/loops/queue.py), which records notices and wakes this one.
        self._describe(ctx, ctx.store.open_attempts())
        self._buffer.clear()
        live = [job for job in ctx.jobs if JobState(job.state) in LIVE]
        # Read after describe, which may have ended attempts.
        attempts = ctx.store.attempts_of(job.id for job in live)
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
            source = self._provider(ctx, provider)
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
                    ctx.store.update_attempt(
                        keys[status.ref.instance_id],
                        instance_gone=True,
                        preempted=status.end_reason is EndReason.PREEMPTED,
                    )

    def _provider(self, ctx: ReconcileContext, name: str) -> Any:
        until = self.disabled.get(name)
        if until is not None and ctx.now < until:
            return None
        handle = ctx.providers.get(name)
        if handle is None:
            return None
        try:
            source = handle.source()
        except ProviderError:
            return None
        return source if hasattr(source, "launch") else None

    # -- one job -------------------------------------------------------------------------------

    def _job(self, ctx: ReconcileContext, job: JobRecord, attempts: list[AttemptRecord]) -> None:
        current = next((a for a in reversed(attempts) if not a.ended), None)
        loaded = ctx.policies.get(job.policy)
        if loaded is None:
            self._emit(
                ctx,
                job,
                Alert("job.no_policy", "error", f"policy {job.policy} is not loaded"),
                dedupe=f"job:{job.id}:no-policy",
            )
            return
        policy = loaded.policy
        recovery = Recovery(
            max_restarts=(
                job.spec["max_restarts"]
                if job.spec.get("max_restarts") is not None
                else policy.recovery.max_restarts
            ),
            pool_cooldown=timedelta(minutes=policy.recovery.pool_cooldown_minutes),
            on_demand_after_interruptions=policy.recovery.on_demand_after_interruptions,
            on_demand_allowed="on_demand" in policy.markets,
            register_timeout=self.register_timeout,
        )
        if current is not None and current.instance_id is None and current.state == "launching":
            # A launch that did not finish (throttled, or the daemon died mid-call): retry it
            # with the same key, so the provider hands back the instance if it exists.
            outcome = self._launch_attempt(ctx, job, current, loaded.policy)
            self._flush(ctx)
            if outcome != "launched":
                return
            # Launched: move the job on in this pass rather than at the next tick.
            attempts = ctx.store.attempts(job.id)
            current = next((a for a in reversed(attempts) if not a.ended), None)
        view = JobView(
            id=job.id,
            name=job.name,
            state=JobState(job.state),
            restarts=job.restarts,
            probes=job.spec.get("probes", "quick"),
            interruptions=tuple(
                a.ended_at for a in attempts if a.end_reason == "preempted" and a.ended_at
            ),
        )
        decision = decide(view, _view(current) if current else None, now=ctx.now, recovery=recovery)
        self._apply(ctx, job, current, decision, policy)

    def _apply(
        self,
        ctx: ReconcileContext,
        job: JobRecord,
        current: AttemptRecord | None,
        decision: Decision,
        policy: Any,
    ) -> None:
        events: list[NewEvent] = []
        launch: Launch | None = None
        for action in decision.actions:
            if isinstance(action, Stop):
                ctx.store.update_attempt(action.key, stop_sent_at=ctx.now)
            elif isinstance(action, Terminate):
                self._terminate(ctx, action.key)
            elif isinstance(action, Cooldown):
                ctx.store.add_cooldown(action.pool, action.until, action.reason)
            elif isinstance(action, Alert):
                events.append(self._draft(ctx, job, action))
            elif isinstance(action, Launch):
                launch = action
        if current is not None and decision.end_attempt is not None:
            ctx.store.update_attempt(
                current.key, ended_at=ctx.now, end_reason=decision.end_attempt, state="ended"
            )
        state, reason = decision.state, decision.reason
        if launch is not None:
            launched, why = self._launch(ctx, job, launch, policy)
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
                            Alert("job.pending", "warning", f"job {job.name}: {why}"),
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
                        "job.state",
                        f"job {job.name}: {job.state} → {state.value} ({reason})",
                        policy=job.policy,
                        data={"from": job.state, "to": state.value, "reason": reason},
                    )
                )
            ctx.store.transition_job(
                job.id,
                state=state.value,
                reason=reason,
                restarts=decision.restarts,
                events=events,
                at=ctx.now,
            )

    # -- actions -------------------------------------------------------------------------------

    def _launch(
        self, ctx: ReconcileContext, job: JobRecord, launch: Launch, policy: Any
    ) -> tuple[bool, str]:
        """Launch the next attempt on the best allowed offer: (launched, why not)."""
        if launch.markets is not None:
            policy = policy.model_copy(update={"markets": [m.value for m in launch.markets]})
        avoid = set(launch.avoid) | ctx.store.cooled_pools(ctx.now)
        # An attempt records the zone its instance landed in, but a regional offer (on-demand
        # prices are per region) has no zone: avoid the offer's own, regional pool too.
        avoid |= {(p, r, None, t, m) for p, r, _zone, t, m in avoid}
        offers = [o for o in ctx.store.latest_offers() if _pool(o) not in avoid]
        ranking = evaluate(policy, offers, ctx.now)
        if not ranking.candidates:
            top = ", ".join(
                f"{rule} ({len(r)})" for rule, r in ranking.rejections_by_rule().items()
            )
            return False, f"no offer meets policy {job.policy}" + (
                f": rejected by {top}" if top else ""
            )
        candidates = list(ranking.candidates)
        cap = policy.budget.monthly_usd
        if cap is not None:
            start, _ = budget.month_bounds(ctx.now)
            spent = budget.spent_this_month(
                (
                    budget.Spend(a.started_at, a.ended_at, a.usd_per_hour)
                    for a in ctx.store.policy_attempts(job.policy, start)
                ),
                ctx.now,
            )
            candidates = [
                c
                for c in candidates
                if budget.projected(spent, c.offer.usd_per_hour, ctx.now) <= cap
            ]
            if not candidates:
                cheapest = min(c.offer.usd_per_hour for c in ranking.candidates)
                need = budget.projected(spent, cheapest, ctx.now)
                return False, (
                    f"budget: ${spent:,.2f} spent this month under policy {job.policy}; the "
                    f"cheapest launch projects ${need:,.2f} > ${cap:,.2f}"
                )
            first = budget.projected(spent, candidates[0].offer.usd_per_hour, ctx.now)
            if first > budget.ALERT_FRACTION * cap:
                self._emit(
                    ctx,
                    job,
                    Alert(
                        "budget.warning",
                        "warning",
                        f"policy {job.policy}: projected ${first:,.2f} this month is over "
                        f"{budget.ALERT_FRACTION:.0%} of ${cap:,.2f}",
                    ),
                    dedupe=f"budget:{job.policy}:{ctx.now:%Y-%m}",
                )
        skip_scopes: set[tuple[str, str]] = set()
        number = len(ctx.store.attempts(job.id)) + 1
        for candidate in candidates[:MAX_OFFERS_TRIED]:
            offer = candidate.offer
            if (offer.provider, offer.region) in skip_scopes:
                continue
            if self._provider(ctx, offer.provider) is None:
                skip_scopes.add((offer.provider, offer.region))
                continue
            if not ctx.leading():
                return False, "this replica stopped leading; the new leader launches"
            key = f"{job.id}-{number}"
            token = secrets.token_urlsafe(32)
            attempt = ctx.store.create_attempt(
                job.id, number, key, offer, token_sha256(token), ctx.now
            )
            outcome = self._launch_attempt(ctx, job, attempt, policy, token=token, offer=offer)
            where = (
                f"attempt {number} on {describe_pool(attempt.pool)} at ${offer.usd_per_hour:.4f}/h"
            )
            if outcome == "launched":
                return True, f"launched {where}"
            if outcome == "throttled":  # the attempt stays 'launching'; retried next pass
                return True, f"launching {where} (throttled; retrying)"
            if outcome in ("quota", "auth"):
                skip_scopes.add((offer.provider, offer.region))
            number += 1
        return False, f"every offer under policy {job.policy} failed to launch (see events)"

    def _launch_attempt(
        self,
        ctx: ReconcileContext,
        job: JobRecord,
        attempt: AttemptRecord,
        policy: Any,
        *,
        token: str | None = None,
        offer: Offer | None = None,
    ) -> str:
        source = self._provider(ctx, attempt.provider)
        if source is None:
            ctx.store.update_attempt(
                attempt.key,
                state="ended",
                ended_at=ctx.now,
                end_reason="provider unavailable",
                instance_gone=True,
            )
            return "auth"
        if token is None:  # a retry: the old token is unknown, so issue a new one
            token = secrets.token_urlsafe(32)
            ctx.store.update_attempt(attempt.key, token_sha256=token_sha256(token))
        if offer is None:
            try:
                offer = _offer_of(ctx, attempt)
            except ProviderError:
                self._end(ctx, attempt, "offer gone")
                return "error"
        spec = LaunchSpec(
            job=job.name,
            attempt=attempt.number,
            bootstrap=self._bootstrap(attempt, token),
            max_usd_per_hour=None,
        )
        pool = attempt.pool
        if not ctx.leading():
            # Lost the lease mid-pass: leave the attempt 'launching' for the new leader, which
            # retries it with the same idempotency key.
            return "throttled"
        try:
            ref = source.launch(offer, spec, attempt.key)
        except CapacityError as exc:
            until = ctx.now + timedelta(minutes=policy.recovery.pool_cooldown_minutes)
            ctx.store.add_cooldown(pool, until, f"no capacity: {exc}")
            self._end(ctx, attempt, "capacity")
            self._emit(
                ctx,
                job,
                Alert(
                    "job.launch_failed",
                    "info",
                    f"no capacity on {describe_pool(pool)}; trying the next offer",
                ),
            )
            return "capacity"
        except QuotaError as exc:
            self._end(ctx, attempt, "quota")
            self._emit(
                ctx,
                job,
                Alert(
                    "provider.quota",
                    "warning",
                    f"quota on {attempt.provider} {attempt.region}: {exc}",
                ),
                dedupe=f"quota:{attempt.provider}:{attempt.region}",
            )
            ctx.store.add_cooldown(pool, ctx.now + QUOTA_COOLDOWN, f"quota: {exc}")
            return "quota"
        except ThrottledError:
            return "throttled"
        except AuthError as exc:
            self.disabled[attempt.provider] = ctx.now + AUTH_DISABLE
            self._end(ctx, attempt, "auth")
            self._emit(
                ctx,
                job,
                Alert(
                    "provider.auth",
                    "error",
                    f"{attempt.provider} refused the launch: {exc}; no launches on "
                    f"{attempt.provider} for {AUTH_DISABLE.total_seconds() / 3600:g} h",
                ),
                dedupe=f"auth:{attempt.provider}",
            )
            return "auth"
        except ProviderError as exc:
            self._end(ctx, attempt, "launch_error")
            self._emit(
                ctx,
                job,
                Alert(
                    "job.launch_failed", "warning", f"launch on {describe_pool(pool)} failed: {exc}"
                ),
            )
            return "error"
        ctx.store.update_attempt(
            attempt.key,
            instance_id=ref.instance_id,
            state="launched",
            zone=ref.zone or attempt.zone,
        )
        return "launched"

    def _bootstrap(self, attempt: AttemptRecord, token: str) -> str:
        local = attempt.provider == "local"
        return bootstrap_script(
            daemon_url=self.daemon_url(),
            token=token,
            attempt_key=attempt.key,
            cloud=attempt.provider,
            install=self.install.get(attempt.provider, DEFAULT_INSTALL),
            python=sys.executable if local else None,
            env=self.agent_env,
        )

    def _terminate(self, ctx: ReconcileContext, key: str) -> None:
        attempt = ctx.store.attempt(key)
        if attempt is None or attempt.instance_id is None or attempt.instance_gone:
            return
        source = self._provider(ctx, attempt.provider)
        if source is None:
            return
        ref = InstanceRef(attempt.provider, attempt.region, attempt.zone, attempt.instance_id)
        try:
            source.terminate(ref)
        except ProviderError as exc:
            log.warning("terminate %s failed: %s", attempt.instance_id, exc)

    def _end(self, ctx: ReconcileContext, attempt: AttemptRecord, why: str) -> None:
        ctx.store.update_attempt(
            attempt.key,
            state="ended",
            ended_at=ctx.now,
            end_reason=why,
            instance_gone=attempt.instance_id is None,
        )

    def _clean_up(self, ctx: ReconcileContext) -> None:
        """Terminate instances of ended attempts once their job exited or the grace passed,
        and those of jobs that ended outside a pass (cancelled through the API)."""
        live = {job.id for job in ctx.jobs if JobState(job.state) in LIVE}
        for attempt in ctx.store.open_attempts():
            if attempt.instance_id is None:
                continue
            if not attempt.ended and attempt.job_id not in live:
                self._terminate(ctx, attempt.key)
                ctx.store.update_attempt(
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
            action = leftover(
                _view(attempt), stop_sent_at=attempt.stop_sent_at, now=ctx.now, grace=STOP_GRACE
            )
            if action is not None:
                self._terminate(ctx, attempt.key)
                ctx.store.update_attempt(attempt.key, instance_gone=True)

    # -- events --------------------------------------------------------------------------------

    def _draft(
        self, ctx: ReconcileContext, job: JobRecord, alert: Alert, dedupe: str | None = None
    ) -> NewEvent:
        return ctx.emitter.draft(
            alert.kind,
            alert.message,
            severity=alert.severity,
            policy=job.policy,
            data={"job": job.name},
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
            ctx.store.record_events(events, ctx.now)


def _pool(offer: Offer) -> tuple[str, str, str | None, str, str]:
    return (offer.provider, offer.region, offer.zone, offer.instance_type, offer.market.value)


def _view(a: AttemptRecord) -> AttemptView:
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
    )


def _offer_of(ctx: ReconcileContext, attempt: AttemptRecord) -> Offer:
    """The offer an attempt was placed on, from the latest prices (or rebuilt from the row)."""
    for offer in ctx.store.latest_offers(provider=attempt.provider, region=attempt.region):
        if _pool(offer) == attempt.pool:
            return offer
    raise ProviderError(
        f"no current offer for {describe_pool(attempt.pool)}", provider=attempt.provider
    )


__all__ = ["JobReconciler", "Market"]
