"""The utilization watch: a running attempt held to its utilization rules and max_duration.

The per-job pass (per_job.py) asks it about each job whose current attempt's job has started
and whose policy or spec has rules (utilization.rules_for), before the state machine
decides: it queues a `job.underused` event per alert rule's window (recorded with the job's
transition), and says why to stop, if a rule does (`machine.PolicyStop`, which `decide`
turns into a stop). Which windows it already alerted on is remembered, and read back from
the events after a restart or a change of leader.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from optimizer.clock import parse_utc
from optimizer.jobs.acting import Acting
from optimizer.jobs.context import ReconcileContext
from optimizer.jobs.machine import Alert, PolicyStop
from optimizer.jobs.utilization import Rules, Sample, watch
from optimizer.model import EventKind
from optimizer.store import JobRecord, Store
from optimizer.store.jobs import AttemptRecord


class Watch:
    """The utilization watch the per-job pass consults (one per reconciler)."""

    def __init__(self, acting: Acting) -> None:
        self.acting = acting
        # (attempt key, rule) -> the end of the window it last alerted on (read from the
        # events after a restart or a change of leader).
        self._alerted: dict[tuple[str, str], datetime | None] = {}

    def forget(self, open_keys: Iterable[str]) -> None:
        """Keep only what is remembered about attempts still open."""
        keep = set(open_keys)
        self._alerted = {k: v for k, v in self._alerted.items() if k[0] in keep}

    def __call__(
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
            self.acting.emit(
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
            self._alerted[key] = None if end is None else parse_utc(end)
        return self._alerted[key]


def gpu_samples(store: Store, attempt_id: int, *, since: datetime) -> list[Sample]:
    """An attempt's GPU readings (`gpu_sample`) whose span ends after `since`, oldest first."""
    return [
        Sample(s.start, timedelta(seconds=s.span_s), s.util_mean)
        for s in store.telemetry.ending_after(attempt_id, since)
    ]


__all__ = ["Watch", "gpu_samples"]
