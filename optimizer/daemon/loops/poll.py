"""The poll loop: one provider and market per job (spot every 10 minutes, on-demand daily by
default), each configured region fetched concurrently; new observations land in price
history, each region's status in the store, and then every policy is re-evaluated.

A provider that fails is not a loop failure: the poll records the error, counts it, raises
`poll.failed` (or `provider.disabled`) once when a region starts failing and
`poll.recovered` when it works again, and tries again next tick.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime

from optimizer.alerts.channel import redact
from optimizer.alerts.outbox import Emitter
from optimizer.clock import Clock
from optimizer.daemon.metrics import Metrics
from optimizer.daemon.providers import ProviderHandle
from optimizer.model import EventKind, Market, Offer
from optimizer.store import NewEvent, PollStatusRecord, Store
from providers.base import ProviderDisabled

log = logging.getLogger(__name__)

ALL_REGIONS = "*"
MAX_REGION_WORKERS = 8


@dataclass(frozen=True, slots=True)
class RegionResult:
    region: str
    offers: list[Offer]
    duration_s: float
    error: BaseException | None = None


@dataclass(frozen=True, slots=True)
class PollReport:
    recorded: int  # history rows written (observations newer than the stored ones)
    fetched: int
    failed_regions: tuple[str, ...]


class PollLoop:
    """Polls one provider for one market; `run_once()` is one iteration."""

    def __init__(
        self,
        handle: ProviderHandle,
        market: Market,
        store: Store,
        emitter: Emitter,
        clock: Clock,
        *,
        metrics: Metrics | None = None,
        after: Callable[[datetime], object] | None = None,
        secrets: Sequence[str] = (),
    ) -> None:
        self.handle = handle
        self.market = market
        self.store = store
        self.emitter = emitter
        self.clock = clock
        self.metrics = metrics
        self.after = after
        self.secrets = tuple(secrets)
        self.name = f"poll:{handle.name}:{market.value}"

    @property
    def regions(self) -> list[str]:
        return list(self.handle.config.regions) or [ALL_REGIONS]

    def run_once(self) -> PollReport:
        now = self.clock()
        units = self.regions
        if len(units) == 1:
            results = [self._fetch(units[0])]
        else:
            workers = min(MAX_REGION_WORKERS, len(units))
            with ThreadPoolExecutor(workers, thread_name_prefix="gpuopt-poll") as pool:
                results = list(pool.map(self._fetch, units))
        fetched = [o for r in results for o in r.offers]
        recorded = self.store.prices.record_offers(self._new(fetched)) if fetched else 0
        self._statuses(results, now)
        failed = tuple(r.region for r in results if r.error is not None)
        if len(failed) < len(results) and self.after is not None:
            self.after(self.clock())
        return PollReport(recorded, len(fetched), failed)

    def _fetch(self, region: str) -> RegionResult:
        started = time.perf_counter()
        try:
            source = self.handle.source()
            offers = source.fetch_offers(None if region == ALL_REGIONS else [region])
        except Exception as exc:  # a provider's failure is data here, never the loop's
            return RegionResult(region, [], time.perf_counter() - started, exc)
        for problem in source.problems:
            log.warning("%s %s: %s", self.handle.name, region, problem)
        wanted = [o for o in offers if o.market is self.market]
        return RegionResult(region, wanted, time.perf_counter() - started)

    def _new(self, offers: Sequence[Offer]) -> list[Offer]:
        """Observations newer than what the store holds for their pool (a snapshot polled
        again adds no history; a price seen at a new time does)."""
        latest: dict[tuple[object, ...], datetime] = {}
        for provider in sorted({o.provider for o in offers}):
            for held in self.store.prices.latest_offers(provider=provider, market=self.market):
                latest[held.pool] = held.observed_at
        return [o for o in offers if o.pool not in latest or o.observed_at > latest[o.pool]]

    def _statuses(self, results: Sequence[RegionResult], now: datetime) -> None:
        provider, market = self.handle.name, self.market.value
        before = {
            s.region: s
            for s in self.store.policies.poll_statuses()
            if s.provider == provider and s.market == market
        }
        for result in results:
            prev = before.get(result.region)
            error = result.error
            events: list[NewEvent] = []
            where = provider if result.region == ALL_REGIONS else f"{provider} {result.region}"
            base = PollStatusRecord(
                provider=provider,
                region=result.region,
                market=market,
                last_run_at=now,
                last_ok_at=prev.last_ok_at if prev else None,
                duration_s=result.duration_s,
                offers=0,
                failures=0,
                last_error=None,
            )
            if error is None:
                status = replace(base, last_ok_at=now, offers=len(result.offers))
                if prev is not None and prev.failures:
                    events.append(
                        self.emitter.draft(
                            EventKind.POLL_RECOVERED,
                            f"{where} {market} prices are polled again "
                            f"after {prev.failures} failed poll(s)",
                            data={"provider": provider, "region": result.region},
                        )
                    )
            else:
                text = redact(_error_text(error), self.secrets)
                failures = (prev.failures if prev else 0) + 1
                status = replace(base, failures=failures, last_error=text)
                if failures == 1:
                    disabled = isinstance(error, ProviderDisabled)
                    events.append(
                        self.emitter.draft(
                            EventKind.PROVIDER_DISABLED if disabled else EventKind.POLL_FAILED,
                            f"{where} {market} poll failed: {text}",
                            severity="warning",
                            data={"provider": provider, "region": result.region, "error": text},
                            dedupe_key=f"poll:{provider}:{result.region}:{market}:{now.isoformat()}",
                        )
                    )
                    log.warning("%s %s poll failed: %s", where, market, text)
                else:
                    log.info("%s %s poll failed again (%d): %s", where, market, failures, text)
            self.store.policies.save_poll_status(status, events)
            self._measure(result, now)

    def _measure(self, result: RegionResult, now: datetime) -> None:
        if self.metrics is None:
            return
        labels = (self.handle.name, result.region, self.market.value)
        m = self.metrics
        m.poll_last_run.labels(*labels).set(now.timestamp())
        m.poll_duration.labels(*labels).set(result.duration_s)
        if result.error is None:
            m.poll_last_success.labels(*labels).set(now.timestamp())
            m.poll_offers.labels(*labels).set(len(result.offers))
        else:
            m.poll_errors.labels(*labels, type(result.error).__name__).inc()


def _error_text(error: BaseException) -> str:
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {message}" if message else type(error).__name__
