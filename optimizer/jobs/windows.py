"""At a schedule window's boundary: re-evaluate the policy's running jobs and say what changed.

`WindowWatch` is a reconciler (optimizer/jobs/context.py) that runs before the job
reconciler in each pass. For every policy with a schedule it looks for transitions since its
previous pass (`policies.schedule.transitions`); at one it ranks the latest offers under the
policy now in force, checks each running job's pool against that ranking (`reassess`, pure:
allowed, or the rule that now rejects it), and records one `policy.window_changed` event and
alert with the keys that changed and the verdict per job (`boundary_event`, pure). The event
is recorded once per policy and transition, whichever replica or restart sees it.

Moving the jobs a window no longer allows is migration's (optimizer/jobs/migration.py), which
reads the policy in force on every pass; `WindowWatch.listeners` is the hook for anything
else that must act at the boundary itself: each listener is called with the pass's context,
the `WindowChange` and the verdicts, after the event is recorded, and at most once per
transition per replica.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from optimizer.clock import utc_text
from optimizer.jobs.context import UNREACHABLE, ReconcileContext
from optimizer.jobs.measured import DEFAULT_WINDOW, ProbeWindow, measured
from optimizer.jobs.offer_table import latest_table
from optimizer.jobs.ranking import pool_of
from optimizer.lifecycle import JobState
from optimizer.model import EventKind, Pool
from optimizer.store import JobRecord
from optimizer.store.events import EventRecord
from optimizer.store.jobs import AttemptRecord
from policies.engine import Ranking, evaluate
from policies.schedule import Change, Transition, apply, changes, name_of, transitions
from policies.schema import Policy
from policies.windows import zone

log = logging.getLogger(__name__)

# On its first pass for a policy (a start, a new leader, a new policy) the watch looks back
# this far, so a boundary passed while no replica was watching is still alerted once.
LOOK_BACK = timedelta(minutes=10)


@dataclass(frozen=True, slots=True)
class WindowChange:
    """A policy's window changed: the transition and the plain policies on either side."""

    policy: str
    transition: Transition
    before: Policy
    after: Policy
    changes: tuple[Change, ...]


@dataclass(frozen=True, slots=True)
class JobVerdict:
    """A running job's pool under the policy in force after a transition."""

    job: str
    job_id: int
    pool: Pool
    usd_per_hour: float
    allowed: bool | None  # None: its pool is not among the latest offers (cannot tell)
    rule: str | None = None  # the rule that rejects it now
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "pool": str(Pool(*self.pool)),
            "usd_per_hour": self.usd_per_hour,
            "allowed": self.allowed,
            "rule": self.rule,
            "reason": self.reason,
        }

    def __str__(self) -> str:
        where = f"{self.job} on {Pool(*self.pool)}"
        if self.allowed is None:
            return f"{where}: its pool is not among the latest offers"
        if self.allowed:
            return f"{where}: still allowed"
        return f"{where}: no longer allowed ({self.rule}: {self.reason})"


def _zoneless(pool: Pool) -> Pool:
    provider, region, _zone, instance_type, market = pool
    return Pool(provider, region, None, instance_type, market)


def reassess(
    ranking: Ranking, running: Iterable[tuple[JobRecord, AttemptRecord]]
) -> list[JobVerdict]:
    """Each running job's pool judged by `ranking`: allowed when it is a candidate, else the
    rule that rejected it. An attempt records the zone it landed in, where a regional offer
    (on-demand, per region) has none: its regional pool stands for it then."""
    verdict: dict[Pool, tuple[bool, str | None, str]] = {}
    for c in ranking.candidates:
        verdict.setdefault(pool_of(c.offer), (True, None, ""))
    for r in ranking.rejections:
        verdict.setdefault(pool_of(r.offer), (False, r.rule, r.reason))
    out = []
    for job, attempt in running:
        pool = attempt.pool
        found = verdict.get(pool) or verdict.get(_zoneless(pool))
        allowed, rule, reason = found if found is not None else (None, None, "")
        out.append(JobVerdict(job.name, job.id, pool, attempt.usd_per_hour, allowed, rule, reason))
    return out


