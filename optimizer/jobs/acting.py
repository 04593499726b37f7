"""What the reconciler's passes share to act: the launcher, the events queued for a job's
transition, asking a cloud to end an instance, and complaints logged once.

Events raised while acting on a job (a launch that failed, a utilization alert) are queued
here and recorded with the job's transition, in one transaction, or flushed on their own when
the job's pass made none.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Literal

from optimizer.jobs.bootstrap import AgentSettings
from optimizer.jobs.context import ReconcileContext
from optimizer.jobs.gang import head_number
from optimizer.jobs.launch import Launcher
from optimizer.jobs.machine import Alert
from optimizer.jobs.measured import DEFAULT_WINDOW, ProbeWindow
from optimizer.jobs.migration_inputs import why as describe_error
from optimizer.model import EventKind
from optimizer.store import JobRecord, NewEvent
from optimizer.store.jobs import AttemptRecord
from providers.base import InstanceRef, ProviderError

# The reconciler's passes log under one name, as the single module they were split from did.
log = logging.getLogger("optimizer.jobs.reconcile")

Asked = Literal["asked", "failed", "unavailable"]


class Acting:
    """The tools every pass acts through (one per reconciler: what it remembers lasts)."""

    def __init__(
        self,
        daemon_url: Callable[[], str],
        *,
        agent: AgentSettings | None = None,
        probe_window: ProbeWindow = DEFAULT_WINDOW,
    ) -> None:
        self.launcher = Launcher(daemon_url, self.emit, agent=agent, probe_window=probe_window)
        # Events raised while acting on a job, recorded with its transition (one transaction).
        self.buffer: list[NewEvent] = []
        # What raised in a pass, already logged with its traceback (logged once each).
        self._complaints: set[str] = set()

    # -- events --------------------------------------------------------------------------------

    def draft(
        self,
        ctx: ReconcileContext,
        job: JobRecord,
        alert: Alert,
        dedupe: str | None = None,
        attempt: AttemptRecord | None = None,
    ) -> NewEvent:
        data: dict[str, Any] = {"job": job.given_name, **attempt_fields(attempt)}
        data.update(alert.data)
        if alert.kind is EventKind.JOB_CANCELLED:
            data["state_before"] = job.state
        return ctx.emitter.draft(
            alert.kind,
            alert.message,
            severity=alert.severity,
            policy=job.policy,
            data=data,
            dedupe_key=dedupe,
        )

    def emit(
        self,
        ctx: ReconcileContext,
        job: JobRecord,
        alert: Alert,
        dedupe: str | None = None,
        attempt: AttemptRecord | None = None,
    ) -> None:
        """Queue an event for the job's transition (or the next flush)."""
        drafted = self.draft(ctx, job, alert, dedupe, attempt)
        self.buffer.append(replace(drafted, job_id=job.id))

    def take(self) -> list[NewEvent]:
        """The queued events, for a transition to record; the queue is left empty."""
        events, self.buffer = self.buffer, []
        return events

    def flush(self, ctx: ReconcileContext) -> None:
        if self.buffer:
            ctx.store.events.record_events(self.take(), ctx.now)

    # -- complaints ----------------------------------------------------------------------------

    def complain(self, what: str, exc: Exception) -> None:
        """Log a step that raised: with its traceback the first time, then once per change."""
        said = f"{what}: {describe_error(exc)}"
        if said not in self._complaints:
            if len(self._complaints) >= 1000:  # a bound on what is remembered, not on logging
                self._complaints.clear()
            self._complaints.add(said)
            log.error("reconcile: %s", said, exc_info=exc)

    # -- acting on a cloud ---------------------------------------------------------------------

    def terminate(self, ctx: ReconcileContext, key: str) -> Asked:
        """Ask the cloud to end the attempt's instance: `asked` (or nothing left to ask),
        `failed` (the call failed; a later pass asks again) or `unavailable` (no provider
        here to ask)."""
        attempt = ctx.store.jobs.attempt(key)
        if attempt is None or attempt.instance_id is None or attempt.instance_gone:
            return "asked"
        source = self.launcher.provider(ctx, attempt.provider)
        if source is None:
            return "unavailable"
        ref = InstanceRef(attempt.provider, attempt.region, attempt.zone, attempt.instance_id)
        try:
            source.terminate(ref)
        except ProviderError as exc:
            log.warning("terminate %s failed: %s", attempt.instance_id, exc)
            return "failed"
        # Who ends an instance decides what it costs (a spot instance the cloud interrupts in
        # its first hour is free on AWS; one terminated by its owner is not): recorded now,
        # unless the cloud was already known to have ended it.
        ctx.store.jobs.record_billing(key, terminated_by="gpuopt")
        return "asked"


def attempt_fields(attempt: AttemptRecord | None) -> dict[str, Any]:
    """An event's `attempt` (its number) and `instance` (once known), for its data."""
    if attempt is None:
        return {}
    fields: dict[str, Any] = {"attempt": head_number(attempt.number, attempt.gang)}
    if attempt.nodes > 1:
        fields["nodes"] = attempt.nodes  # one attempt of N instances (rank 0's is `instance`)
    if attempt.instance_id:
        fields["instance"] = attempt.instance_id
    return fields


__all__ = ["Acting", "Asked", "attempt_fields"]
