"""What happens to an attempt's job after a handover: the fence, the stop, the reclaim.

Pure decisions, as in machine.py, over the state machine's views of attempts. An attempt
interrupted by a notice, or ended by a move (`machine.MIGRATED`), hands its job over: the old
job keeps running while its replacement boots and probes, and `handover` says when it gets
its stop; `fence` says why the replacement's agent must not start the job yet (the jobs
layer's fence.py asks it for the agent API); `reclaim` says who ends an ended attempt's
instance, gpuopt or the cloud.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from optimizer.jobs.machine import AttemptView, Stop, Terminate, finished_on

# How long past its announced power-off an earlier attempt whose job never reported its exit,
# and whose instance the cloud never reported gone, holds the fence before the clock lifts it.
# Only a silent agent and a silent cloud together reach it: a cloud that works shows the
# instance terminated within a pass of its power-off, and one that keeps it running is asked
# to terminate it at the power-off plus RECLAIM_MARGIN (2 min). Five minutes covers that,
# the 45 s stop grace and a few describe passes; the replacement idles for it (billed), a
# small price next to two runs writing one checkpoint folder.
FENCE_CLOCK_MARGIN = timedelta(minutes=5)


def _holds(a: AttemptView) -> bool:
    """Whether an earlier attempt's job may still run and write its checkpoint: it started,
    has not reported its exit nor committed its final checkpoint to the job's bucket, and its
    instance has not been seen gone."""
    return a.job_started and a.exit_code is None and not a.instance_gone and not a.final_checkpoint


def fence(
    earlier: Sequence[AttemptView], *, now: datetime, margin: timedelta = FENCE_CLOCK_MARGIN
) -> str | None:
    """Why an attempt's agent must not start the job yet (None: the fence is lifted).

    The job may run once at a time: an earlier attempt whose job started holds the fence until
    its agent reports the job exited (`job_exited`) or the cloud reports its instance
    terminated (`instance_gone`), or, for a job whose checkpoints live in a bucket
    (`checkpoint`), its agent reports the job's final checkpoint committed there
    (`final_checkpoint`): the replacement restores that one, and what the old job does
    while it exits can no longer reach it. The announced power-off alone never lifts it, as
    a job may still be writing its checkpoint then (to the same `checkpoint_dir`); only once
    `margin` has passed since it (`lifted_on_clock`, an event says so) does the clock let go. A job
    that finished on an earlier attempt (`finished_on`) holds it for good: the replacement is
    ended without starting it."""
    done = finished_on(earlier)
    if done is not None:
        return f"attempt {done.number}'s job has finished"
    for a in earlier:
        if not _holds(a) or _past_clock(a, now, margin):
            continue
        return f"attempt {a.number}'s job has not exited yet"
    return None


def _past_clock(a: AttemptView, now: datetime, margin: timedelta) -> bool:
    return a.power_off_at is not None and now >= a.power_off_at + margin


def lifted_on_clock(
    earlier: Sequence[AttemptView], *, now: datetime, margin: timedelta = FENCE_CLOCK_MARGIN
) -> list[AttemptView]:
    """The earlier attempts the fence lets go of on the clock alone: their job never
    reported its exit and their instance was never seen gone, `margin` after the power-off
    their notice announced (see `fence`)."""
    return [a for a in earlier if _holds(a) and _past_clock(a, now, margin)]


DEFAULT_CHECKPOINT_ALLOWANCE = timedelta(seconds=20)


def handing_over(old: AttemptView) -> bool:
    """Whether an interrupted (or migrated) attempt's job may still be running unstopped (a
    hot handover)."""
    return (
        (old.interruption_notice_at is not None or old.migrated)
        and not old.stop_sent
        and not old.instance_gone
        and old.exit_code is None
    )


def stop_due(old: AttemptView, allowance: timedelta) -> datetime | None:
    """When the checkpoint window stops a handing-over attempt's job at the latest: its
    notice's power-off less the job's checkpoint `allowance` (None: no power-off, as after a
    move). The daemon wakes its pass at that instant (`ReconcileContext.wake_at`), and the
    agent, which reads the same power-off from the notice, stops the job itself then should
    the daemon's word not have reached it (optimizer/agent/window.py)."""
    return None if old.power_off_at is None else old.power_off_at - allowance


