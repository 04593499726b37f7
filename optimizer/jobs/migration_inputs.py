"""What the migration pass reads from the store, gathered once per reconcile pass.

`gather(...)` builds the pure pass's inputs (migration.py): for every live job of a policy
whose `migration.enabled` is set in the policy in force, whether it runs healthy on its
attempt (a `RunningJob`; never a multi-node job, which is not moved) or is moving (its last
move has not reached a running job yet), and per policy the offers it allows now in rank
order, the rule that rejects each running job's pool, the pools' recent price history, and
the cooldowns. The restart overhead each job is charged comes from the cost ledger's frozen
lines when the policy has relaunched attempts there, else from the observed times from an
interruption (or a move) to the job running again, else an assumed 10 minutes; each source is
named in the event.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from statistics import median

from optimizer.jobs.context import PassMemo
from optimizer.jobs.measured import DEFAULT_WINDOW, ProbeWindow
from optimizer.jobs.migration import (
    History,
    MigrationSettings,
    Option,
    PolicyMarket,
    RunningJob,
)
from optimizer.jobs.ranking import pass_measured, pass_table, pool_of
from optimizer.jobs.recovery import Failure, strategy_for
from optimizer.jobs.spec import job_spec
from optimizer.jobs.utilization import rules_for
from optimizer.lifecycle import FAILURES, HANDED_OVER, AttemptEnd, JobState
from optimizer.model import Market, Offer, Pool
from optimizer.store import JobRecord, LineFilter, Store
from optimizer.store.jobs import AttemptRecord
from policies.engine import evaluate
from policies.measured import Measured
from policies.schedule import effective, window_at
from policies.schema import Policy

ASSUMED_OVERHEAD = timedelta(minutes=10)
OVERHEAD_TTL = timedelta(minutes=5)  # how long a policy's measured overhead is reused
LEDGER_DAYS = 30  # the ledger's lines read for the overhead
HISTORY_POOLS = 100  # pools per policy whose price history is read, best ranked first

InForce = Callable[[Policy, datetime], Policy]
WindowName = Callable[[Policy, datetime], str | None]


def in_force_now(policy: Policy, now: datetime) -> Policy:
    """The plain policy in force at `now`: a schedule window's values in place of the
    top-level ones while it is in force (policies/schedule.py)."""
    return effective(policy, now)


def window_now(policy: Policy, now: datetime) -> str | None:
    """The name of the policy's schedule window in force at `now` (None: none)."""
    window = window_at(policy.schedule, now)
    return None if window is None else window.name


@dataclass(frozen=True, slots=True)
class Inputs:
    jobs: tuple[RunningJob, ...]
    markets: Mapping[str, PolicyMarket]
    policies: Mapping[str, Policy]  # the policy in force of each market, as ranked
    # Policies (by name) and jobs (by id) left out of this pass because reading them raised,
    # with why: one bad policy or job never stops the others' moves.
    skipped_policies: Mapping[str, str] = field(default_factory=dict)
    skipped_jobs: Mapping[int, str] = field(default_factory=dict)


def why(exc: BaseException) -> str:
    """An exception in a line, for an event or a log line."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 300 else text[:299] + "…"


@dataclass
class Overheads:
    """Each policy's measured restart overhead, kept for OVERHEAD_TTL."""

    held: dict[str, tuple[datetime, timedelta, str]] = field(default_factory=dict)

    def of(
        self, store: Store, policy: str, attempts: Iterable[Sequence[AttemptRecord]], now: datetime
    ) -> tuple[timedelta, str]:
        kept = self.held.get(policy)
        if kept is not None and now - kept[0] < OVERHEAD_TTL:
            return kept[1], kept[2]
        spent, note = measured_overhead(store, policy, attempts, now)
        self.held[policy] = (now, spent, note)
        return spent, note


