"""The ranking a launch walks: one policy over the latest offers, as the daemon sees them now.

One function for the launcher and for `GET /offers?policy=`, so what the API shows is what the
next launch would try: the latest stored offers of every provider, less the pools in cooldown
(and those a launch's decision avoids), ranked by the engine with the policy's spend this
month and its live attempts for the budget rule, and with what the probes measured.

Under `rank_by: price_per_step` they are re-ranked by USD per step of the job's own work
(policies/per_step.py) from the speeds the job measured (optimizer/jobs/progress.py), for the
job about to launch (`replacing`); for no job they keep the engine's order, per TFLOP.

Under `rank_by: expected_cost` the engine's candidates (ordered by price) are re-ranked here
by expected USD/h, each with its pool's interruption probability, its source and the restart
overhead (policies/risk.py, inputs from optimizer/jobs/expected.py); `with_expected` gives
any other ranking's candidates the same figures without reordering them (GET /offers shows
them on every page).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Protocol

from optimizer.jobs import budget, expected
from optimizer.jobs.context import PassMemo
from optimizer.jobs.measured import DEFAULT_WINDOW, ProbeWindow, measured
from optimizer.jobs.offer_table import latest_table, without_pools
from optimizer.jobs.progress import job_progress
from optimizer.jobs.spec import JobSpec, bucket_provider, job_spec
from optimizer.model import Offer, Pool
from optimizer.store import JobRecord, Store
from policies import budget as budget_model
from policies import per_step, risk
from policies.egress import DEFAULT_HORIZON_HOURS, StatePlace
from policies.engine import Candidate, OfferTable, Ranking, evaluate
from policies.measured import Measured
from policies.schedule import effective
from policies.schema import Policy


def pool_of(offer: Offer) -> Pool:
    """The capacity pool an offer prices, as the store keys pools."""
    return offer.pool


def pass_table(store: Store, memo: PassMemo | None = None) -> OfferTable:
    """Every pool's latest offer as the table the last change of them built
    (optimizer/jobs/offer_table.py): taken once per pass where the pass's memo is given (no
    new prices are recorded by a pass, and a poll meanwhile must not change the offers under
    it), else taken now."""
    if memo is None:
        return latest_table(store)
    return memo.get("latest_table", lambda: latest_table(store))


def pass_measured(
    store: Store, window: ProbeWindow = DEFAULT_WINDOW, memo: PassMemo | None = None
) -> Measured:
    """What the probes measured (optimizer.jobs.measured): read once per pass and window
    where the pass's memo is given (no probe result is recorded by a pass), else read now."""
    if memo is None:
        return measured(store, window)
    return memo.get(("measured", window), lambda: measured(store, window))


@dataclass(frozen=True, slots=True)
class LaunchRanking:
    """The ranking, the spend it was given, and how many offers sat out in cooled pools."""

    ranking: Ranking
    spend: budget_model.Committed
    held_back: int  # offers left out: their pool is in cooldown, or the launch avoids it


