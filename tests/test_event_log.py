"""The daemon's log of jobs' events: the store tells its listeners what each transaction
recorded once it has committed (never after a rollback), and `JobEventLog` turns a job's
event into one line with stable fields, secrets redacted (the end-to-end test with a real
daemon is test_daemon_event_log.py)."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator, Sequence

import pytest

from optimizer.daemon.eventlog import FIELDS, JobEventLog, job_event_fields, logfmt
from optimizer.daemon.logsetup import configure
from optimizer.model import EventKind
from optimizer.store import EventRecord, NewEvent, Store
from tests.helpers import T0


class Heard:
    def __init__(self) -> None:
        self.batches: list[list[EventRecord]] = []

    def __call__(self, records: Sequence[EventRecord]) -> None:
        self.batches.append(list(records))


@pytest.fixture
def heard(store: Store) -> Iterator[Heard]:
    listener = Heard()
    store.events.listen(listener)
    yield listener
    store.events.unlisten(listener)


def event(kind: EventKind = EventKind.JOB_STATE_CHANGED, **data: object) -> NewEvent:
    return NewEvent(kind, "m", data=data or None)


def test_listeners_hear_each_committed_transaction_once_as_stored(
    store: Store, heard: Heard
) -> None:
    job_id = store.jobs.add_job("train", "p", {}, at=T0, event=event(EventKind.JOB_SUBMITTED))
    store.jobs.transition_job(
        job_id,
        expected="pending",
        state="provisioning",
        reason="launched",
        events=[event(to="provisioning"), event(EventKind.JOB_DEFERRED)],
        at=T0,
    )
    assert [[e.kind for e in batch] for batch in heard.batches] == [
        ["job.submitted"],
        ["job.state_changed", "job.deferred"],
    ]
    stored = {e.id: e for e in store.events.list_events()}
    assert [stored[e.id] for batch in heard.batches for e in batch] == [
        e for batch in heard.batches for e in batch
    ]
    assert heard.batches[1][0].job_id == job_id and heard.batches[1][0].data == {
        "to": "provisioning"
    }


def test_a_write_that_rolls_back_tells_nothing(store: Store, heard: Heard) -> None:
    job_id = store.jobs.add_job("train", "p", {}, at=T0)
    # The first event is written, the second cannot be: the transaction rolls back whole.
    unwritable = NewEvent(EventKind.JOB_FAILED, "m", data={"x": object()})
    with pytest.raises(TypeError):
        store.events.record_events([event(), unwritable], T0)
    # A transition that lost its compare-and-set writes nothing either.
    lost = store.jobs.transition_job(
        job_id, expected="running", state="failed", reason="r", events=[event()], at=T0
    )
    assert lost is None
    assert heard.batches == [] and store.events.list_events() == []


def test_a_failing_listener_neither_undoes_nor_fails_the_write(
    store: Store, heard: Heard, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(_records: Sequence[EventRecord]) -> None:
        raise RuntimeError("listener bug")

    store.events.listen(broken)
    try:
        store.events.record_events([event()], T0)
    finally:
        store.events.unlisten(broken)
    assert [e.kind for e in store.events.list_events()] == ["job.state_changed"]
    assert len(heard.batches) == 1
    assert "an event listener failed" in caplog.text


def record(kind: str, message: str, data: dict[str, object] | None, **rest: object) -> EventRecord:
    values: dict[str, object] = {
        "id": 7,
        "at": T0,
        "kind": kind,
        "severity": "info",
        "job_id": 3,
        "policy": "local-train",
        "message": message,
        "data": data,
    }
    values.update(rest)
    return EventRecord(**values)  # type: ignore[arg-type]


def test_a_jobs_event_has_the_stable_fields_in_order_and_others_have_none() -> None:
    moved = record(
        "job.state_changed",
        "job train: pending → provisioning (launched attempt 1 on …)",
        {
            "job": "train",
            "attempt": 1,
            "instance": "i-local-0001",
            "from": "pending",
            "to": "provisioning",
            "reason": "launched attempt 1 on local eu-west-1 g4dn.xlarge spot",
        },
    )
    assert job_event_fields(moved) == {
        "event": "job.state_changed",
        "event_id": 7,
        "job": "train",
        "attempt": 1,
        "instance": "i-local-0001",
        "from": "pending",
        "to": "provisioning",
        "reason": "launched attempt 1 on local eu-west-1 g4dn.xlarge spot",
        "policy": "local-train",
        "severity": "info",
    }
    assert list(job_event_fields(moved) or {}) == list(FIELDS)
    interrupted = record(
        "job.interrupted",
        "job train: spot capacity reclaimed on local eu-west-1 …",
        {"job": "train", "attempt": 2},
        severity="warning",
    )
    assert job_event_fields(interrupted) == {
        "event": "job.interrupted",
        "event_id": 7,
        "job": "train",
        "attempt": 2,
        "reason": "spot capacity reclaimed on local eu-west-1 …",
        "policy": "local-train",
        "severity": "warning",
    }
    assert job_event_fields(record("policy.loaded", "m", None, job_id=None)) is None


def test_logfmt_keeps_one_event_on_one_line() -> None:
    line = logfmt({"event": "job.failed", "job": "a b", "reason": 'exit 1\n"boom"', "n": 3})
    assert line == 'event=job.failed job="a b" reason="exit 1\\n\\"boom\\"" n=3'
    assert "\n" not in line


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_event_lines_follow_the_severity_and_redact_secrets_in_every_field(fmt: str) -> None:
    secret = "hunter2-webhook-secret"
    out = io.StringIO()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    configure(fmt, "info", secrets=[secret], stream=out)
    try:
        failed = record(
            "job.launch_failed",
            f"launch on local eu-west-1 failed: bad credential {secret}",
            {"job": "train", "attempt": 1},
            severity="warning",
        )
        JobEventLog()(
            [
                failed,
                record("policy.loaded", "m", None, job_id=None),
                record(
                    "job.failed", "job train: setup exited 1", {"job": "train"}, severity="error"
                ),
                record("job.succeeded", "job train finished", {"job": "train"}),
            ]
        )
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    line, failed_line, done_line = out.getvalue().splitlines()
    levels = [
        json.loads(x)["level"] if fmt == "json" else x.split()[2]
        for x in (line, failed_line, done_line)
    ]
    assert levels == (
        ["warning", "error", "info"] if fmt == "json" else ["WARNING", "ERROR", "INFO"]
    )
    assert secret not in line and "***" in line
    if fmt == "json":
        entry = json.loads(line)
        assert entry["level"] == "warning" and entry["logger"] == "optimizer.daemon.eventlog"
        assert entry["event"] == "job.launch_failed" and entry["attempt"] == 1
        assert entry["reason"] == "launch on local eu-west-1 failed: bad credential ***"
    else:
        assert (
            " WARNING optimizer.daemon.eventlog: event=job.launch_failed event_id=7 job=train "
            in (line)
        )