def measured_overhead(
    store: Store, policy: str, attempts: Iterable[Sequence[AttemptRecord]], now: datetime
) -> tuple[timedelta, str]:
    """A restart's overhead for the policy's jobs, and where the figure comes from."""
    lines = store.costs.frozen_lines(
        LineFilter(since=now - timedelta(days=LEDGER_DAYS), policy=policy)
    )
    per_attempt: dict[int, float] = {}
    for line in lines:
        if line.attempt > 1:
            per_attempt[line.attempt_id] = (
                per_attempt.get(line.attempt_id, 0.0) + line.overhead_seconds
            )
    if per_attempt:
        seconds = median(per_attempt.values())
        return timedelta(seconds=seconds), f"ledger: median of {len(per_attempt)} relaunches"
    observed: list[float] = []
    for rows in attempts:
        for i, before in enumerate(rows):
            began = before.notice_at or before.ended_at
            if before.end_reason not in HANDED_OVER or began is None:
                continue
            # the next attempt whose job ran (launches that found no capacity in between)
            after = next((a for a in rows[i + 1 :] if a.job_started_at is not None), None)
            if after is not None and after.job_started_at is not None:
                observed.append(max((after.job_started_at - began).total_seconds(), 0.0))
    if observed:
        seconds = median(observed)
        return timedelta(seconds=seconds), f"observed: median of {len(observed)} restarts"
    return ASSUMED_OVERHEAD, "assumed: nothing measured yet"


def _regional(pool: Pool) -> Pool:
    provider, region, _zone, kind, market = pool
    return Pool(provider, region, None, kind, market)


def offer_pool(pool: Pool, listed: Mapping[Pool, Offer]) -> Pool:
    """The pool of the offer an attempt runs on: its own, or the regional one (an on-demand
    attempt records its instance's zone; the offer is priced per region)."""
    if pool in listed:
        return pool
    regional = _regional(pool)
    return regional if regional in listed else pool


def moving(rows: Sequence[AttemptRecord]) -> bool:
    """Whether the job's last move has not reached a running job yet."""
    last = max((a.number for a in rows if a.end_reason == AttemptEnd.MIGRATED), default=None)
    if last is None:
        return False
    return not any(a.number > last and a.job_started_at is not None for a in rows)


def running(job: JobRecord, rows: Sequence[AttemptRecord]) -> AttemptRecord | None:
    """The attempt the job runs on, healthy, with nothing handing over (None: it does not,
    or it runs as a gang: a multi-node job is never moved, so it is no candidate and takes
    no slot of the disruption budget)."""
    if job.state != JobState.RUNNING.value or job.cancel_requested_at is not None:
        return None
    current = next((a for a in reversed(rows) if not a.ended and not a.idle_spare), None)
    if (
        current is None
        or current.nodes > 1
        or current.job_started_at is None
        or current.exit_code is not None
        or current.notice_at is not None
        or current.stop_sent_at is not None
        or current.instance_gone
    ):
        return None
    for a in rows:  # an earlier attempt still handing over (its job not exited)
        if (
            a is not current
            and a.end_reason in HANDED_OVER
            and not a.instance_gone
            and a.exit_code is None
            and a.stop_sent_at is None
        ):
            return None
    return current


def remaining(
    policy: Policy, job: JobRecord, rows: Sequence[AttemptRecord], now: datetime
) -> tuple[timedelta, str]:
    """How much longer the job is expected to run, and why that figure."""
    # On the daemon's clock: the launch of the first attempt whose job ran (an agent's own
    # clock stamps when the job started).
    first = min((a.started_at for a in rows if a.job_started_at is not None), default=now)
    ran = max(now - first, timedelta(0))
    limit = rules_for(policy, job.spec).max_duration
    hours = ran.total_seconds() / 3600
    if limit is not None:
        left = max(limit - ran, timedelta(0))
        return left, f"max_duration {limit.total_seconds() / 3600:g} h less {hours:.1f} h run"
    return ran, f"assumed as long again as the {hours:.1f} h it has run"


