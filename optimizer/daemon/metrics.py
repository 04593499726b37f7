"""Prometheus metrics for one daemon, on a private registry (never the process-global one,
so two daemons in one process, as in tests, do not collide).

Counters and loop timings are updated as things happen; figures the store holds (offers,
jobs by state, alerts by state) are read from it when /metrics is scraped.
"""

from __future__ import annotations

import logging
import platform
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from optimizer import __version__

if TYPE_CHECKING:
    from optimizer.store import Store

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LOOP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_POLL = ("provider", "region", "market")
# Interruption notice -> job running again: seconds to tens of minutes.
RECOVERY_BUCKETS = (5, 10, 15, 30, 45, 60, 90, 120, 180, 300, 600, 900, 1800, 3600)


def torch_loaded() -> bool:
    """Whether this process imported torch (the daemon never should)."""
    return "torch" in sys.modules


class _Scraped(Collector):
    """Figures read at scrape time: from the store, the policy registry, the process."""

    def __init__(
        self,
        store: Store | None,
        policies: Callable[[], Mapping[str, int]] | None,
        start_time: float,
    ) -> None:
        self.store = store
        self.policies = policies
        self.start_time = start_time

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "gpuopt_info",
            "gpuopt build and process facts; torch_loaded must stay false in the daemon.",
            labels=["version", "python", "torch_loaded"],
        )
        info.add_metric([__version__, platform.python_version(), str(torch_loaded()).lower()], 1.0)
        yield info
        yield GaugeMetricFamily(
            "gpuopt_start_time_seconds", "When the daemon started (unix time).", self.start_time
        )
        if self.policies is not None:
            family = GaugeMetricFamily(
                "gpuopt_policies", "Policies in force, by status.", labels=["status"]
            )
            for status, count in sorted(self.policies().items()):
                family.add_metric([status], count)
            yield family
        if self.store is None:
            return
        up = GaugeMetricFamily("gpuopt_store_up", "1 when the store answered this scrape.")
        try:
            offers = self.store.prices.offer_counts()
            jobs = self.store.jobs.job_counts()
            alerts = self.store.events.alert_counts()
            backlog = self.store.events.alert_backlog()
        except Exception as exc:  # a scrape must answer even when the database does not
            log.warning("metrics: store unavailable: %s", type(exc).__name__)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        family = GaugeMetricFamily(
            "gpuopt_offers", "Latest offers held, by provider and market.", labels=_POLL[::2]
        )
        for (provider, market), count in sorted(offers.items()):
            family.add_metric([provider, market], count)
        yield family
        family = GaugeMetricFamily("gpuopt_jobs", "Jobs by state.", labels=["state"])
        for state, count in sorted(jobs.items()):
            family.add_metric([state], count)
        yield family
        family = GaugeMetricFamily(
            "gpuopt_alerts",
            "Outbox alerts by state (pending, delivered, failed).",
            labels=["state"],
        )
        for state, count in sorted(alerts.items()):
            family.add_metric([state], count)
        yield family
        family = GaugeMetricFamily(
            "gpuopt_alert_backlog",
            "Pending alerts per channel (a failing one holds back the later ones).",
            labels=["channel"],
        )
        oldest = GaugeMetricFamily(
            "gpuopt_alert_backlog_oldest_timestamp_seconds",
            "When the oldest pending alert of each channel was raised (Unix time).",
            labels=["channel"],
        )
        for channel, (count, since) in sorted(backlog.items()):
            family.add_metric([channel], count)
            oldest.add_metric([channel], since.timestamp())
        yield family
        yield oldest
        yield from self._measured()

    def _measured(self) -> Iterator[Metric]:
        """Jobs' GPU telemetry and interruptions, from the store (so they survive restarts)."""
        assert self.store is not None
        try:
            latest = self.store.telemetry.live_jobs_latest()
            interrupted = self.store.telemetry.interruptions()
        except Exception as exc:
            log.warning("metrics: telemetry unavailable: %s", type(exc).__name__)
            return
        util = GaugeMetricFamily(
            "gpuopt_job_gpu_utilization",
            "GPU utilization (0..1, mean over the GPUs) of the latest minute its agent reported, "
            "per live job; simulated=true where the local cloud injected the readings.",
            labels=["job", "simulated"],
        )
        memory = GaugeMetricFamily(
            "gpuopt_job_gpu_memory_used_ratio",
            "GPU memory used over total (summed over the GPUs) in the latest minute its agent "
            "reported, per live job; simulated=true where the local cloud injected the readings.",
            labels=["job", "simulated"],
        )
        for job, rec in sorted(latest.items()):
            sim = str(rec.simulated).lower()
            if rec.util_mean is not None:
                util.add_metric([job, sim], rec.util_mean)
            if rec.memory_used_ratio is not None:
                memory.add_metric([job, sim], rec.memory_used_ratio)
        yield util
        yield memory
        counts: dict[tuple[str, str, str], int] = {}
        for i in interrupted:
            key = (i.provider, i.region, i.instance_type)
            counts[key] = counts.get(key, 0) + 1
        total = CounterMetricFamily(
            "gpuopt_job_interruptions",
            "Attempts the cloud interrupted (a notice reached the agent, or the provider "
            "reported the instance preempted), by pool; counted from the store.",
            labels=["provider", "region", "instance_type"],
        )
        for key, n in sorted(counts.items()):
            total.add_metric(list(key), n)
        yield total
        recovered = [i.recovery_s for i in interrupted if i.recovery_s is not None]
        buckets: list[tuple[str, float]] = []
        for bound in RECOVERY_BUCKETS:
            buckets.append((floatToGoString(bound), sum(1 for s in recovered if s <= bound)))
        buckets.append(("+Inf", len(recovered)))
        hist = HistogramMetricFamily(
            "gpuopt_job_recovery_seconds",
            "From an interruption (its notice, else the attempt's end) to the job running "
            "again on the replacement attempt (its agent's job_started); jobs not running "
            "again yet are not counted. From the store.",
            buckets=buckets,
            sum_value=sum(recovered),
        )
        yield hist


