"""Launching an attempt: the walk over the ranked offers, and one launch call with its outcome.

`Launcher.walk` takes the offers the policy ranks (`ranking.launch_ranking`, which
`GET /offers?policy=` shows too: minus pools in cooldown and pools the decision avoids; the
ranking's budget rule, given what the policy has spent and runs now, drops those the month's
budget cannot pay for, a multi-node job's offers priced once per node), and tries them in
order, in one walk for every job (a single node is a gang of one): each try writes its
attempt rows first (so a daemon killed mid-call retries with the same idempotency key), then
calls the provider for each node. `Launcher.launch` is one call, and says what happened as a
`LaunchOutcome`; what a capacity, quota or credentials error costs the pool or the provider
is the recovery strategy's answer (recovery.py, applied by launch_errors.py).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from datetime import datetime
from enum import Enum
from typing import NamedTuple

from optimizer.jobs.bootstrap import AgentSettings
from optimizer.jobs.context import ReconcileContext
from optimizer.jobs.gang import gang_key, placement_name
from optimizer.jobs.launch_errors import (
    Emit,
    after_auth,
    after_capacity,
    after_quota,
    end,
)
from optimizer.jobs.machine import Alert, Launch
from optimizer.jobs.measured import DEFAULT_WINDOW, ProbeWindow
from optimizer.jobs.ranking import job_state, launch_ranking, pool_of
from optimizer.jobs.recovery import Strategy
from optimizer.jobs.spare import spare_order
from optimizer.jobs.spec import pass_spec
from optimizer.lifecycle import AttemptEnd, AttemptState
from optimizer.model import EventKind, Market, Offer, Pool
from optimizer.store import JobRecord
from optimizer.store.jobs import AttemptRecord, token_sha256
from policies import budget as budget_model
from policies import rulebook
from policies.price_rules import BUDGET
from policies.schedule import effective
from policies.schema import Bid, Policy
from providers import registry
from providers.base import (
    AuthError,
    CapacityError,
    Gang,
    InstanceRef,
    LaunchSpec,
    Provider,
    ProviderError,
    QuotaError,
    ThrottledError,
)

MAX_OFFERS_TRIED = 25  # per launch, so a run of capacity errors ends in a clear pending reason


class LaunchOutcome(Enum):
    """What one launch call came to."""

    LAUNCHED = "launched"  # the provider started (or handed back) the instance
    THROTTLED = "throttled"  # the provider asked us to slow down: same key, next pass
    NOT_LEADER = "not_leader"  # this replica stopped leading: the new leader retries the key
    CAPACITY = "capacity"  # no capacity in the pool: the next offer, now
    QUOTA = "quota"  # the account's quota in the provider/region is used up
    AUTH = "auth"  # the provider refused our credentials
    NO_PROVIDER = "no_provider"  # the provider is not configured, not available or sits out
    OFFER_GONE = "offer_gone"  # a retried attempt's offer is no longer listed
    ERROR = "error"  # any other provider error

    @property
    def pending(self) -> bool:
        """The attempt stays 'launching', to be retried with the same key."""
        return self in (LaunchOutcome.THROTTLED, LaunchOutcome.NOT_LEADER)

    @property
    def skips_scope(self) -> bool:
        """The walk skips the offer's provider/region for the rest of this launch."""
        return self in (LaunchOutcome.QUOTA, LaunchOutcome.AUTH, LaunchOutcome.NO_PROVIDER)


class Walk(NamedTuple):
    """A walk's result: whether an attempt is under way, and the job's reason."""

    launched: bool
    why: str


