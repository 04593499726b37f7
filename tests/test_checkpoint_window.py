"""The checkpoint window on the daemon's side: the stop's instant, and the alarm that wakes the
pass at it (on an injected clock)."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import cast

from optimizer.alerts.outbox import Emitter
from optimizer.clock import utc_now
from optimizer.daemon.alarm import Alarm
from optimizer.daemon.loops.reconcile import ReconcileLoop
from optimizer.daemon.policies import PolicyRegistry
from optimizer.jobs.context import ReconcileContext
from optimizer.jobs.handover import handover, stop_due
from optimizer.jobs.machine import AttemptView, Stop
from optimizer.protocol import Job, RegisterAnswer, power_off_time
from optimizer.store import Store
from tests.helpers import wait_until
from tests.helpers.billing_world import POLICY, InForce, World
from tests.helpers.jobs import Drafter

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)
ALLOWANCE = timedelta(seconds=20)


class FakeClock:
    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def interrupted(off: datetime | None) -> AttemptView:
    return AttemptView(
        number=1,
        key="7-1",
        pool=("local", "r", "z", "t", "spot"),
        launched_at=NOW - timedelta(minutes=5),
        registered=True,
        probe_status="pass",
        job_started=True,
        interruption_notice_at=NOW,
        power_off_at=off,
    )


def test_the_stop_is_due_at_the_power_off_less_the_allowance_and_not_a_moment_before() -> None:
    old = interrupted(NOW + timedelta(seconds=30))
    due = stop_due(old, ALLOWANCE)
    assert due == NOW + timedelta(seconds=10)
    booting = replace(old, number=2, key="7-2", registered=False, probe_status=None)
    before = due - timedelta(microseconds=1)
    assert handover(old, booting, now=before, probes="quick", allowance=ALLOWANCE) is None
    stop = handover(old, booting, now=due, probes="quick", allowance=ALLOWANCE)
    assert stop == Stop("7-1", "interrupted; the power-off is near")


def test_a_move_has_no_window_and_a_ready_replacement_still_stops_the_job_earlier() -> None:
    moved = replace(interrupted(None), interruption_notice_at=None, migrated=True)
    assert stop_due(moved, ALLOWANCE) is None
    old = interrupted(NOW + timedelta(seconds=30))
    ready = replace(old, number=2, key="7-2")
    stop = handover(old, ready, now=NOW + timedelta(seconds=1), probes="quick")
    assert stop is not None and "ready to take over" in stop.reason


def test_the_notices_power_off_keeps_its_milliseconds() -> None:
    notice = {"action": "terminate", "time": "2026-11-30T12:00:30.250Z"}
    assert power_off_time(notice, NOW) == NOW + timedelta(seconds=30.25)
    seen = {"action": "preempted", "time": "2026-11-30T12:00:00.750Z"}
    assert power_off_time(seen, NOW) == NOW + timedelta(seconds=30.75)


def test_the_allowance_travels_to_the_agent_and_is_absent_when_unknown() -> None:
    assert "checkpoint_allowance_s" not in Job(run="x").wire()
    assert Job(run="x", checkpoint_allowance_s=20).wire()["checkpoint_allowance_s"] == 20
    answer = RegisterAnswer.model_validate({"job": {"run": "x", "checkpoint_allowance_s": 7.5}})
    assert answer.job.checkpoint_allowance_s == 7.5
    assert RegisterAnswer.model_validate({"job": {"run": "x"}}).job.checkpoint_allowance_s is None


def test_the_alarm_wakes_once_when_the_instant_comes_on_its_clock() -> None:
    clock = FakeClock(NOW)
    woken: list[datetime] = []
    alarm = Alarm(lambda: woken.append(clock()), clock)
    alarm.at(NOW + timedelta(seconds=10))
    alarm.at(NOW + timedelta(seconds=10))  # asked again by the next pass: kept once
    alarm.at(NOW + timedelta(seconds=25))
    assert alarm.pending() == [NOW + timedelta(seconds=10), NOW + timedelta(seconds=25)]
    assert alarm.fire_due() == 10.0 and woken == []
    clock.advance(9.999)
    assert alarm.fire_due() is not None and woken == []
    clock.advance(0.001)
    assert alarm.fire_due() == 15.0
    assert woken == [NOW + timedelta(seconds=10)]
    clock.advance(30)
    assert alarm.fire_due() is None
    assert woken == [NOW + timedelta(seconds=10), NOW + timedelta(seconds=40)]
    assert alarm.fire_due() is None and len(woken) == 2  # each instant wakes once


def test_an_instant_already_past_wakes_at_once_and_a_closed_alarm_takes_none() -> None:
    clock = FakeClock(NOW)
    woken: list[datetime] = []
    alarm = Alarm(lambda: woken.append(clock()), clock)
    alarm.at(NOW - timedelta(seconds=1))
    assert alarm.fire_due() is None and woken == [NOW]
    alarm.close()
    alarm.at(NOW + timedelta(seconds=1))
    assert alarm.pending() == []


def test_the_alarms_thread_wakes_at_the_instant_not_before() -> None:
    woken = threading.Event()
    seen: list[datetime] = []

    def wake() -> None:
        seen.append(utc_now())
        woken.set()

    alarm = Alarm(wake, utc_now)
    try:
        due = utc_now() + timedelta(milliseconds=200)
        alarm.at(due)
        wait_until(woken.is_set, 10, "the alarm's wake-up")
        assert seen[0] >= due and alarm.fired == 1 and alarm.pending() == []
    finally:
        alarm.close()


def test_the_clean_up_pass_asks_for_a_pass_at_the_window_and_stops_the_job_then(
    store: Store,
) -> None:
    """The reconciler against a fake cloud on a ManualClock: after the notice it asks the
    alarm for the power-off less the allowance, and the pass at that instant records the stop."""
    w = World(store)
    w.running()
    w.clock.advance(20 * 60)
    off = w.interrupt(timedelta(seconds=30))
    asked: list[datetime] = []

    def run() -> None:
        w.reconciler(
            ReconcileContext(
                now=w.clock(),
                jobs=tuple(store.jobs.live_jobs()),
                policies={"p": InForce(POLICY)},
                store=store,
                providers={w.provider: w.handle},
                emitter=Drafter(),
                clock=w.clock,
                wake_at=asked.append,
            )
        )

    run()  # attempt 1 ends, attempt 2 launches; its agent has not registered
    due = off - ALLOWANCE
    assert w.attempt(1).ended and w.attempt(1).stop_sent_at is None
    assert asked == [due]
    w.clock.set(due - timedelta(milliseconds=1))
    run()
    assert w.attempt(1).stop_sent_at is None and asked[-1] == due
    w.clock.set(due)
    run()  # the alarm's pass
    assert w.attempt(1).stop_sent_at == due


def test_a_reconciler_that_asks_for_an_instant_gets_a_pass_then(store: Store) -> None:
    """The reconcile loop hands its alarm to the passes (`ctx.wake_at`): a pass at the instant
    asked for, with no tick and no other wake-up."""
    loop = ReconcileLoop(store, PolicyRegistry(), cast(Emitter, None), utc_now)
    loop.attach(lambda: threading.Thread(target=loop.tick, daemon=True).start())
    seen: list[datetime] = []
    due = utc_now() + timedelta(milliseconds=300)

    def reconciler(ctx: ReconcileContext) -> None:
        seen.append(ctx.now)
        if len(seen) == 1:
            ctx.wake_at(due)

    loop.add(reconciler)
    try:
        loop.run_once()
        wait_until(lambda: len(seen) >= 2, 10, "the pass at the instant asked for")
        assert seen[1] >= due and loop.alarm.fired == 1
    finally:
        loop.alarm.close()
