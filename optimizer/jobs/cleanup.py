"""The clean-up pass: ended attempts' instances stopped, reclaimed or left to the cloud.

Last in a pass, after the per-job pass has ended attempts: it reads the open attempts again.
An old attempt in a hot handover gets its `stop` once its replacement is ready
(`handover.handover`), or at its power-off less its checkpoint allowance, for which the pass
asks the daemon's alarm to wake it (`ReconcileContext.wake_at`); an ended attempt's instance
is terminated once its job exited or the stop's grace passed, or left for the cloud to end
where that costs less (`handover.reclaim`); an open attempt of a job that ended elsewhere is
ended and its instance terminated. Then the placements of gangs that are over are deleted
(placements.py). Each attempt on its own: one that raises is logged once, and the others are
still cleaned up.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

from optimizer.costs.billing import rule_for
from optimizer.jobs.acting import Acting, attempt_fields, log
from optimizer.jobs.context import UNREACHABLE, ReconcileContext
from optimizer.jobs.handover import LeaveToCloud, handing_over, handover, reclaim, stop_due
from optimizer.jobs.machine import Terminate
from optimizer.jobs.placements import release_placements
from optimizer.jobs.spec import DEFAULT_CHECKPOINT_ALLOWANCE_S, DEFAULT_PROBES, job_spec
from optimizer.jobs.standby import standby_ready
from optimizer.jobs.views import PassView, attempt_view, power_off_at, preempting
from optimizer.lifecycle import AttemptEnd, AttemptState
from optimizer.model import EventKind, Market
from optimizer.store import JobRecord
from optimizer.store.jobs import AttemptRecord

STOP_GRACE = timedelta(seconds=45)


class CleanUp:
    """The clean-up pass (reconcile.py); remembers the instances it left to the cloud."""

    def __init__(self, acting: Acting) -> None:
        self.acting = acting
        # Attempts whose instance this reconciler has recorded leaving to the cloud.
        self._left: set[str] = set()

    def __call__(self, ctx: ReconcileContext, view: PassView) -> None:
        try:
            self._clean_up(ctx, view)
            release_placements(ctx, self.acting.launcher.provider)  # of gangs that are over
        except UNREACHABLE:
            raise
        except Exception as exc:
            self.acting.complain("cleaning up ended attempts", exc)

    def _clean_up(self, ctx: ReconcileContext, view: PassView) -> None:
        """Terminate instances of ended attempts once their job exited or the grace passed,
        and open attempts of jobs that ended while their attempt stayed open (a state write
        from elsewhere; cancels are decided in a pass and end the attempt themselves)."""
        live = {job.id for job in view.live}
        jobs = {job.id: job for job in ctx.jobs}
        attempts = ctx.store.jobs.open_attempts()
        opened = [a for a in attempts if not a.ended]
        for attempt in attempts:
            try:
                self._one(ctx, attempt, live, jobs, opened)
            except UNREACHABLE:
                raise
            except Exception as exc:  # the other attempts are still cleaned up
                self.acting.complain(f"cleaning up attempt {attempt.key}", exc)

    def _one(
        self,
        ctx: ReconcileContext,
        attempt: AttemptRecord,
        live: set[int],
        jobs: dict[int, JobRecord],
        opened: list[AttemptRecord],
    ) -> None:
        """One attempt's part of the clean-up."""
        if attempt.instance_id is None:
            return
        if not attempt.ended and attempt.job_id not in live:
            asked = self.acting.terminate(ctx, attempt.key)
            # Its end (and the time the provider reports for it) comes from describe; a
            # failed call is asked again as a leftover.
            gone = {"instance_gone": True} if asked == "unavailable" else {}
            ctx.store.jobs.update_attempt(
                attempt.key,
                state=AttemptState.ENDED,
                ended_at=ctx.now,
                end_reason=AttemptEnd.USER,
                **gone,
            )
            return
        if not attempt.ended:
            return
        # (A finished job's instance was terminated as it ended: skipped below once that
        # call went through, asked again here when it failed.)
        old = attempt_view(attempt, power_off_at=power_off_at(ctx.store, attempt))
        if handing_over(old) and attempt.job_id in live:
            job = jobs.get(attempt.job_id)
            spec = job_spec(job) if job is not None else None
            current = next(
                (a for a in opened if a.job_id == attempt.job_id and not a.idle_spare), None
            )
            new = attempt_view(current) if current is not None else None
            if new is not None and current is not None and spec is not None and spec.standby:
                new = replace(new, standby_ready=standby_ready(ctx.store, current, now=ctx.now))
            allowance = timedelta(
                seconds=spec.checkpoint_allowance_s
                if spec is not None
                else DEFAULT_CHECKPOINT_ALLOWANCE_S
            )
            stop = handover(
                old,
                new,
                now=ctx.now,
                probes=spec.probes if spec is not None else DEFAULT_PROBES,
                allowance=allowance,
            )
            if stop is not None:
                ctx.store.jobs.update_attempt(attempt.key, stop_sent_at=ctx.now)
                log.info("stopping %s: %s", attempt.key, stop.reason)
            elif (due := stop_due(old, allowance)) is not None:
                ctx.wake_at(due)  # a pass at the window's instant, not at the next tick
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
            and self.acting.terminate(ctx, attempt.key) == "unavailable"
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
                    **attempt_fields(attempt),
                    "attempt_key": attempt.key,
                    "power_off_at": leave.at.isoformat(),
                    "reason": leave.reason,
                },
                dedupe_key=f"attempt:{attempt.key}:left-to-cloud",
            )
            ctx.store.events.record_events([replace(event, job_id=attempt.job_id)], ctx.now)
            log.info("leaving %s to the cloud: %s", attempt.instance_id, leave.reason)
        self._left.add(attempt.key)


def _attempt_key(data: dict[str, Any] | None) -> object:
    """The attempt key a `job.instance_left_to_cloud` event names (`attempt` held the key in
    events recorded before `attempt` became the number)."""
    data = data or {}
    return data.get("attempt_key", data.get("attempt"))


def free_window(a: AttemptRecord) -> timedelta | None:
    """How soon after its launch a spot instance the cloud interrupts costs nothing on the
    attempt's provider (optimizer/costs/billing.py); None for on-demand."""
    if a.market != Market.SPOT.value:
        return None
    seconds = rule_for(a.provider).interrupted_free_s
    return None if seconds is None else timedelta(seconds=seconds)


__all__ = ["STOP_GRACE", "CleanUp", "free_window"]