class Launcher:
    """Launches attempts for the job reconciler; remembers providers that sit out."""

    def __init__(
        self,
        daemon_url: Callable[[], str],
        emit: Emit,
        *,
        agent: AgentSettings | None = None,
        probe_window: ProbeWindow = DEFAULT_WINDOW,
    ) -> None:
        self.daemon_url = daemon_url
        self.emit = emit
        self.probe_window = probe_window  # which probe results the ranking reads
        # How the bootstrap gets the agent onto a new instance (the daemon config's `agent:`);
        # a provider whose instances run on this host (the registry's `agent_on_host`)
        # already has gpuopt.
        self.agent = agent or AgentSettings()
        self.disabled: dict[str, datetime] = {}  # provider -> until, after an AuthError

    def provider(self, ctx: ReconcileContext, name: str) -> Provider | None:
        """The provider to act through, or None: not configured, not available here, not
        able to launch (the provider registry says), or sitting out after refusing our
        credentials."""
        until = self.disabled.get(name)
        if until is not None and ctx.now < until:
            return None
        handle = ctx.providers.get(name)
        if handle is None:
            return None
        try:
            return handle.launcher()
        except ProviderError:
            return None

    # -- the walk ------------------------------------------------------------------------------

    def walk(
        self,
        ctx: ReconcileContext,
        job: JobRecord,
        launch: Launch,
        policy: Policy,
        strategy: Strategy,
        *,
        attempts: Sequence[AttemptRecord] | None = None,
    ) -> Walk:
        """Launch the next attempt on the best allowed offer. `attempts`: the job's, as the
        pass read them (none has been added since), for the next attempt's number; read
        from the store where not given."""
        if launch.markets is not None:
            policy = policy.model_copy(update={"markets": [m.value for m in launch.markets]})
        # The ranking's budget rule projects a launch of every node the job asks for (the
        # spec's `nodes` wins over the policy's).
        nodes = job_nodes(job, policy, ctx)
        if nodes != policy.workload.nodes:
            work = policy.workload.model_copy(update={"nodes": nodes})
            policy = policy.model_copy(update={"workload": work})
        found = launch_ranking(
            ctx.store,
            job.policy,
            policy,
            ctx.now,
            avoid=launch.avoid,
            replacing=None if launch.spare else job.id,  # a spare replaces no attempt
            window=self.probe_window,
            memo=ctx.memo,
            state=job_state(ctx.store, job, ctx.now, spec=pass_spec(job, ctx.memo)),
        )
        ranking, spend, cap = found.ranking, found.spend, policy.budget.monthly_usd
        if not ranking.candidates:
            over = ranking.rejected(BUDGET.id)
            if cap is not None and over:
                cheapest = min(r.offer.usd_per_hour for r in over)
                need = budget_model.projected(
                    spend, cheapest, ctx.now, policy.budget.hours_per_month, instances=nodes
                )
                running = ""
                if spend.live_attempts:
                    running = f", {spend.live_attempts} attempt(s) running"
                    if spend.live_instances > spend.live_attempts:
                        running += f" on {spend.live_instances} instances"
                gang = f" of {nodes} nodes" if nodes > 1 else ""
                return Walk(
                    False,
                    f"budget: ${spend.spent_usd:,.2f} spent this month under policy "
                    f"{job.policy}{running}; the cheapest launch{gang} projects ${need:,.2f} "
                    f"> ${cap:,.2f}",
                )
            top = ", ".join(f"{rule} ({n})" for rule, n in ranking.rejection_counts().items())
            return Walk(
                False,
                f"no offer meets policy {job.policy}" + (f": rejected by {top}" if top else ""),
            )
        candidates = [c.offer for c in ranking.candidates]
        if launch.only is not None:  # a move: only the pools it was decided for
            candidates = [o for o in candidates if pool_of(o) in launch.only]
            if not candidates:
                return Walk(False, "none of the offers this move was decided for is allowed now")
        if cap is not None:
            first = budget_model.projected(
                spend,
                candidates[0].usd_per_hour,
                ctx.now,
                policy.budget.hours_per_month,
                instances=nodes,
            )
            if first > budget_model.ALERT_FRACTION * cap:
                self.emit(
                    ctx,
                    job,
                    Alert(
                        EventKind.BUDGET_THRESHOLD_CROSSED,
                        "warning",
                        f"policy {job.policy}: projected ${first:,.2f} this month is over "
                        f"{budget_model.ALERT_FRACTION:.0%} of ${cap:,.2f}",
                    ),
                    f"budget:{job.policy}:{ctx.now:%Y-%m}",
                    None,
                )
        # The bid in force for each node's in-cloud cap, from the policy this walk holds (a no-op
        # where the caller resolved the schedule, as the per-job pass does).
        bid = effective(policy, ctx.now).bid
        if launch.spare:  # a warm spare: apart from the running attempt (spares.py)
            candidates = spare_order(candidates, launch.apart_from)
        return self._try(
            ctx,
            job,
            candidates[:MAX_OFFERS_TRIED],
            strategy,
            nodes,
            bid=bid,
            attempts=attempts,
            spare=launch.spare,
        )

    def _try(
        self,
        ctx: ReconcileContext,
        job: JobRecord,
        offers: list[Offer],
        strategy: Strategy,
        nodes: int,
        *,
        bid: Bid | None = None,
        attempts: Sequence[AttemptRecord] | None = None,
        spare: bool = False,
    ) -> Walk:
        """Launch `nodes` instances of one offer together, all or nothing (a single node is a
        gang of one): every node's row is written first (one key each), then each is
        launched; if one fails, the nodes already launched are terminated and the next offer
        is tried (the failed node's error costs its pool what a single launch's would).
        `bid`: the bid of the policy the walk ranked under, for `cloud_cap`; `spare`: the
        job's warm spare (its row says so)."""
        skip_scopes: set[tuple[str, str]] = set()
        number = next_number(ctx, job, attempts)
        for offer in offers:
            if (offer.provider, offer.region) in skip_scopes:
                continue
            if self.provider(ctx, offer.provider) is None:
                skip_scopes.add((offer.provider, offer.region))
                continue
            if not ctx.leading():
                return Walk(False, "this replica stopped leading; the new leader launches")
            rows = [
                self._row(ctx, job, offer, number, rank, nodes, spare=spare)
                for rank in range(nodes)
            ]
            where = ("warm spare " if spare else "") + _where(number, nodes, rows[0][0].pool, offer)
            outcome = LaunchOutcome.LAUNCHED
            for row, token in rows:
                outcome = self.launch(ctx, job, row, strategy, token=token, offer=offer, bid=bid)
                if outcome is not LaunchOutcome.LAUNCHED:
                    break
            if outcome is LaunchOutcome.LAUNCHED:
                return Walk(True, f"launched {where}")
            if outcome.pending:
                return Walk(True, f"launching {where} ({_pending(outcome, nodes)})")
            if nodes > 1:  # a single node's launch has ended its one row
                self.tear_down(
                    ctx, job, [row for row, _ in rows], why=f"a node failed: {outcome.value}"
                )
            if outcome.skips_scope:
                skip_scopes.add((offer.provider, offer.region))
            number += nodes
        return Walk(False, f"every offer under policy {job.policy} failed to launch (see events)")

    def _row(
        self,
        ctx: ReconcileContext,
        job: JobRecord,
        offer: Offer,
        number: int,
        rank: int,
        nodes: int,
        *,
        spare: bool = False,
    ) -> tuple[AttemptRecord, str]:
        """Write one node's attempt row before its launch, with its token: a gang's rows name
        their gang (the rank-0 row's number), rank and size; a single node's name none."""
        token = secrets.token_urlsafe(32)
        row = ctx.store.jobs.create_attempt(
            job.id,
            number + rank,
            gang_key(job.id, number, rank),
            offer,
            token_sha256(token),
            ctx.now,
            gang=number if nodes > 1 else None,
            node_rank=rank,
            nodes=nodes,
            spare=spare,
        )
        return row, token

    def tear_down(
        self, ctx: ReconcileContext, job: JobRecord, rows: list[AttemptRecord], *, why: str
    ) -> None:
        """End a partial gang: terminate every node that has an instance, end every row."""
        source = self.provider(ctx, rows[0].provider)
        ended = 0
        for row in rows:
            fresh = ctx.store.jobs.attempt(row.key) or row
            if fresh.instance_id and not fresh.instance_gone and source is not None:
                try:
                    source.terminate(
                        InstanceRef(fresh.provider, fresh.region, fresh.zone, fresh.instance_id)
                    )
                    ctx.store.jobs.record_billing(fresh.key, terminated_by="gpuopt")
                    ended += 1
                except ProviderError:
                    pass  # still open with its instance: the clean-up asks again
            if not fresh.ended:
                end(ctx, fresh, AttemptEnd.GANG_INCOMPLETE)
        self.emit(
            ctx,
            job,
            Alert(
                EventKind.JOB_LAUNCH_FAILED,
                "warning",
                f"gang of {len(rows)} on {rows[0].pool.label} torn down ({why}); "
                f"{ended} launched node(s) terminated; trying the next offer",
                data=(("nodes", len(rows)), ("terminated", ended)),
            ),
            None,
            rows[0],
        )

    # -- one launch call -----------------------------------------------------------------------

    def launch(
        self,
        ctx: ReconcileContext,
        job: JobRecord,
        attempt: AttemptRecord,
        strategy: Strategy,
        *,
        token: str | None = None,
        offer: Offer | None = None,
        bid: Bid | None = None,
    ) -> LaunchOutcome:
        """Launch `attempt` (a new one, with its token and offer; or one left 'launching',
        retried with its key and a new token). Ends the attempt unless it launched or stays
        pending, and records what an error costs. `bid`: the bid in force, where the caller
        holds it (the walk); a retry has none, and `cloud_cap` looks it up."""
        source = self.provider(ctx, attempt.provider)
        if source is None:
            end(ctx, attempt, AttemptEnd.PROVIDER_UNAVAILABLE)
            return LaunchOutcome.NO_PROVIDER
        if token is None:  # a retry: the old token is unknown, so issue a new one
            token = secrets.token_urlsafe(32)
            ctx.store.jobs.update_attempt(attempt.key, token_sha256=token_sha256(token))
        if offer is None:
            offer = offer_of(ctx, attempt)
            if offer is None:
                end(ctx, attempt, AttemptEnd.OFFER_GONE)
                return LaunchOutcome.OFFER_GONE
        gang = None
        if attempt.nodes > 1:
            gang = Gang(
                placement_name(job.id, attempt.gang or attempt.number),
                nodes=attempt.nodes,
                rank=attempt.node_rank,
            )
        spec = LaunchSpec(
            job=job.name,
            attempt=attempt.gang or attempt.number,
            bootstrap=self._bootstrap(attempt, token, offer),
            image=self.agent.image(attempt.provider),
            max_usd_per_hour=cloud_cap(ctx, job, offer, bid),
            gang=gang,
        )
        if not ctx.leading():
            # Lost the lease mid-pass: leave the attempt 'launching' for the new leader, which
            # retries it with the same idempotency key.
            return LaunchOutcome.NOT_LEADER
        try:
            ref = source.launch(offer, spec, attempt.key)
        except CapacityError as exc:
            after_capacity(ctx, job, attempt, strategy, exc, self.emit)
            return LaunchOutcome.CAPACITY
        except QuotaError as exc:
            after_quota(ctx, job, attempt, strategy, exc, self.emit)
            return LaunchOutcome.QUOTA
        except ThrottledError:
            return LaunchOutcome.THROTTLED
        except AuthError as exc:
            after_auth(ctx, job, attempt, strategy, exc, self.emit, self.disabled)
            return LaunchOutcome.AUTH
        except ProviderError as exc:
            end(ctx, attempt, AttemptEnd.LAUNCH_ERROR)
            self.emit(
                ctx,
                job,
                Alert(
                    EventKind.JOB_LAUNCH_FAILED,
                    "warning",
                    f"launch on {attempt.pool.label} failed: {exc}",
                ),
                None,
                attempt,
            )
            return LaunchOutcome.ERROR
        ctx.store.jobs.update_attempt(
            attempt.key,
            instance_id=ref.instance_id,
            state=AttemptState.LAUNCHED,
            zone=ref.zone or attempt.zone,
            disk_gib=spec.disk_gib,  # the root volume the launch created (billed as storage)
        )
        return LaunchOutcome.LAUNCHED

    def _bootstrap(self, attempt: AttemptRecord, token: str, offer: Offer) -> str:
        caps = registry.capabilities(attempt.provider)
        on_host = caps.agent_on_host
        return self.agent.script(
            daemon_url=self.daemon_url(),
            token=token,
            attempt_key=attempt.key,
            cloud=attempt.provider,
            metadata_kind=caps.watcher or "",
            on_host=on_host,
            # The probe expects the GPUs the offer sells (a job's `expected_gpus` wins); an
            # instance on this host has this host's GPUs, not the simulated offer's.
            expected_gpus=None if on_host else offer.gpu_count,
        )