def gather(
    store: Store,
    jobs: Sequence[JobRecord],
    attempts: Mapping[int, Sequence[AttemptRecord]],
    policies: Mapping[str, Policy],
    now: datetime,
    *,
    overheads: Overheads | None = None,
    probe_window: ProbeWindow = DEFAULT_WINDOW,
    in_force: InForce = in_force_now,
    window_name: WindowName = window_now,
    memo: PassMemo | None = None,
) -> Inputs | None:
    """The pass's inputs (module docstring); None when no live job's policy in force has
    migration enabled (the pass reads nothing more then)."""
    overheads = overheads or Overheads()
    forced: dict[str, Policy] = {}
    settings: dict[str, MigrationSettings] = {}
    skipped: dict[str, str] = {}
    skipped_jobs: dict[int, str] = {}
    for name in sorted({j.policy for j in jobs}):
        loaded = policies.get(name)
        if loaded is None:
            continue
        try:
            now_policy = in_force(loaded, now)
            if now_policy.migration.enabled:
                settings[name] = MigrationSettings.of(now_policy)
                _ = now - settings[name].lookback  # a window the history can be read over
                forced[name] = now_policy
        except Exception as exc:  # this policy sits out; the others are gathered
            settings.pop(name, None)
            skipped[name] = why(exc)
    if not forced:
        return Inputs((), {}, {}, skipped) if skipped else None
    mine = [j for j in jobs if j.policy in forced]
    # The pass's reading (`memo`), which its launches share.
    table = pass_table(store, memo)
    offers = table.offers
    listed = {pool_of(o): o for o in offers}
    found = pass_measured(store, probe_window, memo)
    lookback = max(s.lookback for s in settings.values())
    cooldowns: dict[Pool, datetime] = {}
    for pool, until in store.jobs.cooldown_ends(now - lookback).items():
        for key in (pool, _regional(pool)):
            if key not in cooldowns or cooldowns[key] < until:
                cooldowns[key] = until

    running_jobs: list[RunningJob] = []
    spent_by: dict[str, tuple[timedelta, str]] = {}
    in_motion: dict[str, int] = dict.fromkeys(forced, 0)
    for job in mine:
        rows = attempts.get(job.id, ())
        if moving(rows):
            in_motion[job.policy] += 1
            continue
        try:
            found_job = _running_job(
                store, job, rows, mine, attempts, forced, listed, spent_by, overheads, now
            )
        except Exception as exc:  # this job is not moved; the reconciler judges it itself
            skipped_jobs[job.id] = why(exc)
            continue
        if found_job is not None:
            running_jobs.append(found_job)

    markets: dict[str, PolicyMarket] = {}
    windows: list[tuple[Pool, datetime, datetime]] = []
    wanted: dict[str, list[Pool]] = {}
    for name, policy in forced.items():
        theirs = [j for j in running_jobs if j.policy == name]
        s = settings[name]
        try:
            ranking = evaluate(policy, table, now, measured=found)
            options = [Option(pool_of(c.offer), c.offer.usd_per_hour) for c in ranking.candidates]
            refused = _refusals(policy, theirs, listed, offers, now, found)
            pools = _could_be_targets(options, theirs, refused, s)
            window = window_name(policies[name], now)
        except Exception as exc:  # this policy's jobs are not moved this pass
            skipped[name] = why(exc)
            continue
        pools = list(dict.fromkeys([*pools, *(j.pool for j in theirs)]))  # and their own
        wanted[name] = pools
        windows.extend((p, now - s.lookback, now) for p in pools)
        markets[name] = PolicyMarket(
            name=name,
            settings=s,
            options=options,
            refused=refused,
            history={},
            cooldowns=cooldowns,
            moving=in_motion[name],
            window=window,
        )
    running_jobs = [j for j in running_jobs if j.policy in markets]
    unique = list(dict.fromkeys(windows))
    read = store.prices.price_histories(unique, prior=True) if unique else []
    histories: dict[tuple[Pool, datetime], History] = {
        (pool, since): points for (pool, since, _), points in zip(unique, read, strict=True)
    }
    for name, pools in wanted.items():
        since = now - settings[name].lookback
        market = markets[name]
        markets[name] = PolicyMarket(
            name=market.name,
            settings=market.settings,
            options=market.options,
            refused=market.refused,
            history={p: histories[(p, since)] for p in pools},
            cooldowns=market.cooldowns,
            moving=market.moving,
            window=market.window,
        )
    return Inputs(tuple(running_jobs), markets, forced, skipped, skipped_jobs)