def handover(
    old: AttemptView,
    new: AttemptView | None,
    *,
    now: datetime,
    probes: str,
    allowance: timedelta = DEFAULT_CHECKPOINT_ALLOWANCE,
) -> Stop | None:
    """When an interrupted (or migrated) attempt's job gets SIGTERM to checkpoint: once its
    replacement (`new`, the job's current attempt) is ready to start the job (and, for a job
    in standby, has started it up: `standby_ready`), or once the power-off is within the
    job's checkpoint `allowance`, whichever comes first; at once if the job never started.
    None: keep it running (or it is already stopped or over). A migrated attempt has no
    power-off: it runs until its replacement is ready."""
    if not handing_over(old):
        return None
    why = "moved" if old.migrated and old.interruption_notice_at is None else "interrupted"
    if not old.job_started:
        return Stop(old.key, f"{why} before the job started")
    if (
        new is not None
        and new.registered
        and (probes == "none" or new.probe_status in ("pass", "warn"))
        and new.standby_ready
    ):
        return Stop(old.key, f"{why}; attempt {new.number} is ready to take over")
    due = stop_due(old, allowance)
    if due is not None and now >= due:
        return Stop(old.key, "interrupted; the power-off is near")
    return None


def leftover(
    attempt: AttemptView, *, stop_sent_at: datetime | None, now: datetime, grace: timedelta
) -> Terminate | None:
    """An ended attempt whose instance still runs: terminate it once its job has exited or
    the stop's grace period is over (a rebalance notice leaves the instance running)."""
    if attempt.instance_gone:
        return None
    if attempt.exit_code is not None:
        return Terminate(attempt.key, "attempt ended; job exited")
    if stop_sent_at is None or now - stop_sent_at >= grace:
        return Terminate(attempt.key, "attempt ended; grace period over")
    return None


def _span(delta: timedelta) -> str:
    seconds = delta.total_seconds()
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


# How long past the announced power-off an instance left to the cloud may still run before
# gpuopt terminates it after all (the cloud's action is "approximate"; nothing may leak).
RECLAIM_MARGIN = timedelta(minutes=2)


@dataclass(frozen=True, slots=True)
class LeaveToCloud:
    """Do not terminate an interrupted attempt's instance: the cloud ends it at the power-off
    its notice announced (`at`), which costs less than ending it ourselves. `until` is when
    gpuopt terminates it after all if it still runs."""

    key: str
    reason: str
    at: datetime
    until: datetime


def reclaim(
    attempt: AttemptView,
    *,
    stop_sent_at: datetime | None,
    now: datetime,
    grace: timedelta,
    free_window: timedelta | None,
    preempting: bool = False,
    margin: timedelta = RECLAIM_MARGIN,
) -> Terminate | LeaveToCloud | None:
    """Who ends an ended attempt's instance that still runs: gpuopt (Terminate, as `leftover`
    decides), or the cloud (LeaveToCloud), or nobody yet (None).

    Who ends an interrupted spot instance decides what it costs. AWS charges nothing for a
    spot instance EC2 interrupts within its first hour, but the seconds used when its owner
    terminates it (the EC2 user guide, "Billing for interrupted Spot Instances"). So when the
    notice names a power-off (`attempt.power_off_at`) less than `free_window` after the
    instance's launch (`instance_launched_at`, else the attempt's start), the instance is left
    to the cloud, whether or not its job has exited. `preempting` says the cloud is already
    ending it (a GCP preemption: the VM stops within 30 s whatever gpuopt does), which is left
    to the cloud too, as deleting it would only race the cloud's own end. Either way, an
    instance still running `margin` past the power-off is terminated, so nothing leaks.
    Otherwise (no notice, no credit for this provider or market, or a power-off past the free
    window, where the cloud's end would bill every second up to it) the instance is
    terminated as soon as its job has exited or the stop's grace is over (`leftover`)."""
    if attempt.instance_gone:
        return None
    off = attempt.power_off_at
    if off is not None:
        launched = attempt.instance_launched_at or attempt.launched_at
        free = free_window is not None and off - launched < free_window
        if free or preempting:
            until = off + margin
            if now >= until:
                return Terminate(
                    attempt.key, "interrupted; still running past the power-off it announced"
                )
            if free:
                reason = (
                    f"the cloud's own end, {_span(off - launched)} after the launch, costs nothing"
                )
            else:
                reason = "the cloud is already ending it"
            return LeaveToCloud(attempt.key, reason, off, until)
    return leftover(attempt, stop_sent_at=stop_sent_at, now=now, grace=grace)


__all__ = [
    "DEFAULT_CHECKPOINT_ALLOWANCE",
    "FENCE_CLOCK_MARGIN",
    "RECLAIM_MARGIN",
    "LeaveToCloud",
    "fence",
    "handing_over",
    "handover",
    "leftover",
    "lifted_on_clock",
    "reclaim",
    "stop_due",
]