def launch_ranking(
    store: Store,
    policy_name: str,
    policy: Policy,
    now: datetime,
    *,
    avoid: Iterable[Pool] = (),
    replacing: int | None = None,
    window: ProbeWindow = DEFAULT_WINDOW,
    memo: PassMemo | None = None,
    state: StatePlace | None = None,
) -> LaunchRanking:
    """Rank the latest offers under the policy in force at `now` as a launch does (module
    docstring): `policy` as written, or already in force (a plain policy is its own).

    `avoid`: pools this launch keeps away from besides those in cooldown; `replacing`: the
    job about to launch its next attempt (its own live attempt is being replaced, see
    optimizer.jobs.budget.committed); `window`: which probe results the measured figures
    and the demotions come from (optimizer.jobs.measured); `memo`: a reconcile pass's, so
    that every launch of the pass shares one reading of the offers and the probe figures
    (the other surfaces, /offers, the console and the advice, read their own); `state`:
    where the job's checkpoint is (`state_place`), so each offer's rank counts moving it
    there and the policy's `data` rules apply (policies/data_rules.py).
    """
    # Every surface ranks through here (the launcher, /offers, the console, the advice), so
    # each sees the schedule window in force, whatever it was handed.
    policy = effective(policy, now)
    # Read fresh for each launch, never from the memo: a launch's capacity or quota error in
    # this pass cools its pool, and the next launch must keep away from it.
    held = set(avoid) | store.jobs.cooled_pools(now)
    # An attempt records the zone its instance landed in, but a regional offer (on-demand
    # prices are per region) has no zone: avoid the offer's own, regional pool too.
    held |= {Pool(p, r, None, t, m) for p, r, _zone, t, m in held}
    table = pass_table(store, memo)
    listed = table.offers
    offers = without_pools(table, held)
    spend = budget_model.NOTHING
    if policy.budget.monthly_usd is not None:
        # Read fresh for each launch too: each launch of the pass adds a live attempt, which
        # the next launch's budget check must count.
        spend = budget.committed(store, policy_name, now, table, replacing=replacing)
    found = pass_measured(store, window, memo)
    ranking = evaluate(policy, offers, now, measured=found, committed=spend, state=state)
    if policy.rank_by == "expected_cost" and ranking.candidates:
        annotated = with_expected(store, policy_name, ranking.candidates, now, job_id=replacing)
        ranking = replace(ranking, candidates=tuple(risk.by_expected_cost(annotated)))
    if policy.rank_by == "price_per_step" and ranking.candidates:
        speeds = per_step.NOTHING
        if replacing is not None:
            speeds = step_speeds(store, replacing, listed, found, ranking.dtype, now)
        ranked = per_step.by_price_per_step(ranking.candidates, speeds, ranking.dtype)
        ranking = replace(ranking, candidates=tuple(ranked))
    return LaunchRanking(ranking, spend, len(table) - len(offers))


def step_speeds(
    store: Store,
    job_id: int,
    offers: Sequence[Offer],
    found: Measured,
    dtype: str,
    now: datetime,
) -> per_step.StepSpeeds:
    """The job's measured steps per hour per instance type (optimizer/jobs/progress.py) and
    the reference the other types are scaled from: the type its current speed was measured
    on (else another it measured) that an offer still lists, with that type's node TFLOPS as
    the probes measured them and per the datasheet (its GPUs read from that offer)."""
    progress = job_progress(store, job_id, now)
    if progress is None or not progress.by_type:
        return per_step.NOTHING
    # The type of the speed in force first, then the others measured, as the offers list them.
    kinds = sorted(progress.by_type, key=lambda k: (k != progress.instance_type, k))
    listed = {o.instance_type: o for o in offers}
    reference = None
    for kind in kinds:
        like = listed.get(kind)
        if like is not None:
            reference = per_step.Reference(
                kind,
                progress.by_type[kind],
                probe_tflops=_probe_node_tflops(found, like, dtype),
                datasheet_tflops=per_step.datasheet_node_tflops(
                    like.gpu_model, like.gpu_count, dtype
                ),
            )
            break
    return per_step.StepSpeeds(dict(progress.by_type), reference)


def _probe_node_tflops(found: Measured, offer: Offer, dtype: str) -> float | None:
    """What the probes measured on the offer's type (else on its GPU model) for `dtype`, for
    the whole node; None where they measured nothing."""
    by_type = found.types.get((offer.provider, offer.instance_type))
    value = by_type.tflops.get(dtype) if by_type is not None else None
    if value is None:
        value = found.models.get(offer.gpu_model, {}).get(dtype)
    return value * offer.gpu_count if value else None


def with_expected(
    store: Store,
    policy_name: str,
    candidates: Sequence[Candidate],
    now: datetime,
    *,
    job_id: int | None = None,
) -> list[Candidate]:
    """`candidates` with their interruption probability, its source and expected USD/h
    (same order): pool histories from every job's attempts, the restart overhead of the job
    (where given and it has relaunched) or else of the policy."""
    if not candidates:
        return []
    histories = expected.pool_histories(store, now)
    overhead = expected.overhead_of(store, policy_name, now, job_id=job_id)
    return risk.annotate_all(candidates, histories, overhead, now)