def cloud_cap(
    ctx: ReconcileContext, job: JobRecord, offer: Offer, bid: Bid | None = None
) -> float | None:
    """The price cap a spot launch sends to the cloud, where the policy in force enforces its
    bid there (`bid.enforce_in_cloud`); None otherwise, and for on-demand (no cap to send).
    `bid`: the bid in force where the caller holds it; else the job's policy is looked up."""
    if offer.market is not Market.SPOT:
        return None
    if bid is None:
        loaded = ctx.policies.get(job.policy)
        if loaded is None:
            return None
        bid = effective(loaded.policy, ctx.now).bid
    if not bid.enforce_in_cloud:
        return None
    # The caps the rulebook defines, without the on-demand price: a fraction of it is checked
    # by gpuopt before launching and is not one the cloud takes.
    return rulebook.bid_cap(bid, max(offer.gpu_count, 1), None)


def _where(number: int, nodes: int, pool: Pool, offer: Offer) -> str:
    """The attempt a walk launches, as the job's reason names it."""
    if nodes == 1:
        return f"attempt {number} on {pool.label} at ${offer.usd_per_hour:.4f}/h"
    return f"attempt {number} ({nodes} nodes) on {pool.label} at ${offer.usd_per_hour:.4f}/h each"


def _pending(outcome: LaunchOutcome, nodes: int) -> str:
    """Why a launch the walk began is still under way (the words a single node's and a
    gang's reasons have always used)."""
    if nodes == 1 and outcome is LaunchOutcome.NOT_LEADER:
        return "this replica stopped leading; the new leader retries"
    return f"{outcome.value}; retrying"


def job_nodes(job: JobRecord, policy: Policy, ctx: ReconcileContext) -> int:
    """How many instances each attempt of the job spans: the spec's `nodes` (validated once
    per pass, `spec.pass_spec`), else the policy's `workload.nodes`."""
    return pass_spec(job, ctx.memo).nodes or policy.workload.nodes or 1


def next_number(
    ctx: ReconcileContext, job: JobRecord, attempts: Sequence[AttemptRecord] | None = None
) -> int:
    """The next attempt number: a gang of N takes N numbers (one per node's row).
    `attempts`: the job's every attempt where the caller holds them; else read."""
    rows = ctx.store.jobs.attempts(job.id) if attempts is None else attempts
    return max((a.number for a in rows), default=0) + 1


def offer_of(ctx: ReconcileContext, attempt: AttemptRecord) -> Offer | None:
    """The offer an attempt was placed on, from the latest prices (None: no longer listed)."""
    for offer in ctx.store.prices.latest_offers(provider=attempt.provider, region=attempt.region):
        if pool_of(offer) == attempt.pool:
            return offer
    return None


__all__ = ["MAX_OFFERS_TRIED", "LaunchOutcome", "Launcher", "Walk"]
