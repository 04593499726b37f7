"""A job's warm spare, decided here: where it goes, when it ends, when a new one is launched,
and whether it may take the job over. Pure, as machine.py; the spares pass (spares.py)
applies these decisions.

A job with `warm_spare: true` keeps one extra instance beside its running attempt: an attempt
row with `spare` set, launched, booted, registered and probed like any attempt, whose agent
then waits at the fence (fence.py answers it "warm spare") and never starts the job. When the
job's attempt must be replaced (an interruption notice, a failed probe, a lost instance, a
move), the spare takes the job over instead of a launch (`promotable`): it is renumbered as
the job's newest attempt and `promoted_at` is set, so the fence and the handover treat it as
they treat any replacement, and a new spare is launched.

Where the spare goes (`spare_order`): the cheapest offer by the policy's own ranking, taken
first among pools in another zone (or region, or provider) than the running attempt's, then
among other pools in the same zone, and only then the running attempt's own pool. A spot
reclaim takes capacity back by pool and zone, so a spare in the same pool is likely to go in
the same wave as the attempt it stands beside; one elsewhere is not. The same-pool spare is
kept as the last choice because it still covers a lost instance or a failed probe.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from optimizer.jobs.machine import AttemptView, Launch, relaunch_reason
from optimizer.lifecycle import TERMINAL_JOB_STATES, AttemptEnd, JobState
from optimizer.model import Offer, Pool


def _place(pool: Pool) -> tuple[str, str, str | None]:
    return pool.provider, pool.region, pool.zone


def spare_order(offers: Sequence[Offer], apart_from: Pool | None) -> list[Offer]:
    """`offers` (in the ranking's order) as a spare tries them: those in another place than
    `apart_from` (the running attempt's pool) first, then other pools in its zone, then its
    own pool; each group in the ranking's order (see the module's docstring)."""
    if apart_from is None:
        return list(offers)

    def group(offer: Offer) -> int:
        pool = offer.pool
        if pool == apart_from:
            return 2
        return 1 if _place(pool) == _place(apart_from) else 0

    return sorted(offers, key=group)  # stable: the ranking's order within each group


@dataclass(frozen=True, slots=True)
class SpareDecision:
    """What to do about a job's spare: end it (with this end reason), launch a new one."""

    end: AttemptEnd | None = None
    why: str = ""
    launch: bool = False


def healthy(spare: AttemptView) -> bool:
    """A spare that could still take the job over: no notice, not gone, its probe not failed."""
    return (
        spare.interruption_notice_at is None
        and not spare.preempted
        and not spare.instance_gone
        and spare.probe_status != "fail"
    )


def decide_spare(
    *,
    wanted: bool,
    state: JobState,
    current: AttemptView | None,
    spare: AttemptView | None,
    now: datetime,
    register_timeout: timedelta,
) -> SpareDecision:
    """The job's spare after the per-job pass: `wanted` (the spec's `warm_spare`), the job's
    `state`, its current attempt (None: none open) and its idle spare (None: none open).

    A spare is kept only beside an open attempt of a live job: a job that ended (succeeded,
    failed, cancelled, stopped) releases it. A spare that is interrupted, lost, fails its
    probe or never registers is ended as an attempt would be (its reason is the state
    machine's) and replaced. A job with an open attempt and no spare gets one launched once
    that attempt is `ready`."""
    live = wanted and state not in TERMINAL_JOB_STATES
    if spare is not None:
        if not live:
            return SpareDecision(AttemptEnd.SPARE_RELEASED, f"the job is {state.value}")
        failed = relaunch_reason(spare, now, register_timeout)
        if failed is not None:
            return SpareDecision(
                AttemptEnd(failed.why.value), failed.message, launch=current is not None
            )
        return SpareDecision()
    if live and current is not None and ready(current):
        return SpareDecision(launch=True, why=f"beside attempt {current.number}")
    return SpareDecision()


def ready(current: AttemptView) -> bool:
    """Whether the running attempt has come through its own start (its probe passed or
    warned, or its job started), so that a spare may be launched beside it.

    Waiting for it costs the spare one probe's time at the job's first start and buys three
    things: a first launch that fails its probe is replaced without a spare already paid
    for; the spare's probe never runs while the attempt's own probe does, so on a host whose
    instances share a GPU (the local cloud on a GPU machine) neither measures the other's
    load; and where the spare's type is the attempt's, the type has a full probe on record,
    so the spare runs the short handover probe (docs/probes.md)."""
    return current.job_started or current.probe_status in ("pass", "warn")


def promotable(spare: AttemptView, market: str, launch: Launch) -> bool:
    """Whether the spare may take the job over in place of `launch` (a relaunch, or a move's
    launch): it is healthy and the launch would allow its pool (not avoided, in the markets
    the launch asks for, among a move's targets). `market`: the spare's market."""
    if not healthy(spare) or spare.pool in launch.avoid:
        return False
    if launch.markets is not None and market not in {m.value for m in launch.markets}:
        return False
    return launch.only is None or spare.pool in launch.only


__all__ = ["SpareDecision", "decide_spare", "healthy", "promotable", "ready", "spare_order"]