class Metrics:
    """The daemon's metrics; `render()` is the /metrics body."""

    def __init__(self, *, start_time: float = 0.0) -> None:
        self.registry = CollectorRegistry()
        self._start_time = start_time
        r = self.registry
        self.loop_duration = Histogram(
            "gpuopt_loop_duration_seconds",
            "Time one loop iteration took.",
            ["loop"],
            buckets=_LOOP_BUCKETS,
            registry=r,
        )
        self.loop_runs = Counter(
            "gpuopt_loop_runs",
            "Loop iterations, by outcome (ok, error).",
            ["loop", "outcome"],
            registry=r,
        )
        self.loop_last_success = Gauge(
            "gpuopt_loop_last_success_timestamp_seconds",
            "When the loop last finished without an error.",
            ["loop"],
            registry=r,
        )
        self.poll_last_run = Gauge(
            "gpuopt_poll_last_run_timestamp_seconds", "When a poll last ran.", _POLL, registry=r
        )
        self.poll_last_success = Gauge(
            "gpuopt_poll_last_success_timestamp_seconds",
            "When a poll last succeeded.",
            _POLL,
            registry=r,
        )
        self.poll_duration = Gauge(
            "gpuopt_poll_duration_seconds", "How long the last poll took.", _POLL, registry=r
        )
        self.poll_offers = Gauge(
            "gpuopt_poll_offers", "Offers the last poll returned.", _POLL, registry=r
        )
        self.poll_errors = Counter(
            "gpuopt_poll_errors",
            "Failed polls, by error class.",
            [*_POLL, "error"],
            registry=r,
        )
        self.alert_deliveries = Counter(
            "gpuopt_alert_deliveries",
            "Delivery attempts by channel and outcome (delivered, retry, failed).",
            ["channel", "outcome"],
            registry=r,
        )
        self.policy_changes = Counter(
            "gpuopt_policy_changes",
            "Policy file changes seen by the watcher (loaded, rejected, removed, kept).",
            ["outcome"],
            registry=r,
        )
        self.leader = Gauge(
            "gpuopt_leader",
            "1 while this replica leads (runs the poll, reconcile and deliver loops), else 0.",
            registry=r,
        )
        self.leader_changes = Counter(
            "gpuopt_leader_changes",
            "Times this replica became (to=leader) or stopped being (to=follower) the leader.",
            ["to"],
            registry=r,
        )
        self.reconcile_jobs = Gauge(
            "gpuopt_reconcile_live_jobs", "Live jobs the last reconcile pass saw.", registry=r
        )
        self.log_followers = Gauge(
            "gpuopt_log_followers",
            "Open GET /jobs/{name}/logs?follow=true answers streaming a job's output.",
            registry=r,
        )

    def watch(
        self,
        store: Store | None = None,
        policies: Callable[[], Mapping[str, int]] | None = None,
    ) -> None:
        """Add the scrape-time figures from the store and the policy registry."""
        self.registry.register(_Scraped(store, policies, self._start_time))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def sample(self, name: str, labels: Mapping[str, str] | None = None) -> Any:
        """One sample's value, or None: for tests and the bench."""
        return self.registry.get_sample_value(name, dict(labels or {}))
