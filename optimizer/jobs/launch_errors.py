"""What a failed launch call costs, as the recovery strategy answers (recovery.py).

`launch.Launcher.launch` calls these on a capacity, quota or credentials error: each ends the
attempt, applies what the strategy's `after_launch_error` says (a pool cooled down, a
provider sitting out) and queues the alert the job's transition records.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from optimizer.jobs.context import ReconcileContext
from optimizer.jobs.machine import Alert
from optimizer.jobs.recovery import LaunchError, Strategy
from optimizer.lifecycle import AttemptEnd, AttemptState
from optimizer.model import EventKind
from optimizer.store import JobRecord
from optimizer.store.jobs import AttemptRecord
from providers.base import AuthError, CapacityError, QuotaError

# Queue an event about a job, recorded with its transition: (ctx, job, alert, dedupe key,
# the attempt it concerns).
Emit = Callable[[ReconcileContext, JobRecord, Alert, str | None, AttemptRecord | None], None]


def after_capacity(
    ctx: ReconcileContext,
    job: JobRecord,
    attempt: AttemptRecord,
    strategy: Strategy,
    exc: CapacityError,
    emit: Emit,
) -> None:
    """No capacity in the pool: it cools down (if the strategy says so), and the walk tries
    the next offer."""
    sit = strategy.after_launch_error(LaunchError.CAPACITY, ctx.now)
    if sit.pool_until is not None:
        ctx.store.jobs.add_cooldown(attempt.pool, sit.pool_until, f"no capacity: {exc}")
    end(ctx, attempt, AttemptEnd.CAPACITY)
    emit(
        ctx,
        job,
        Alert(
            EventKind.JOB_LAUNCH_FAILED,
            "info",
            f"no capacity on {attempt.pool.label}; trying the next offer",
        ),
        None,
        attempt,
    )


def after_quota(
    ctx: ReconcileContext,
    job: JobRecord,
    attempt: AttemptRecord,
    strategy: Strategy,
    exc: QuotaError,
    emit: Emit,
) -> None:
    """The quota in the provider/region is used up: an alert, and the pool cools down (if the
    strategy says so); the walk skips the provider/region."""
    sit = strategy.after_launch_error(LaunchError.QUOTA, ctx.now)
    end(ctx, attempt, AttemptEnd.QUOTA)
    emit(
        ctx,
        job,
        Alert(
            EventKind.PROVIDER_QUOTA_EXCEEDED,
            "warning",
            f"quota on {attempt.provider} {attempt.region}: {exc}",
        ),
        f"quota:{attempt.provider}:{attempt.region}",
        attempt,
    )
    if sit.pool_until is not None:
        ctx.store.jobs.add_cooldown(attempt.pool, sit.pool_until, f"quota: {exc}")


def after_auth(
    ctx: ReconcileContext,
    job: JobRecord,
    attempt: AttemptRecord,
    strategy: Strategy,
    exc: AuthError,
    emit: Emit,
    disabled: dict[str, datetime],
) -> None:
    """The provider refused our credentials: an alert, and the provider sits out (`disabled`,
    provider -> until) for as long as the strategy says."""
    sit = strategy.after_launch_error(LaunchError.AUTH, ctx.now)
    sits_out = ""
    if sit.provider_until is not None:
        disabled[attempt.provider] = sit.provider_until
        hours = (sit.provider_until - ctx.now).total_seconds() / 3600
        sits_out = f"; no launches on {attempt.provider} for {hours:g} h"
    end(ctx, attempt, AttemptEnd.AUTH)
    emit(
        ctx,
        job,
        Alert(
            EventKind.PROVIDER_AUTH_FAILED,
            "error",
            f"{attempt.provider} refused the launch: {exc}{sits_out}",
        ),
        f"auth:{attempt.provider}",
        attempt,
    )


def end(ctx: ReconcileContext, attempt: AttemptRecord, why: str) -> None:
    """End an attempt (its instance counts as gone when it never had one)."""
    ctx.store.jobs.update_attempt(
        attempt.key,
        state=AttemptState.ENDED,
        ended_at=ctx.now,
        end_reason=why,
        instance_gone=attempt.instance_id is None,
    )


__all__ = ["Emit", "after_auth", "after_capacity", "after_quota", "end"]
