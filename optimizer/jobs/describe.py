"""The describe step: what the clouds report about the open attempts' instances.

Marks attempts whose instance the provider reports ended (and why), and records the billing
facts it reports: the launch and termination times, and who ended it. It runs first in a
pass, so the pass's view (views.py) sees the attempts the clouds ended. One provider's
trouble never stops the others' describe.
"""

from __future__ import annotations

from datetime import datetime

from optimizer.jobs.acting import Acting, log
from optimizer.jobs.context import UNREACHABLE, ReconcileContext
from optimizer.jobs.views import power_off_at
from optimizer.store.jobs import AttemptRecord
from providers.base import EndReason, InstanceRef, InstanceState, InstanceStatus, ProviderError


class Describe:
    """The describe step of a pass (reconcile.py)."""

    def __init__(self, acting: Acting) -> None:
        self.acting = acting

    def __call__(self, ctx: ReconcileContext) -> None:
        by_provider: dict[str, list[AttemptRecord]] = {}
        for a in ctx.store.jobs.open_attempts():
            if a.instance_id:
                by_provider.setdefault(a.provider, []).append(a)
        for provider, group in by_provider.items():
            try:
                self._on(ctx, provider, group)
            except UNREACHABLE:
                raise
            except Exception as exc:  # one provider's trouble never stops the others' describe
                self.acting.complain(f"describing instances on {provider}", exc)

    def _on(self, ctx: ReconcileContext, provider: str, group: list[AttemptRecord]) -> None:
        source = self.acting.launcher.provider(ctx, provider)
        if source is None:
            return
        refs = [InstanceRef(a.provider, a.region, a.zone, a.instance_id or "") for a in group]
        try:
            statuses = source.describe(refs)
        except ProviderError as exc:
            log.warning("describe on %s failed: %s", provider, exc)
            return
        by_instance = {a.instance_id: a for a in group}
        for status in statuses:
            attempt = by_instance[status.ref.instance_id]
            launched = status.launched_at if attempt.launched_at is None else None
            if status.state is InstanceState.TERMINATED:
                preempted = status.end_reason is EndReason.PREEMPTED
                ctx.store.jobs.record_billing(
                    attempt.key,
                    launched_at=launched,
                    terminated_at=termination(ctx, attempt, status),
                    # The cloud ended it; gpuopt's own terminate was recorded at the call.
                    terminated_by="cloud" if preempted else None,
                    instance_gone=True,
                    preempted=preempted,
                )
            elif launched is not None:
                ctx.store.jobs.record_billing(attempt.key, launched_at=launched)


def termination(ctx: ReconcileContext, a: AttemptRecord, status: InstanceStatus) -> datetime:
    """When an instance the provider reports terminated ended: the provider's own time; for
    one the cloud interrupted without saying when, the power-off its notice announced (AWS's
    notice names the action's time); else now, when gpuopt saw it gone (docs/costs.md)."""
    if status.terminated_at is not None:
        return status.terminated_at
    if status.end_reason is EndReason.PREEMPTED:
        announced = power_off_at(ctx.store, a)
        if announced is not None and announced <= ctx.now:
            return announced
    return ctx.now


__all__ = ["Describe", "termination"]