def _running_job(
    store: Store,
    job: JobRecord,
    rows: Sequence[AttemptRecord],
    mine: Sequence[JobRecord],
    attempts: Mapping[int, Sequence[AttemptRecord]],
    forced: Mapping[str, Policy],
    listed: Mapping[Pool, Offer],
    spent_by: dict[str, tuple[timedelta, str]],
    overheads: Overheads,
    now: datetime,
) -> RunningJob | None:
    """The job as the migration pass sees it, when it runs healthy on its attempt."""
    current = running(job, rows)
    if current is None or current.job_started_at is None:
        return None
    policy = forced[job.policy]
    pool = offer_pool(current.pool, listed)
    offer = listed.get(pool)
    left, left_note = remaining(policy, job, rows, now)
    if job.policy not in spent_by:
        theirs_rows = [attempts.get(j.id, ()) for j in mine if j.policy == job.policy]
        spent_by[job.policy] = overheads.of(store, job.policy, theirs_rows, now)
    spent, spent_note = spent_by[job.policy]
    strategy = strategy_for(policy, max_restarts=job_spec(job).max_restarts)
    history = tuple(
        (Failure(a.end_reason), a.ended_at) for a in rows if a.end_reason in FAILURES and a.ended_at
    )
    fallback = strategy.while_pending(history, now).markets
    return RunningJob(
        id=job.id,
        name=job.given_name,
        policy=job.policy,
        pool=pool,
        usd_per_hour=offer.usd_per_hour if offer is not None else current.usd_per_hour,
        running_since=current.started_at,
        remaining=left,
        remaining_note=left_note,
        overhead=spent,
        overhead_note=spent_note,
        moved_at=tuple(
            a.ended_at for a in rows if a.end_reason == AttemptEnd.MIGRATED and a.ended_at
        ),
        spot_allowed="spot" in policy.markets and (fallback is None or Market.SPOT in fallback),
    )


def _could_be_targets(
    options: Sequence[Option],
    jobs: Sequence[RunningJob],
    refused: Mapping[Pool, str],
    s: MigrationSettings,
) -> list[Pool]:
    """The allowed pools whose price history the pass needs: those cheaper by `min_savings`
    than some job ranked below them (a forced move needs no history), and for on-demand jobs
    the spot pools; in rank order, at most HISTORY_POOLS."""
    rank = {o.pool: i for i, o in enumerate(options)}
    # the dearest price, among jobs ranked at or below each position, a target there must beat
    below = [0.0] * (len(options) + 1)
    spot_for_od = False
    for j in jobs:
        if j.pool in refused:
            continue
        at = rank.get(j.pool, len(options))
        below[at] = max(below[at], j.usd_per_hour)
        spot_for_od = spot_for_od or j.pool[4] == Market.ON_DEMAND.value
    for i in range(len(options) - 1, -1, -1):
        below[i] = max(below[i], below[i + 1])
    out: list[Pool] = []
    for i, o in enumerate(options):
        if o.usd_per_hour <= (1 - s.min_savings) * below[i + 1] or (
            spot_for_od and o.market == Market.SPOT.value
        ):
            out.append(o.pool)
            if len(out) == HISTORY_POOLS:
                break
    return out


def _refusals(
    policy: Policy,
    jobs: Sequence[RunningJob],
    listed: Mapping[Pool, Offer],
    offers: Sequence[Offer],
    now: datetime,
    found: Measured,
) -> dict[Pool, str]:
    """The rule that rejects each job's pool under the policy in force (allowed ones are
    left out). Ranks only the jobs' own offers, with the on-demand offers of their types and
    regions that a bid cap's fraction compares with."""
    own = {j.pool: listed[j.pool] for j in jobs if j.pool in listed}
    if not own:
        return {}
    places = {(o.provider, o.region, o.instance_type) for o in own.values()}
    company = [
        o
        for o in offers
        if o.market is Market.ON_DEMAND and (o.provider, o.region, o.instance_type) in places
    ]
    subset = list({pool_of(o): o for o in [*own.values(), *company]}.values())
    ranking = evaluate(policy, subset, now, measured=found)
    refused: dict[Pool, str] = {}
    for rule in ranking.rejection_counts():
        for rejection in ranking.rejected(rule):
            pool = pool_of(rejection.offer)
            if pool in own:
                refused[pool] = rule
    return refused


__all__ = ["Inputs", "Overheads", "gather", "measured_overhead", "moving", "running"]
