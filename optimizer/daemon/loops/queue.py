"""The interruption-queue loop: long-polls a provider's event queue (AWS: EventBridge → SQS)
and records what it says about our instances at once, then wakes the reconcile loop.

The agent on the instance usually reports a spot notice first (it watches IMDS); the queue
is the second witness, and the only one when the agent cannot report. Reading it on its own
loop with a long poll (`WAIT_S`) instead of once per reconcile pass means a notice is
acted on within a second of SQS delivering it, not at the next reconcile tick. Only the
leader runs it, so two replicas never split one queue's messages.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from optimizer.clock import Clock
from optimizer.daemon.providers import ProviderHandle
from optimizer.store import Store
from providers.base import InterruptionEvent, InterruptionQueue, ProviderError

log = logging.getLogger(__name__)

WAIT_S = 10  # SQS long poll; also the most a clean stop waits for this loop
NOTICE_KINDS = ("spot_interruption", "rebalance")
GONE_STATES = ("shutting-down", "terminated", "stopped")


def queue_source(handle: ProviderHandle) -> InterruptionQueue | None:
    """The handle's interruption queue when its provider has one and the config names it;
    None otherwise, and while the provider cannot run here."""
    try:
        return handle.interruption_queue()
    except ProviderError:
        return None


def record_events(store: Store, events: Sequence[InterruptionEvent], clock: Clock) -> int:
    """Fold queue events into our open attempts (by instance id); how many matched. A notice
    is recorded like the agent's (`notice_at`, first one wins); a stop or termination marks
    the instance gone. Events about other instances are ignored."""
    by_instance = {
        a.instance_id: a for a in store.jobs.open_attempts() if a.instance_id and not a.ended
    }
    matched = 0
    for event in events:
        attempt = by_instance.get(event.instance_id)
        if attempt is None:
            continue
        if event.kind in NOTICE_KINDS:
            if attempt.notice_at is None:
                store.jobs.update_attempt(attempt.key, notice_at=clock())
                matched += 1
        elif event.detail in GONE_STATES:
            store.jobs.update_attempt(attempt.key, instance_gone=True)
            matched += 1
    return matched


class QueueLoop:
    """`run_once()` is one long poll of one provider's queue."""

    def __init__(
        self,
        handle: ProviderHandle,
        store: Store,
        clock: Clock,
        *,
        wake: Callable[[], None],
        wait_s: int = WAIT_S,
    ) -> None:
        self.handle = handle
        self.store = store
        self.clock = clock
        self.wake = wake
        self.wait_s = wait_s
        self.name = f"queue:{handle.name}"

    def run_once(self) -> int:
        """Wait up to `wait_s` for messages; record them; wake reconcile when one matched."""
        source = queue_source(self.handle)
        if source is None:
            return 0
        matched = 0

        def record(events: list[InterruptionEvent]) -> None:
            nonlocal matched
            matched += record_events(self.store, events, self.clock)

        try:
            source.poll_interruptions(wait_seconds=self.wait_s, record=record)
        except ProviderError as exc:
            log.warning("reading %s's interruption queue failed: %s", self.handle.name, exc)
            return 0
        if matched:
            log.info("%s: %d interruption event(s) for our instances", self.name, matched)
            self.wake()
        return matched


def queue_handles(handles: Mapping[str, ProviderHandle]) -> list[ProviderHandle]:
    """Handles whose provider reads an interruption queue (the registry says which: AWS
    today) and whose configuration names one."""
    return [h for h in handles.values() if h.has_interruption_queue]
