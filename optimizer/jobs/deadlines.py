"""Deadlines in the daemon: a job with a `deadline` run by the policy's deadline strategy.

At every reconcile pass (a timer, and each job event, which wakes the loop) the `Deadlines`
pass builds a `Situation` for each live job with a deadline from what the store holds — the
time since submit, the work left, what one restart costs this job, what runs now and where,
the spot zones the policy could launch in now — and asks the strategy the policy names
(`recovery.deadline_strategy`, policies/deadline) what the job should run on. The decision is
acted on through the existing machinery, never beside it:

- a job about to be relaunched (after an interruption, or waiting for an offer) gets its
  markets from the decision: the recovery seam (`recovery.with_deadline`), applied by the
  per-job pass;
- a running job the decision wants elsewhere (spot → on-demand when the slack is short, back
  to spot when it returns) is moved as a planned migration (`migration.Move`, reason
  `deadline`): the next attempt launches, the old job checkpoints once it is ready, and the
  new one starts after it exited (moving.migrate);
- `job.deadline_at_risk` is raised once, when the deadline first cannot be met on spot alone,
  and `job.deadline_missed` once, when it has passed with work left.

What the work left is: `work:` less the time the job's attempts have run (`work_left_s`, the
one place where the job's own progress reports plug in). A job with a deadline but no `work`
is only watched for a missed deadline until its progress tells the work left.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from statistics import median
from typing import Any

from optimizer.jobs.acting import Acting, log
from optimizer.jobs.context import UNREACHABLE, PassMemo, ReconcileContext
from optimizer.jobs.machine import Alert
from optimizer.jobs.migration import Move, Reason
from optimizer.jobs.progress import JobProgress, job_progress
from optimizer.jobs.ranking import launch_ranking, pool_of
from optimizer.jobs.spec import JobSpec, pass_spec
from optimizer.jobs.views import PassView, Watched, current_rows
from optimizer.lifecycle import LIVE_JOB_STATES as LIVE
from optimizer.lifecycle import AttemptEnd, JobState
from optimizer.model import EventKind, Market, Pool
from optimizer.store import JobRecord, Store
from optimizer.store.jobs import AttemptRecord
from policies.deadline import (
    Decision,
    Situation,
    Use,
    ZoneStats,
    at_risk,
    missed,
    slack_s,
    strategy,
)
from policies.schedule import effective
from policies.schema import Policy

MAX_TARGETS = 25  # pools a deadline move's launch may try (migration.MAX_TARGETS)
WATCHED_ONLY = (
    "no `work` given: the work left is known only from the job's progress reports; until then "
    "the job is only watched for a missed deadline"
)


# -- the pure part: a Situation from what is stored --------------------------------------------


def _seconds(later: datetime, earlier: datetime) -> float:
    return max((later - earlier).total_seconds(), 0.0)


def ran_s(attempts: Sequence[AttemptRecord], now: datetime) -> float:
    """How long the job has run, over all its attempts: from each one's job start to its end
    (now for one still open). A moved attempt's job runs on until the next one is ready; that
    tail is not counted, so the work left errs long."""
    total = 0.0
    for a in attempts:
        if a.job_started_at is None or a.node_rank != 0:
            continue
        total += _seconds(a.ended_at or now, a.job_started_at)
    return total


def work_left_s(
    spec: JobSpec,
    attempts: Sequence[AttemptRecord],
    now: datetime,
    progress: JobProgress | None = None,
) -> float | None:
    """Seconds of work the job has left; None: not known. Where the job reports its progress
    with a total (docs/progress.md), the steps left at its measured speed (the current or
    last attempt's), or, before a speed is measured, that share of `work:`; else `work:` less
    the time its attempts have run."""
    if progress is not None and progress.total:
        steps_left = max(progress.total - progress.step, 0)
        if progress.steps_per_hour:
            return steps_left / progress.steps_per_hour * 3600.0
        if spec.work is not None:
            return spec.work.seconds * steps_left / progress.total
    if spec.work is None:
        return None
    return max(spec.work.seconds - ran_s(attempts, now), 0.0)


def restart_overhead_s(policy: Policy, attempts: Sequence[AttemptRecord]) -> tuple[float, str]:
    """What one restart costs this job, and where the figure comes from: the median time from
    its attempts' launches to their jobs' starts (boot, probe, restore) where measured, else
    the policy's `recovery.restart_overhead`."""
    measured = [
        _seconds(a.job_started_at, a.started_at)
        for a in attempts
        if a.job_started_at is not None and a.node_rank == 0
    ]
    if measured:
        return median(measured), f"measured: median of {len(measured)} starts"
    return float(policy.recovery.restart_overhead), "policy: recovery.restart_overhead"


def zone_of(pool: Pool) -> str:
    """A spot pool's zone as the strategy names it (its region where it has none)."""
    return pool.zone or pool.region


def running_now(attempts: Sequence[AttemptRecord]) -> tuple[Use, str | None]:
    """What the job's open attempt runs on, and where (WAIT, None: nothing is open)."""
    nodes = current_rows(list(attempts))
    if not nodes:
        return Use.WAIT, None
    head = nodes[0]
    if head.market == Market.SPOT:
        return Use.SPOT, zone_of(head.pool)
    return Use.ON_DEMAND, None


FLEET_HISTORY = timedelta(days=14)  # how far back other jobs' spot runs are read


def zone_stats(attempts: Sequence[AttemptRecord], now: datetime) -> dict[str, ZoneStats]:
    """What spot attempts saw of each zone: time run there, and the runs the market ended
    (the strategy's prior covers the down spells, which runs do not show)."""
    seen: dict[str, ZoneStats] = {}
    counted: set[int | None] = set()
    for a in attempts:
        if a.market != Market.SPOT or a.node_rank != 0:
            continue
        if a.id is not None and a.id in counted:
            continue
        counted.add(a.id)
        zone = zone_of(a.pool)
        s = seen.get(zone, ZoneStats())
        span = _seconds(a.ended_at or now, a.started_at)
        preempted = a.end_reason == AttemptEnd.PREEMPTED or a.preempted
        seen[zone] = ZoneStats(
            s.observed_s + span, s.available_s + span, s.interruptions + int(preempted)
        )
    return seen


@dataclass(frozen=True, slots=True)
class Offered:
    """What the policy could launch now, by market: the pools in rank order."""

    spot: tuple[Pool, ...] = ()
    on_demand: tuple[Pool, ...] = ()
    spot_usd: float | None = None  # the best of each, $/h
    on_demand_usd: float | None = None

    def spot_zones(self) -> frozenset[str]:
        return frozenset(zone_of(p) for p in self.spot)


NOTHING_OFFERED = Offered()


def situation(
    job: JobRecord,
    spec: JobSpec,
    attempts: Sequence[AttemptRecord],
    policy: Policy,
    now: datetime,
    offered: Offered = NOTHING_OFFERED,
    progress: JobProgress | None = None,
    interval_s: float | None = None,
    fleet: Sequence[AttemptRecord] = (),
) -> Situation | None:
    """The job's situation at `now`; None where it has no deadline or its work left is not
    known (then it is only watched for a missed deadline). `progress`: the job's own reports
    (`job_progress`), which tell the work left where they carry a total."""
    deadline = spec.deadline_at(job.created_at)
    left = work_left_s(spec, attempts, now, progress)
    # `fleet`: other jobs' recent attempts; those on the spot pools the job could launch in
    # now tell it what those pools did before it came (its own runs are counted anyway)
    pools = set(offered.spot)
    seen = [*attempts, *(a for a in fleet if a.pool in pools)]
    if deadline is None or left is None:
        return None
    overhead, _ = restart_overhead_s(policy, attempts)
    use, zone = running_now(attempts)
    return Situation(
        elapsed_s=_seconds(now, job.created_at),
        deadline_s=(deadline - job.created_at).total_seconds(),
        work_left_s=left,
        overhead_s=overhead,
        running=use,
        zone=zone,
        spot_now=offered.spot_zones(),
        stats=zone_stats(seen, now),
        spot_price=offered.spot_usd,
        on_demand_price=offered.on_demand_usd,
        work_s=spec.work.seconds if spec.work is not None else None,
        **({} if interval_s is None else {"interval_s": interval_s}),
    )


def markets_for(decision: Decision, policy: Policy) -> tuple[Market, ...] | None:
    """The markets a launch for the decision uses (None: the policy's own): spot for spot and
    for waiting (a launch that finds no spot leaves the job pending), on-demand for on-demand
    — where the policy allows that market at all."""
    want = Market.ON_DEMAND if decision.use is Use.ON_DEMAND else Market.SPOT
    return (want,) if want.value in policy.markets else None


# -- the shell: offers, events, moves ----------------------------------------------------------


def offered(
    store: Store, job: JobRecord, policy: Policy, now: datetime, memo: PassMemo | None = None
) -> Offered:
    """The pools the policy in force would launch the job in now (cooled pools left out:
    a pool that just had no capacity is not obtainable), by market, in rank order."""
    policy = effective(policy, now)
    found: dict[str, list[tuple[Pool, float]]] = {}
    for market in (Market.SPOT, Market.ON_DEMAND):
        if market.value not in policy.markets:
            continue
        only = policy.model_copy(update={"markets": [market.value]})
        ranking = launch_ranking(store, job.policy, only, now, replacing=job.id, memo=memo).ranking
        found[market.value] = [(pool_of(c.offer), c.offer.usd_per_hour) for c in ranking.candidates]
    spot, od = found.get("spot", []), found.get("on_demand", [])
    return Offered(
        spot=tuple(p for p, _ in spot),
        on_demand=tuple(p for p, _ in od),
        spot_usd=spot[0][1] if spot else None,
        on_demand_usd=od[0][1] if od else None,
    )


def describe(s: Situation) -> dict[str, Any]:
    """A situation's figures for an event or the job's view (seconds)."""
    return {
        "elapsed_s": round(s.elapsed_s, 1),
        "deadline_s": round(s.deadline_s, 1),
        "work_left_s": round(s.work_left_s, 1),
        "overhead_s": round(s.overhead_s, 1),
        "slack_s": round(slack_s(s), 1),
        "running": s.running.value,
    }


class Deadlines:
    """The deadline pass (reconcile.py): after the migration pass (its moves may be replaced
    or dropped here) and before the per-job pass (which applies the moves and launches with
    the markets left in the view)."""

    def __init__(self, acting: Acting, *, decide_every: timedelta | None = None) -> None:
        self.acting = acting
        # the reconcile timer: a decision is looked at again within this (the safety net
        # keeps one such interval of slack in hand)
        self.interval_s = None if decide_every is None else decide_every.total_seconds()
        self._said: set[tuple[int, str]] = set()  # (job id, event kind) already raised
        self._decided: dict[int, str] = {}  # job id -> the decision last logged

    def __call__(self, ctx: ReconcileContext, view: PassView) -> None:
        for job in view.live:
            try:
                self.job(ctx, view, job)
            except UNREACHABLE:
                raise
            except Exception as exc:
                self.acting.complain(f"deciding job {job.name}'s deadline", exc)

    def job(self, ctx: ReconcileContext, view: PassView, job: JobRecord) -> None:
        spec = pass_spec(job, ctx.memo)
        if spec.deadline is None:
            return
        loaded = ctx.policies.get(job.policy)
        if loaded is None:
            return
        policy = effective(loaded.policy, ctx.now)
        attempts = view.attempts.get(job.id, [])
        deadline = spec.deadline_at(job.created_at)
        assert deadline is not None
        offers = offered(ctx.store, job, policy, ctx.now, ctx.memo)
        progress = job_progress(ctx.store, job, ctx.now)
        fleet = ctx.memo.get(
            ("deadline-fleet",),
            lambda: ctx.store.jobs.attempts_since(ctx.now - FLEET_HISTORY),
        )
        s = situation(
            job, spec, attempts, policy, ctx.now, offers, progress, self.interval_s, fleet
        )
        decision = None if s is None else strategy(policy.recovery.deadline_strategy).decide(s)
        late = (
            missed(s) if s is not None else ctx.now > deadline
        )  # without work: past it, still live
        watched = Watched(
            deadline,
            s,
            decision,
            late,
            None if decision is None else markets_for(decision, policy),
        )
        view.deadlines[job.id] = watched
        if s is not None and decision is not None:
            if self._decided.get(job.id) != decision.reason:
                self._decided[job.id] = decision.reason
                log.info("job %s: deadline: %s", job.name, decision.reason)
            if decision.at_risk or at_risk(s):
                self._once(ctx, job, EventKind.JOB_DEADLINE_AT_RISK, watched)
            self._move(ctx, view, job, attempts, policy, offers, decision)
        if late:
            self._once(ctx, job, EventKind.JOB_DEADLINE_MISSED, watched)

    def _once(self, ctx: ReconcileContext, job: JobRecord, kind: EventKind, w: Watched) -> None:
        """Raise `kind` for the job unless it was raised before (by this replica or another)."""
        if (job.id, kind.value) in self._said:
            return
        self._said.add((job.id, kind.value))
        if ctx.store.events.list_events(kind=kind.value, job_id=job.id, limit=1):
            return
        data: dict[str, Any] = {"deadline": w.deadline.isoformat()}
        if w.situation is not None:
            data.update(describe(w.situation))
        if w.decision is not None:
            data["decision"] = w.decision.use.value
            data["reason"] = w.decision.reason
        if kind is EventKind.JOB_DEADLINE_AT_RISK:
            why = w.decision.reason if w.decision is not None else ""
            alert = Alert(
                kind,
                "warning",
                f"job {job.given_name}: deadline {w.deadline:%Y-%m-%d %H:%M:%S} UTC at risk: "
                f"it cannot be met on spot alone ({why})",
                data=tuple(data.items()),
            )
        else:
            alert = Alert(
                kind,
                "error",
                f"job {job.given_name}: deadline {w.deadline:%Y-%m-%d %H:%M:%S} UTC missed "
                "with work left",
                data=tuple(data.items()),
            )
        self.acting.emit(ctx, job, alert, dedupe=f"job:{job.id}:{kind.value}")
        self.acting.flush(ctx)

    def _move(
        self,
        ctx: ReconcileContext,
        view: PassView,
        job: JobRecord,
        attempts: Sequence[AttemptRecord],
        policy: Policy,
        offers: Offered,
        decision: Decision,
    ) -> None:
        """Leave in the view the move the decision asks of a running job (spot ↔ on-demand),
        and drop a planned migration that goes against it."""
        planned = view.moves.get(job.id)
        want = markets_for(decision, policy)
        if (
            planned is not None
            and want is not None
            and planned.targets
            and planned.targets[0].market != want[0]
        ):
            del view.moves[job.id]  # the deadline decides the market
        if JobState(job.state) is not JobState.RUNNING or want is None:
            return
        nodes = current_rows(list(attempts))
        if len(nodes) != 1 or nodes[0].job_started_at is None:
            return  # a gang is not moved; nor a job not started yet
        current = nodes[0]
        if current.market == want[0] or decision.use is Use.WAIT:
            return
        if want[0] is Market.ON_DEMAND:
            targets = offers.on_demand
            to_usd = offers.on_demand_usd
        else:
            targets = (
                tuple(
                    p for p in offers.spot if decision.zone is None or zone_of(p) == decision.zone
                )
                or offers.spot
            )
            to_usd = offers.spot_usd
        targets = tuple(p for p in targets if p != current.pool)[:MAX_TARGETS]
        if not targets:
            return
        view.moves[job.id] = Move(
            job_id=job.id,
            job=job.given_name,
            policy=job.policy,
            reason=Reason.DEADLINE,
            targets=targets,
            from_usd=current.usd_per_hour,
            to_usd=to_usd if to_usd is not None else current.usd_per_hour,
            expected_saving_usd=0.0,
            overhead_usd=0.0,
            message=f"deadline: {decision.reason}",
        )


def deadline_view(
    store: Store, job: JobRecord, policy: Policy | None, now: datetime
) -> dict[str, Any] | None:
    """The job's deadline as its view shows it (API, `jobs show`): the time, and where the
    work left is known, the slack and whether it is at risk; None for a job without one. A
    finished job is shown as it stood when it finished."""
    from optimizer.jobs.spec import job_spec

    spec = job_spec(job)
    deadline = spec.deadline_at(job.created_at)
    if deadline is None:
        return None
    live = JobState(job.state) in LIVE
    at = now if live else job.updated_at
    out: dict[str, Any] = {"at": deadline.isoformat(), "work_left_s": None, "slack_s": None}
    s = None
    if policy is not None:
        progress = job_progress(store, job, at)
        s = situation(job, spec, store.jobs.attempts(job.id), policy, at, progress=progress)
    if s is not None:
        out.update(describe(s))
    elif spec.work is None:
        out["note"] = WATCHED_ONLY
    if JobState(job.state) is JobState.SUCCEEDED:
        out["missed"] = at > deadline
    else:
        out["missed"] = missed(s) if s is not None else at > deadline
    # at risk as the pass says it: the slack below one restart, or the strategy's safety net
    # taking over (the moment job.deadline_at_risk is raised)
    risky = (
        s is not None
        and policy is not None
        and (at_risk(s) or strategy(policy.recovery.deadline_strategy).decide(s).at_risk)
    )
    out["at_risk"] = bool(live and risky)
    return out


__all__ = [
    "Deadlines",
    "Offered",
    "Watched",
    "deadline_view",
    "markets_for",
    "offered",
    "ran_s",
    "restart_overhead_s",
    "running_now",
    "situation",
    "work_left_s",
    "zone_stats",
]
