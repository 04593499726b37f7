"""The reconciler carries out utilization rules and max_duration: a stop sends the job SIGTERM
(the stop command its agent reads), ends it `stopped` and terminates its instance once the job
has exited; an alert rule raises `job.underused` once per window, also across a restart of the
reconciler. A fake cloud, the real store, one pass at a time on a manual clock."""

from __future__ import annotations

from datetime import timedelta
from itertools import pairwise
from typing import Any

from sqlalchemy import insert

from optimizer.clock import ManualClock
from optimizer.daemon.config import ProviderConfig
from optimizer.daemon.providers import ProviderHandle
from optimizer.jobs.context import ReconcileContext
from optimizer.jobs.reconcile import STOP_GRACE, JobReconciler
from optimizer.jobs.watch import gpu_samples
from optimizer.model import EventKind
from optimizer.store import JobRecord, Store
from optimizer.store.tables import GpuSample
from policies.loader import parse_policy
from policies.schema import Policy
from tests.helpers import make_offer
from tests.helpers.cancel import NOW, FakeCloud, InForce
from tests.helpers.jobs import Drafter

RULES = """apiVersion: gpuopt/v1
kind: Policy
name: p
workload: {gpus: 1, gpu_memory_gib: 16}
utilization:
  low: {below: 0.60, for: 20s, action: alert}
  idle: {below: 0.05, for: 10s, action: stop}
"""
SECOND = timedelta(seconds=1)


class World:
    def __init__(self, store: Store, policy: Policy, spec: dict[str, Any] | None = None) -> None:
        self.store = store
        self.policy = policy
        self.clock = ManualClock(NOW)
        self.cloud = FakeCloud()
        store.prices.record_offers([make_offer(observed_at=NOW)])
        self.job_id = store.jobs.add_job(
            "train", "p", {"run": "x", "checkpoint_dir": "/c", **(spec or {})}
        )
        self.reconciler = JobReconciler(lambda: "http://127.0.0.1:1")
        self.handle = ProviderHandle.given("aws", ProviderConfig(), self.cloud)

    def run(self) -> JobRecord:
        self.reconciler(
            ReconcileContext(
                now=self.clock(),
                jobs=tuple(self.store.jobs.live_jobs()),
                policies={"p": InForce(self.policy)},
                store=self.store,
                providers={"aws": self.handle},
                emitter=Drafter(),
                clock=self.clock,
            )
        )
        job = self.store.jobs.get_job_by_id(self.job_id)
        assert job is not None
        return job

    def attempt(self) -> Any:
        return self.store.jobs.attempts(self.job_id)[-1]

    def start(self) -> None:
        assert self.run().state == "provisioning"
        self.store.jobs.update_attempt(
            self.attempt().key,
            registered_at=self.clock(),
            probe_status="pass",
            job_started_at=self.clock(),
        )
        assert self.run().state == "running"

    def reading(self, util: float, span_s: int = 5) -> None:
        """The agent's reading over the last `span_s` seconds, then the clock moves past it."""
        start = self.clock()
        self.clock.advance(span_s)
        with self.store.engine.begin() as conn:
            conn.execute(
                insert(GpuSample.__table__),  # type: ignore[attr-defined]
                [
                    {
                        "attempt_id": self.attempt().id,
                        "start": start,
                        "span_s": span_s,
                        "samples": 1,
                        "gpus": 1,
                        "util_mean": util,
                        "util_max": util,
                        "simulated": True,
                    }
                ],
            )

    def events(self, kind: EventKind) -> list[Any]:
        return [
            e for e in self.store.events.recent(job_id=self.job_id, limit=1000) if e.kind == kind
        ]


def test_an_idle_job_is_stopped_sigterm_first_then_its_instance_terminated(store: Store) -> None:
    w = World(store, parse_policy(RULES))
    w.start()
    w.reading(0.03)
    assert w.run().state == "running"  # 5 s of coverage, the window is 10 s
    w.reading(0.03)
    job = w.run()
    assert job.state == "stopped"
    assert job.reason is not None and job.reason.startswith("stopped by idle: GPU utilization")
    attempt = w.attempt()
    assert attempt.ended and attempt.end_reason == "stopped"
    assert attempt.stop_sent_at == w.clock()  # the agent's next heartbeat carries the stop
    assert w.cloud.terminated == []  # the job checkpoints first
    [stopped] = w.events(EventKind.JOB_STOPPED)
    assert stopped.severity == "warning" and stopped.data["rule"] == "idle"
    assert stopped.data["attempt"] == 1
    # The job exits after its checkpoint: the instance is terminated.
    w.store.jobs.update_attempt(attempt.key, exit_code=0)
    w.run()
    assert w.cloud.terminated == [attempt.instance_id]
    assert w.run().state == "stopped"


def test_a_stopped_job_that_never_exits_loses_its_instance_after_the_grace(store: Store) -> None:
    w = World(store, parse_policy(RULES))
    w.start()
    w.reading(0.0, span_s=10)
    assert w.run().state == "stopped"
    w.clock.advance((STOP_GRACE - SECOND).total_seconds())
    w.run()
    assert w.cloud.terminated == []
    w.clock.advance(1)
    w.run()
    assert w.cloud.terminated == [w.attempt().instance_id]


def test_a_busy_minute_keeps_the_job_running(store: Store) -> None:
    w = World(store, parse_policy(RULES))
    w.start()
    for util in (0.03, 0.9, 0.03):
        w.reading(util)
        assert w.run().state == "running"
    w.reading(0.03)
    assert w.run().state == "stopped"


def test_a_low_job_alerts_once_per_window_across_a_restart(store: Store) -> None:
    policy = parse_policy(
        RULES.replace("0.05, for: 10s, action: stop", "0.05, for: 10s, action: alert")
    )
    w = World(store, policy)
    w.start()
    for _ in range(12):  # 60 s at 40%: three 20 s windows
        w.reading(0.4)
        assert w.run().state == "running"
        if len(w.events(EventKind.JOB_UNDERUSED)) == 1:
            w.reconciler = JobReconciler(lambda: "http://127.0.0.1:1")  # a new leader
    alerts = w.events(EventKind.JOB_UNDERUSED)
    windows = [(e.data["window_start"], e.data["window_end"]) for e in alerts]
    assert len(windows) == 3, windows
    assert len(set(windows)) == 3
    for (_, end), (start, _) in pairwise(windows):
        assert start >= end  # back to back, never overlapping
    assert {e.data["rule"] for e in alerts} == {"low"}
    assert alerts[0].data["peak"] == 0.4 and alerts[0].data["window_s"] == 20.0


def test_max_duration_from_the_spec_stops_the_job(store: Store) -> None:
    bare = parse_policy("apiVersion: gpuopt/v1\nkind: Policy\nname: p\n")
    w = World(store, bare, spec={"max_duration": 30.0})
    w.start()
    w.clock.advance(29)
    assert w.run().state == "running"
    w.clock.advance(1)
    job = w.run()
    assert job.state == "stopped" and "max_duration of 30s" in (job.reason or "")
    [stopped] = w.events(EventKind.JOB_STOPPED)
    assert stopped.data["rule"] == "max_duration"


def test_gpu_samples_reads_the_attempts_spans_that_end_after_since(store: Store) -> None:
    w = World(store, parse_policy(RULES))
    w.start()
    w.reading(0.1)
    w.reading(0.2)
    got = gpu_samples(store, w.attempt().id, since=NOW + 6 * SECOND)
    assert [(s.start, s.util) for s in got] == [(NOW + 5 * SECOND, 0.2)]
