"""What the probes measured, for the ranking: the store's per-type figures and failure streaks
as `policies.measured.Measured`, and the alert when a type's probes keep failing.

Every place the daemon ranks (a launch, `GET /offers?policy=`, the price signals after a poll)
takes `measured(store, window)`: per (provider, instance type), the medians of the last
`window.last` usable, non-simulated probe results, and the types demoted because at least
`window.demote_failed` of their last `window.last` results failed. `ProbeFailureWatch`, a
reconciler, records one `instance_type.demoted` event (with its alert) per type per streak.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC

from optimizer import hardware
from optimizer.clock import utc_text
from optimizer.jobs.context import ReconcileContext
from optimizer.model import EventKind
from optimizer.store import EventRecord, FailureStreak, Store
from optimizer.store.probes import DEFAULT_LAST
from policies.measured import Measured, TypeMeasurement

DEFAULT_DEMOTE_FAILED = 3


@dataclass(frozen=True, slots=True)
class ProbeWindow:
    """How many recent probe results per type the figures are medians of (`last`), and how
    many failures among them demote the type (`demote_failed`); the daemon config's
    `probes:` section."""

    last: int = DEFAULT_LAST
    demote_failed: int = DEFAULT_DEMOTE_FAILED


DEFAULT_WINDOW = ProbeWindow()


def streak_reason(streak: FailureStreak) -> str:
    since = utc_text(streak.since, timespec="seconds")
    return (
        f"probe_failures: {streak.failed} of the last {streak.of} probes of "
        f"{streak.instance_type} on {streak.provider} failed (since {since})"
    )


def demoted(store: Store, window: ProbeWindow = DEFAULT_WINDOW) -> list[FailureStreak]:
    """The failure streaks long enough to demote their type, by provider and type."""
    streaks = store.probes.streaks(last=window.last)
    return [s for _, s in sorted(streaks.items()) if s.failed >= window.demote_failed]


def measured(store: Store, window: ProbeWindow = DEFAULT_WINDOW) -> Measured:
    """The engine's `measured` input from the stored probe results (module docstring)."""
    types = {
        key: TypeMeasurement(
            {d: v for d, v in found.tflops.items() if d in hardware.DTYPES},
            found.copy_gbps,
            found.n,
            found.newest_at,
        )
        for key, found in store.probes.figures(last=window.last).items()
    }
    bad = {(s.provider, s.instance_type): streak_reason(s) for s in demoted(store, window)}
    return Measured(types=types, demoted=bad)


class ProbeFailureWatch:
    """A reconciler: one `instance_type.demoted` event and alert per type per failure streak
    (a streak is named by its oldest failure in the window; once it has fallen out of the
    window, a new streak alerts again)."""

    name = "probe_failures"

    def __init__(self, window: ProbeWindow = DEFAULT_WINDOW) -> None:
        self.window = window
        # Streaks this replica has seen recorded: later passes skip them without a query.
        self._known: set[tuple[str, str, str]] = set()

    def __call__(self, ctx: ReconcileContext) -> None:
        for streak in demoted(ctx.store, self.window):
            since = streak.since.astimezone(UTC).isoformat()
            known = (streak.provider, streak.instance_type, since)
            if known in self._known:
                continue
            data = {
                "provider": streak.provider,
                "instance_type": streak.instance_type,
                "failed": streak.failed,
                "of": streak.of,
                "since": since,
            }
            event = ctx.emitter.draft(
                EventKind.INSTANCE_TYPE_DEMOTED,
                f"{streak.instance_type} on {streak.provider}: {streak.failed} of the last "
                f"{streak.of} GPU probes failed; ranked after healthy types until it passes",
                severity="warning",
                data=data,
                dedupe_key=f"probe-failures:{streak.provider}:{streak.instance_type}:{since}",
            )

            def same(record: EventRecord, data: dict[str, object] = data) -> bool:
                found = record.data or {}
                return all(found.get(k) == data[k] for k in ("provider", "instance_type", "since"))

            ctx.store.events.record_once(event, since=streak.since, same=same, at=ctx.now)
            self._known.add(known)
