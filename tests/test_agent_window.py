"""The checkpoint window on the agent's side: it stops the job itself at the power-off less the
allowance when the daemon's stop has not come, on an injected wall clock; a stop that came
first wins."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from optimizer.agent import Notice
from optimizer.agent.window import WINDOW_REASON, CheckpointWindow, stop_due
from optimizer.clock import utc_text
from tests.helpers import wait_until
from tests.helpers.agent_loop import ScriptedDaemon, job
from tests.helpers.agent_run import agent_for, run_in_thread

T0 = datetime(2026, 11, 30, 12, tzinfo=UTC)


class WallClock:
    """A wall clock the test moves; counts how often it was read."""

    def __init__(self, start: datetime) -> None:
        self._now = start
        self._lock = threading.Lock()
        self.reads = 0

    def __call__(self) -> datetime:
        with self._lock:
            self.reads += 1
            return self._now

    def set(self, when: datetime) -> None:
        with self._lock:
            self._now = when


def aws_notice(off: datetime) -> Notice:
    return Notice("aws-imds-spot", "terminate", utc_text(off), "ab" * 32, "{}")


def test_the_stops_instant_follows_the_notice_and_the_allowance() -> None:
    seen = T0 + timedelta(seconds=0.4)
    off = {"action": "terminate", "time": utc_text(T0 + timedelta(seconds=30))}
    assert stop_due(off, seen, 20) == T0 + timedelta(seconds=10)
    gcp = {"action": "preempted", "time": utc_text(seen)}  # GCP: 30 s after it was seen
    assert stop_due(gcp, seen, 20) == seen + timedelta(seconds=10)
    assert stop_due({"action": "rebalance", "time": utc_text(T0)}, seen, 20) is None
    assert stop_due(off, seen, None) is None  # an older daemon sends no allowance


def test_the_window_says_how_long_is_left_on_its_clock() -> None:
    clock = WallClock(T0)
    window = CheckpointWindow(clock)
    window.allowance_s = 20
    assert window.left() is None  # no notice yet
    window.notice(aws_notice(T0 + timedelta(seconds=30)).to_data())
    window.notice(aws_notice(T0 + timedelta(seconds=90)).to_data())  # the first one counts
    assert window.due == T0 + timedelta(seconds=10) and window.left() == 10
    clock.set(T0 + timedelta(seconds=12))
    assert window.left() == -2


def stopped_events(daemon: ScriptedDaemon) -> list[Any]:
    return [e for e in daemon.events if e.kind == "stopped"]


def test_the_agent_stops_the_job_itself_at_the_window_when_no_stop_came(tmp_path: Path) -> None:
    daemon = ScriptedDaemon(job(tmp_path, 100000, checkpoint_allowance_s=20))
    clock = WallClock(T0)
    agent, watcher = agent_for(tmp_path, daemon, flush_s=5)
    agent.window.wall = clock
    result = run_in_thread(agent)
    wait_until(lambda: "job_started" in daemon.kinds(), what="the job to start")
    watcher.notices.append(aws_notice(T0 + timedelta(seconds=30)))
    wait_until(lambda: agent.window.due is not None, what="the window to be armed")
    assert agent.window.due == T0 + timedelta(seconds=10)
    wait_until(lambda: daemon.polls >= 2, what="the agent to ask for its stop after the notice")
    clock.set(T0 + timedelta(seconds=9.999))
    reads = clock.reads
    wait_until(lambda: clock.reads >= reads + 10, what="the loop to look at the window")
    assert agent.stop_reason is None and agent.state == "running"  # not a moment early
    clock.set(T0 + timedelta(seconds=10))
    wait_until(lambda: "code" in result, timeout=20, what="the agent to finish")
    assert result["code"] == 0
    assert agent.stop_reason is not None and agent.stop_reason.startswith(WINDOW_REASON)
    assert [e.data["reason"] for e in stopped_events(daemon)] == [agent.stop_reason]
    assert "checkpointed" in (tmp_path / "agent" / "job.log").read_text()


def test_a_stop_the_daemon_sent_first_wins_and_the_job_is_stopped_once(tmp_path: Path) -> None:
    daemon = ScriptedDaemon(job(tmp_path, 100000, checkpoint_allowance_s=20))
    clock = WallClock(T0)
    agent, watcher = agent_for(tmp_path, daemon, flush_s=5)
    agent.window.wall = clock
    signals: list[int] = []
    result = run_in_thread(agent)
    wait_until(lambda: "job_started" in daemon.kinds(), what="the job to start")
    runner = agent.job
    assert runner is not None
    send = runner.signal

    def counted(signum: int) -> None:
        signals.append(signum)
        send(signum)

    runner.signal = counted  # type: ignore[method-assign]
    watcher.notices.append(aws_notice(T0 + timedelta(seconds=30)))
    wait_until(lambda: agent.window.due is not None, what="the window to be armed")
    # The replacement is ready early: the daemon's stop comes on the agent's next poll.
    daemon.commands.append({"kind": "stop", "reason": "interrupted; attempt 2 is ready"})
    wait_until(lambda: agent.stop_reason is not None, what="the daemon's stop")
    clock.set(T0 + timedelta(seconds=11))  # the window passes while the job checkpoints
    wait_until(lambda: "code" in result, timeout=20, what="the agent to finish")
    assert agent.stop_reason == "interrupted; attempt 2 is ready"
    assert [e.data["reason"] for e in stopped_events(daemon)] == [agent.stop_reason]
    assert signals.count(15) == 1  # one SIGTERM