MIB = 1024 * 1024
MIN_HORIZON_HOURS = 1.0
"""The shortest run a move is spread over: a job about to reach its max_duration would
otherwise make any move look unaffordable, or divide by nothing."""


class CheckpointLike(Protocol):
    """What `state_place` reads of a stored checkpoint (CheckpointRecord)."""

    @property
    def provider(self) -> str | None: ...
    @property
    def region(self) -> str | None: ...
    @property
    def size_bytes(self) -> int: ...


def horizon_hours(max_duration_s: float | None, ran_s: float) -> float:
    """How long the next attempt is expected to run, over which a move is spread: what is
    left of the job's max_duration (the spec's over the policy's) after the time it has run,
    at least `MIN_HORIZON_HOURS`; without a max_duration, `DEFAULT_HORIZON_HOURS` (a day)."""
    if max_duration_s is None:
        return DEFAULT_HORIZON_HOURS
    return max((max_duration_s - max(ran_s, 0.0)) / 3600, MIN_HORIZON_HOURS)


def state_place(
    checkpoint: CheckpointLike | None,
    *,
    restore_mib_s: float | None = None,
    max_duration_s: float | None = None,
    ran_s: float = 0.0,
) -> StatePlace | None:
    """The job's state as a launch's ranking reads it: its newest checkpoint's place and
    size, the restore throughput the job measured (None: assumed), and the horizon
    (`horizon_hours`). None where there is no checkpoint or its place is unknown."""
    if checkpoint is None or not checkpoint.provider or not checkpoint.region:
        return None
    return StatePlace(
        checkpoint.provider,
        checkpoint.region,
        int(checkpoint.size_bytes),
        restore_mib_s or None,
        horizon_hours(max_duration_s, ran_s),
    )


def job_state(
    store: Store, job: int | JobRecord, now: datetime, *, spec: JobSpec | None = None
) -> StatePlace | None:
    """Where the job's state is, for the ranking of its next launch (the launcher and the
    advice call this): its newest checkpoint still in the bucket, else (nothing committed
    yet) an empty state at its bucket's region, so `data.regions` applies from the first
    launch; the restore throughput its earlier restores measured (the newest with bytes
    fetched; None: the sourced default); the horizon from its max_duration less the time its
    attempts have run. None for a job without a bucket, or whose bucket's region is unknown.
    `job`: its record (or id); `spec`: its spec where the caller holds it (a pass's)."""
    record = store.jobs.get_job_by_id(job) if isinstance(job, int) else job
    if record is None or record.id is None:
        return None
    job_id = record.id
    spec = spec if spec is not None else job_spec(record)
    if spec.checkpoint is None:
        return None
    live = [c for c in store.checkpoints.checkpoints(job_id) if c.deleted_at is None]
    newest: CheckpointLike | None = live[0] if live else None
    if newest is None:
        region = spec.checkpoint.region
        if not region:
            return None
        newest = EmptyState(bucket_provider(spec.checkpoint.uri), region)
    measured = [
        r for r in store.checkpoints.restores(job_id) if r.fetched_bytes > 0 and r.seconds > 0
    ]
    throughput = None
    if measured:
        last = max(measured, key=lambda r: (r.at, r.id))
        throughput = last.fetched_bytes / MIB / last.seconds
    spans = sorted(
        (a.started_at, a.ended_at or now)
        for a in store.jobs.attempts(job_id)
        if a.started_at is not None
    )
    ran_s, reach = 0.0, None  # the union of the attempts' spans (a handover overlaps two)
    for start, end in spans:
        begin = start if reach is None else max(start, reach)
        if end > begin:
            ran_s += (end - begin).total_seconds()
        reach = end if reach is None else max(reach, end)
    return state_place(
        newest, restore_mib_s=throughput, max_duration_s=spec.max_duration, ran_s=ran_s
    )


@dataclass(frozen=True, slots=True)
class EmptyState:
    """A bucket with nothing in it yet, in `state_place`'s terms."""

    provider: str
    region: str
    size_bytes: int = 0
