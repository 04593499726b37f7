"""The deliver loop: send due alerts from the outbox, oldest first per channel, and book each
attempt.

A success marks the row delivered; a failure schedules the next attempt with exponential
back-off and jitter (or the receiver's Retry-After, when longer); a permanent failure (a 4xx
other than 408/425/429), the last allowed attempt, or an alert older than the age limit
marks it failed. Each channel gets its alerts in the order they were raised: an alert
waiting to be retried holds back the later ones to its channel (the store hands out a
channel's alerts only while its oldest is due, and a pass stops at a channel's first
failure), while the other channels carry on, so one dead receiver cannot stall the others.

Delivery is at least once: a daemon killed between a receiver's 2xx and the bookkeeping
sends that alert again after the restart, with the same `id` for the receiver to drop.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from optimizer.alerts.channel import Alert, Notifier
from optimizer.alerts.config import RetryConfig
from optimizer.alerts.outbox import backoff, give_up
from optimizer.clock import Clock
from optimizer.daemon.metrics import Metrics
from optimizer.store import Store

log = logging.getLogger(__name__)


@dataclass
class DeliveryReport:
    delivered: int = 0
    retried: int = 0
    failed: int = 0
    skipped: int = 0


class DeliverLoop:
    """Sends due alerts through the configured channels; `run_once()` is one pass."""

    name = "deliver"

    def __init__(
        self,
        store: Store,
        notifiers: Mapping[str, Notifier],
        clock: Clock,
        *,
        retry: RetryConfig | None = None,
        rng: random.Random | None = None,
        api_url: str | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.store = store
        self.notifiers = dict(notifiers)
        self.clock = clock
        self.retry = retry or RetryConfig()
        self.rng = rng or random.Random()
        self.api_url = api_url
        self.metrics = metrics

    def run_once(self) -> DeliveryReport:
        report = DeliveryReport()
        held: set[str] = set()  # channels whose next alert must wait for a retry
        for item in self.store.events.due_alerts(self.clock(), limit=self.retry.batch):
            now = self.clock()
            notifier = self.notifiers.get(item.channel)
            attempts = item.attempts + 1
            if notifier is None:
                error = f"channel {item.channel!r} is not configured any more"
                self.store.events.alert_failed(item.id, attempts=item.attempts, error=error, at=now)
                self._count(item.channel, "failed")
                report.failed += 1
                continue
            if item.channel in held:
                report.skipped += 1  # behind an alert to be retried: keep the channel's order
                continue
            result = notifier.send(Alert.from_outbox(item, self.api_url))
            if result.ok:
                self.store.events.alert_delivered(item.id, attempts=attempts, at=now)
                self._count(item.channel, "delivered")
                report.delivered += 1
                continue
            if result.unreachable:
                held.add(item.channel)
            if result.permanent or give_up(attempts, item.created_at, now, self.retry):
                why = "refused" if result.permanent else f"gave up after {attempts} attempt(s)"
                error = f"{result.error} ({why})"
                self.store.events.alert_failed(item.id, attempts=attempts, error=error, at=now)
                log.warning("alert %s to %s failed: %s", item.dedupe_key, item.channel, error)
                self._count(item.channel, "failed")
                report.failed += 1
                continue
            wait = backoff(attempts, self.retry, self.rng)
            if result.retry_after_s is not None:
                wait = max(wait, timedelta(seconds=min(result.retry_after_s, self.retry.max_s)))
            self.store.events.alert_retry(
                item.id, attempts=attempts, next_attempt_at=now + wait, error=result.error, at=now
            )
            log.info(
                "alert %s to %s: attempt %d failed (%s); next in %.0fs",
                item.dedupe_key,
                item.channel,
                attempts,
                result.error,
                wait.total_seconds(),
            )
            held.add(item.channel)
            self._count(item.channel, "retry")
            report.retried += 1
        return report

    def _count(self, channel: str, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.alert_deliveries.labels(channel, outcome).inc()
