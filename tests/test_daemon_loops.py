"""The scheduler and the reconcile loop: failures are counted and retried, wake-ups run a
pass at once, a wake during a pass is not lost, and reconcilers are isolated."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from optimizer.daemon.metrics import Metrics
from optimizer.daemon.scheduler import LoopScheduler
from optimizer.jobs.context import ReconcileContext
from tests.helpers import (
    FakeSource,
    make_config,
    policy_text,
    running,
    wait_until,
    write_policy,
)

pytestmark = pytest.mark.usefixtures("daemon_env")


def test_a_loop_that_raises_is_counted_and_runs_again_next_tick() -> None:
    metrics = Metrics()
    calls: list[int] = []

    def flaky() -> None:
        calls.append(1)
        if len(calls) <= 2:
            raise RuntimeError("transient")

    scheduler = LoopScheduler(metrics=metrics)
    scheduler.add("flaky", flaky, 0.02)
    scheduler.start()
    try:
        wait_until(lambda: len(calls) >= 4, what="the loop to keep running after errors")
    finally:
        scheduler.shutdown()
    assert metrics.sample("gpuopt_loop_runs_total", {"loop": "flaky", "outcome": "error"}) == 2
    assert metrics.sample("gpuopt_loop_runs_total", {"loop": "flaky", "outcome": "ok"}) >= 2
    assert metrics.sample("gpuopt_loop_duration_seconds_count", {"loop": "flaky"}) >= 4


def test_shutdown_lets_the_current_iteration_finish() -> None:
    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    def slow() -> None:
        started.set()
        release.wait(5)
        finished.set()

    scheduler = LoopScheduler()
    scheduler.add("slow", slow, 3600)
    scheduler.start()
    wait_until(started.is_set, what="the first iteration")
    stopper = threading.Thread(target=scheduler.shutdown)
    stopper.start()
    assert not finished.is_set()
    release.set()
    stopper.join(5)
    assert finished.is_set() and not stopper.is_alive()


def test_a_loop_that_wakes_another_while_the_scheduler_stops_does_not_hang_it() -> None:
    # APScheduler's shutdown(wait=True) waits for the running loops while it holds the lock
    # that waking a loop (run_now) takes: a loop that woke another as the daemon stopped
    # hung the stop for ever.
    started, release, woke = threading.Event(), threading.Event(), threading.Event()
    scheduler = LoopScheduler()

    def waker() -> None:
        started.set()
        release.wait(5)
        scheduler.run_now("other")
        woke.set()

    scheduler.add("waker", waker, 3600)
    scheduler.add("other", lambda: None, 3600, run_now=False)
    scheduler.start()
    wait_until(started.is_set, what="the first iteration")
    stopper = threading.Thread(target=scheduler.shutdown, daemon=True)
    stopper.start()
    wait_until(lambda: not scheduler.running, what="the scheduler to begin stopping")
    assert stopper.is_alive()  # waiting for the loop in progress
    release.set()
    stopper.join(10)
    assert woke.is_set() and not stopper.is_alive()


def test_a_wakeup_runs_a_reconcile_pass_now(tmp_path: Path) -> None:
    seen: list[ReconcileContext] = []
    with running(make_config(tmp_path)) as daemon:  # the tick is an hour away
        daemon.reconcile.add(seen.append)
        wait_until(lambda: daemon.reconcile.passes >= 1, what="the pass at start")
        before = daemon.reconcile.passes
        daemon.reconcile.wakeup.set()
        wait_until(lambda: daemon.reconcile.passes > before, what="the woken pass")
    assert seen and seen[-1].jobs == ()


def test_a_wake_as_a_pass_finishes_is_not_dropped_by_the_scheduler(tmp_path: Path) -> None:
    """A wake-up that comes after a pass's last check, while the scheduler still counts that
    run as in progress, must start a pass now (it was skipped as a second instance, so the
    job waited a whole interval)."""
    first_done, hold = threading.Event(), threading.Event()
    with running(make_config(tmp_path)) as daemon:  # its own tick is an hour away
        loop = daemon.reconcile
        wait_until(lambda: loop.passes >= 1, what="the pass at start")

        def tick_then_linger() -> None:
            loop.tick()
            if not first_done.is_set():
                first_done.set()
                hold.wait(10)  # the run has passed its last check but has not ended

        scheduler = LoopScheduler()
        scheduler.add("held", tick_then_linger, 3600, run_now=False, guards_overlap=True)
        loop.attach(lambda: scheduler.run_now("held"))
        scheduler.start()
        try:
            scheduler.run_now("held")
            wait_until(first_done.is_set, what="the first held pass")
            before = loop.passes
            loop.wakeup.set()
            wait_until(lambda: loop.passes > before, what="the pass the wake-up asked for")
        finally:
            hold.set()
            scheduler.shutdown()


def test_a_wake_during_a_pass_runs_one_more_pass(tmp_path: Path) -> None:
    entered, release = threading.Event(), threading.Event()
    calls: list[int] = []

    def blocking(ctx: ReconcileContext) -> None:
        calls.append(len(ctx.jobs))
        if len(calls) == 1:
            entered.set()
            release.wait(5)

    with running(make_config(tmp_path)) as daemon:
        wait_until(lambda: daemon.reconcile.passes >= 1, what="the pass at start")
        daemon.reconcile.add(blocking)
        daemon.reconcile.wakeup.set()
        wait_until(entered.is_set, what="the blocking pass")
        daemon.store.jobs.add_job("train", "small", {"run": "x"})
        daemon.reconcile.wakeup.set()  # arrives while the pass runs
        release.set()
        wait_until(lambda: len(calls) >= 2, what="the pass the wake asked for")
    assert calls[:2] == [0, 1]


def test_one_failing_reconciler_does_not_stop_the_others(tmp_path: Path) -> None:
    ran: list[str] = []

    def broken(ctx: ReconcileContext) -> None:
        raise ValueError("bug")

    def fine(ctx: ReconcileContext) -> None:
        ran.append("fine")

    with running(make_config(tmp_path)) as daemon:
        wait_until(lambda: daemon.reconcile.passes >= 1, what="the pass at start")
        daemon.reconcile.reconcilers.extend([broken, fine])
        report = daemon.reconcile.run_once()
    assert ran == ["fine"]
    assert report.errors == ["broken: ValueError: bug"]
    labels = {"loop": "reconcile:broken", "outcome": "error"}
    assert daemon.metrics.sample("gpuopt_loop_runs_total", labels) == 1


def test_a_policy_change_wakes_reconcile(tmp_path: Path) -> None:
    with running(make_config(tmp_path)) as daemon:
        wait_until(lambda: daemon.reconcile.passes >= 1, what="the pass at start")
        before = daemon.reconcile.passes
        write_policy(tmp_path / "policies", "small.yaml", policy_text("small"))
        wait_until(lambda: daemon.registry.get("small"), what="the new policy")
        wait_until(lambda: daemon.reconcile.passes > before, what="the pass it woke")


class QueueingSource(FakeSource):
    """A fake AWS source with an interruption queue: each long poll is counted, one event."""

    queue_url = "https://sqs.us-east-1.amazonaws.com/123456789012/gpuopt-events"

    def __init__(self) -> None:
        super().__init__(name="aws")
        self.polls: list[int] = []

    def poll_interruptions(self, *, wait_seconds: int, record: Any) -> list[Any]:
        self.polls.append(wait_seconds)
        record([])
        return []


def test_the_leader_long_polls_a_configured_interruption_queue_on_its_own_loop(
    tmp_path: Path,
) -> None:
    from optimizer.daemon.loops.queue import WAIT_S

    source = QueueingSource()
    config = make_config(
        tmp_path,
        providers={
            "aws": {
                "interruption_queue_url": source.queue_url,
                "spot_interval_s": 3600,
                "on_demand_interval_s": 3600,
            }
        },
    )
    with running(config, sources={"aws": source}) as daemon:
        assert "queue:aws" in daemon.scheduler.names
        wait_until(lambda: len(source.polls) >= 2, what="two long polls")
        assert set(source.polls) == {WAIT_S}


def test_no_queue_loop_without_a_configured_queue(tmp_path: Path) -> None:
    with running(make_config(tmp_path)) as daemon:
        assert not [n for n in daemon.scheduler.names if n.startswith("queue:")]


def test_a_start_wakes_no_loop_that_is_not_scheduled_yet(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The election is won before the loops are added; waking them then logged a DEBUG
    # traceback (JobLookupError for `watch`) at every start.
    with (
        caplog.at_level(logging.DEBUG, logger="optimizer.daemon"),
        running(make_config(tmp_path)) as daemon,
    ):
        wait_until(lambda: daemon.reconcile.passes >= 1, what="the pass at start")
    noisy = [r for r in caplog.records if r.exc_info or "could not wake" in r.getMessage()]
    assert noisy == [], [r.getMessage() for r in noisy]