def boundary_event(
    change: WindowChange, verdicts: Sequence[JobVerdict], tz: Any
) -> tuple[str, str, dict[str, Any]]:
    """(severity, message, data) of the `policy.window_changed` event: warning when a running
    job's pool is no longer allowed, info otherwise."""
    t = change.transition
    local = t.at.astimezone(tz)
    what = "; ".join(str(c) for c in change.changes) or "no key changes"
    jobs = "; ".join(str(v) for v in verdicts) or "no running jobs"
    message = (
        f"policy {change.policy}: {name_of(t.before)} -> {name_of(t.after)} at "
        f"{local:%a %Y-%m-%d %H:%M %Z}: {what}. Running jobs re-evaluated: {jobs}"
    )
    severity = "warning" if any(v.allowed is False for v in verdicts) else "info"
    data = {
        "at": utc_text(t.at),
        "before": t.before,
        "after": t.after,
        "changes": [{"key": c.key, "before": c.before, "after": c.after} for c in change.changes],
        "jobs": [v.to_dict() for v in verdicts],
    }
    return severity, message, data


Listener = Callable[[ReconcileContext, WindowChange, Sequence[JobVerdict]], None]


@dataclass
class WindowWatch:
    """A reconciler: one `policy.window_changed` event per policy per transition (module
    docstring); `listeners` are called at each boundary this replica alerts."""

    probe_window: ProbeWindow = DEFAULT_WINDOW
    listeners: list[Listener] = field(default_factory=list)
    look_back: timedelta = LOOK_BACK
    name: str = "schedule_windows"
    _since: dict[str, datetime] = field(default_factory=dict, init=False, repr=False)

    def __call__(self, ctx: ReconcileContext) -> None:
        for name in sorted(ctx.policies):
            policy = ctx.policies[name].policy
            if policy.schedule is None:
                self._since.pop(name, None)
                continue
            since = self._since.get(name, ctx.now - self.look_back)
            self._since[name] = ctx.now
            edges = transitions(policy.schedule, since, ctx.now)
            if not edges:
                continue
            # Several boundaries passed since the last look (a daemon that was down): one
            # event, from the window then to the window now, at the last boundary.
            edge = Transition(edges[-1].at, edges[0].before, edges[-1].after)
            try:
                self._boundary(ctx, name, policy, edge)
            except UNREACHABLE:
                raise
            except Exception:  # one policy's trouble never keeps the others' boundaries
                log.exception("schedule window of policy %s could not be judged", name)

    def _boundary(self, ctx: ReconcileContext, name: str, policy: Policy, edge: Transition) -> None:
        schedule = policy.schedule
        assert schedule is not None  # the caller checked
        before = apply(policy, schedule.window(edge.before) if edge.before else None)
        after = apply(policy, schedule.window(edge.after) if edge.after else None)
        change = WindowChange(name, edge, before, after, tuple(changes(before, after)))
        running = _running(ctx, name)
        verdicts: list[JobVerdict] = []
        if running:
            ranking = evaluate(
                after,
                latest_table(ctx.store),  # the kept table of the latest offers
                ctx.now,
                measured=measured(ctx.store, self.probe_window),
            )
            verdicts = reassess(ranking, running)
        severity, message, data = boundary_event(change, verdicts, zone(schedule.timezone))
        at = data["at"]
        event = ctx.emitter.draft(
            EventKind.POLICY_WINDOW_CHANGED,
            message,
            severity=severity,
            policy=name,
            data=data,
            dedupe_key=f"window:{name}:{at}",
        )

        def same(record: EventRecord) -> bool:
            return record.policy == name and (record.data or {}).get("at") == at

        ctx.store.events.record_once(event, since=edge.at, same=same, at=ctx.now)
        for listener in self.listeners:
            listener(ctx, change, verdicts)


def _running(ctx: ReconcileContext, policy: str) -> list[tuple[JobRecord, AttemptRecord]]:
    """The policy's running jobs, each with its open attempt."""
    jobs = [j for j in ctx.jobs if j.policy == policy and j.state == JobState.RUNNING.value]
    if not jobs:
        return []
    attempts = ctx.store.jobs.attempts_of(j.id for j in jobs)
    out = []
    for job in jobs:
        rows = attempts.get(job.id, [])
        current = next((a for a in reversed(rows) if not a.ended and not a.idle_spare), None)
        if current is not None:
            out.append((job, current))
    return out


__all__ = [
    "LOOK_BACK",
    "JobVerdict",
    "Listener",
    "WindowChange",
    "WindowWatch",
    "boundary_event",
    "reassess",
]
