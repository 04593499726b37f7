"""What an attempt keeps of its agent's reports, on SQLite and PostgreSQL: the newest heartbeat
and telemetry receipt only, the first job_started and job_exited, at most a fixed number of
rows, and the retention loop deletes the reports of attempts long over."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from optimizer.clock import ManualClock
from optimizer.daemon.loops.retention import RetentionLoop
from optimizer.store import Retention, Store
from optimizer.store import jobs as jobs_store
from tests.helpers import make_offer

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)


def attempt(store: Store, name: str = "train", number: int = 1) -> str:
    job = store.jobs.get_job(name)
    job_id = job.id if job is not None else store.jobs.add_job(name, "p", {"run": "x"}, at=NOW)
    key = f"{name}-{number}"
    store.jobs.create_attempt(job_id, number, key, make_offer(observed_at=NOW), "h", NOW)
    return key


def event(eid: str, kind: str, at: datetime, **data: Any) -> dict[str, Any]:
    return {"id": eid, "kind": kind, "at": at.isoformat(), "data": data}


def kinds(store: Store, key: str) -> list[str]:
    return sorted(e["kind"] for e in store.jobs.agent_events(key))


def test_heartbeats_leave_only_the_newest_row(store: Store) -> None:
    key = attempt(store)
    beats = [event(f"hb-{i}", "heartbeat", NOW + timedelta(seconds=2 * i), n=i) for i in range(90)]
    for batch in range(0, 90, 30):  # a minute and a half of heartbeats, in three calls
        acked = store.jobs.record_agent_events(key, beats[batch : batch + 30], NOW)
        assert acked == [b["id"] for b in beats[batch : batch + 30]]
    [held] = store.jobs.agent_events(key)
    assert (held["id"], held["data"]) == ("hb-89", {"n": 89})

    # A late copy of an older heartbeat is acknowledged and replaces nothing.
    assert store.jobs.record_agent_events(key, [beats[3]], NOW) == ["hb-3"]
    assert [e["id"] for e in store.jobs.agent_events(key)] == ["hb-89"]
    # Other attempts' heartbeats are their own.
    other = attempt(store, number=2)
    store.jobs.record_agent_events(other, [event("o-1", "heartbeat", NOW)], NOW)
    assert [e["id"] for e in store.jobs.agent_events(key)] == ["hb-89"]
    assert [e["id"] for e in store.jobs.agent_events(other)] == ["o-1"]


def test_gpu_telemetry_keeps_every_minute_but_one_receipt(store: Store) -> None:
    key = attempt(store)
    for i in range(5):
        minute = {
            "start": (NOW + timedelta(minutes=i)).isoformat(),
            "samples": 6,
            "gpus": 1,
            "util_mean": 0.5,
        }
        store.jobs.record_agent_events(
            key,
            [event(f"t-{i}", "gpu_telemetry", NOW + timedelta(minutes=i), minutes=[minute])],
            NOW,
        )
    held = store.jobs.agent_events(key)
    assert [e["id"] for e in held] == ["t-4"]
    record = store.jobs.attempt(key)
    assert record is not None
    assert len(store.telemetry.samples(attempt_id=record.id, since=NOW - timedelta(hours=1))) == 5


def test_a_second_job_exited_or_job_started_changes_nothing(store: Store) -> None:
    key = attempt(store)
    store.jobs.record_agent_events(key, [event("s-1", "job_started", NOW, pid=10)], NOW)
    first = {"exit_code": 1, "stopped": False, "phase": "run"}
    assert store.jobs.record_agent_events(key, [event("x-1", "job_exited", NOW, **first)], NOW)
    later = NOW + timedelta(minutes=1)
    forged = [
        event("s-2", "job_started", later, pid=11),
        event("x-2", "job_exited", later, exit_code=0, stopped=False),
    ]
    assert store.jobs.record_agent_events(key, forged, later) == ["s-2", "x-2"]  # acknowledged

    record = store.jobs.attempt(key)
    assert record is not None and (record.exit_code, record.job_started_at) == (1, NOW)
    assert kinds(store, key) == ["job_exited", "job_started"]
    assert store.jobs.exit_reports([key]) == {key: first}


def test_past_the_cap_events_are_acknowledged_but_not_kept(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(jobs_store, "MAX_AGENT_EVENTS_PER_ATTEMPT", 5)
    key = attempt(store)
    junk = [event(f"j-{i}", "custom", NOW, i=i) for i in range(8)]
    assert store.jobs.record_agent_events(key, junk, NOW) == [e["id"] for e in junk]
    assert len(store.jobs.agent_events(key)) == 5
    # A probe result past the cap is neither kept nor folded in.
    store.jobs.record_agent_events(key, [event("p-1", "probe_result", NOW, status="fail")], NOW)
    record = store.jobs.attempt(key)
    assert record is not None and record.probe_status is None
    assert len(store.jobs.agent_events(key)) == 5
    # The reports that end the job, the newest heartbeat, are kept whatever the count.
    store.jobs.record_agent_events(
        key,
        [
            event("hb", "heartbeat", NOW),
            event("x", "job_exited", NOW, exit_code=0, stopped=False),
        ],
        NOW,
    )
    assert kinds(store, key).count("custom") == 5
    assert {"heartbeat", "job_exited"} <= set(kinds(store, key))
    record = store.jobs.attempt(key)
    assert record is not None and record.exit_code == 0


def test_a_large_report_keeps_its_size_not_its_data(store: Store) -> None:
    key = attempt(store)
    store.jobs.record_agent_events(key, [event("big", "custom", NOW, blob="x" * 40_000)], NOW)
    [held] = store.jobs.agent_events(key)
    assert held["data"]["dropped_chars"] > 40_000 and "blob" not in held["data"]


def test_an_event_time_past_the_calendar_is_taken_as_its_arrival(store: Store) -> None:
    key = attempt(store)
    edge = {"id": "e", "kind": "custom", "at": "9999-12-31T23:59:59-14:00", "data": {}}
    store.jobs.record_agent_events(key, [edge], NOW)
    [held] = store.jobs.agent_events(key)
    assert held["at"] == NOW


def end(store: Store, key: str, at: datetime, *, gone: bool = True) -> None:
    store.jobs.update_attempt(key, state="ended", ended_at=at, end_reason="succeeded")
    if gone:
        store.jobs.update_attempt(key, instance_gone=True)


def test_retention_deletes_the_reports_of_attempts_long_over_but_their_exit(
    store: Store,
) -> None:
    clock = ManualClock(NOW)
    old, recent, running, lingering = (attempt(store, number=n) for n in (1, 2, 3, 4))
    for key in (old, recent, running, lingering):
        store.jobs.record_agent_events(
            key,
            [
                event(f"{key}-hb", "heartbeat", NOW - timedelta(days=40)),
                event(f"{key}-p", "probe_result", NOW - timedelta(days=40), status="pass"),
                event(f"{key}-x", "job_exited", NOW - timedelta(days=40), exit_code=0),
            ],
            NOW,
        )
    end(store, old, NOW - timedelta(days=31))
    end(store, recent, NOW - timedelta(days=29))
    end(store, lingering, NOW - timedelta(days=31), gone=False)  # its instance still runs

    loop = RetentionLoop(
        store,
        clock,
        Retention(raw=timedelta(days=14), hourly=timedelta(days=400)),
        log_batch=1,  # one row a batch: the loop goes on until nothing is left
        agent_event_retention=timedelta(days=30),
    )
    report = loop.run_once()
    assert report.agent_events == 2
    assert kinds(store, old) == ["job_exited"]  # the cost ledger reads when the job exited
    for key in (recent, running, lingering):
        assert kinds(store, key) == ["heartbeat", "job_exited", "probe_result"]
    assert loop.run_once().agent_events == 0
