"""Events, and the alerts the outbox delivers, come in commit order on SQLite and PostgreSQL:
whatever a reader sees at any moment is the start of what it sees later, so a transaction
that took its time (or its id) first but commits last comes after, and a reader that read in
between, then reads on past the last event it saw, misses nothing."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlalchemy import text

from optimizer.store import NewEvent, Store
from optimizer.store.events import write_events
from tests.helpers import T0
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.usefixtures("daemon_env")

LATER = T0 + timedelta(hours=1)  # when every alert here is due


def alert(kind: str) -> NewEvent:
    return NewEvent(kind, f"{kind} happened", alerts=("ops",))


def delivered(store: Store) -> list[str]:
    """The order the outbox hands the alerts out in."""
    return [a.event.kind for a in store.events.due_alerts(LATER, limit=100)]


def by_id(store: Store, after: int = 0) -> list[tuple[int, str]]:
    """The event log read on from `after` (the last id a reader saw), in id order."""
    events = store.events.list_events(limit=1000)
    return sorted((e.id, e.kind) for e in events if e.id > after)


def test_a_transaction_that_took_its_time_first_but_commits_last_comes_after(
    store: Store,
) -> None:
    job = store.jobs.add_job("train", "p", {"run": "x"}, at=T0)
    with store.engine.begin() as first:
        # The first transaction starts: it reads, and takes its time (a pass's "now") ...
        assert first.execute(text("SELECT count(*) FROM job")).scalar() == 1
        # ... while the second one records its event, later, and commits.
        store.events.record_event(alert("second"), at=T0 + timedelta(seconds=2))
        seen = delivered(store)
        log = by_id(store)
        write_events(first, [alert("first")], T0 + timedelta(seconds=1))
    assert seen == ["second"]
    assert delivered(store) == ["second", "first"]  # commit order: what was seen, then more
    assert [kind for _, kind in log + by_id(store, after=log[-1][0])] == ["second", "first"]
    times = [e.at for e in reversed(store.events.list_events(limit=10)) if e.job_id is None]
    assert times == sorted(times)  # the times agree with that order
    assert store.jobs.get_job_by_id(job) is not None


def test_an_event_written_first_but_committed_last_is_not_skipped(store: Store) -> None:
    """PostgreSQL numbers a row when it is inserted, not when it commits: without a lock, a
    reader between the two commits sees the later id and, reading on past it, skips the
    earlier one. (SQLite's one writer cannot be overtaken once it has written.)"""
    if store.engine.dialect.name != "postgresql":
        pytest.skip("SQLite has one writer: the second transaction cannot commit first")
    pid: list[int] = []
    done = threading.Event()

    def second() -> None:
        with store.engine.begin() as conn:
            pid.append(int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one()))
            write_events(conn, [alert("second")], T0 + timedelta(seconds=2))
        done.set()

    def waiting_for_a_lock() -> bool:
        with store.engine.connect() as conn:
            state = conn.execute(
                text("SELECT wait_event_type FROM pg_stat_activity WHERE pid = :pid"),
                {"pid": pid[0]},
            ).scalar()
        return state == "Lock"

    with store.engine.begin() as first:
        write_events(first, [alert("first")], T0 + timedelta(seconds=1))
        thread = threading.Thread(target=second)
        thread.start()
        wait_until(lambda: pid, 10, "the second transaction")
        # It has committed (it overtook the first), or it waits for the first to commit.
        wait_until(lambda: done.is_set() or waiting_for_a_lock(), 10, "the second to commit")
        seen, log = delivered(store), by_id(store)
    thread.join(10)
    assert done.is_set()
    final = delivered(store)
    assert final[: len(seen)] == seen  # what the outbox saw in between comes first
    later = by_id(store, after=log[-1][0] if log else 0)
    assert sorted(kind for _, kind in log + later) == ["first", "second"]  # none skipped
