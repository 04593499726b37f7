"""Job logs in the store, on SQLite and PostgreSQL: chunks stored once per (attempt, seq), the
per-job cap dropping the oldest output and counting it, text both databases take, and the
retention loop pruning the logs of jobs that ended long ago."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest

from optimizer.clock import ManualClock
from optimizer.daemon.loops.retention import RetentionLoop
from optimizer.store import NewChunk, Retention, Store
from optimizer.store.jobs import AttemptRecord
from tests.helpers import T0, make_config, make_offer, running


def attempt_of(store: Store, job: str, number: int = 1) -> AttemptRecord:
    found = store.jobs.get_job(job)
    job_id = found.id if found else store.jobs.add_job(job, "small", {"run": "x"}, at=T0)
    offer = make_offer(provider="local", region="eu-west-1", zone="eu-west-1-a", observed_at=T0)
    return store.jobs.create_attempt(job_id, number, f"{job}-{number}", offer, "sha", T0)


def chunk(seq: int, text: str, stream: str = "stdout") -> NewChunk:
    return NewChunk(seq, stream, text)


def append(store: Store, attempt: AttemptRecord, *chunks: NewChunk, cap: int = 1 << 20):
    return store.logs.append(
        job_id=attempt.job_id, attempt_id=attempt.id, chunks=chunks, max_bytes_per_job=cap, at=T0
    )


def held(store: Store, attempt: AttemptRecord) -> list[tuple[int, str]]:
    return [(c.seq, c.text) for c in store.logs.chunks(attempt.id)]


def test_a_chunk_sent_again_is_acknowledged_and_stored_once(store: Store) -> None:
    a = attempt_of(store, "train")
    first = append(store, a, chunk(0, "step 1\n"), chunk(1, "oops\n", "stderr"))
    assert (first.acked, first.stored, first.stored_bytes) == ([0, 1], 2, 12)
    again = append(store, a, chunk(1, "oops\n", "stderr"), chunk(2, "step 2\n"), chunk(2, "x"))
    assert (again.acked, again.stored, again.stored_bytes) == ([1, 2], 1, 7)
    assert held(store, a) == [(0, "step 1\n"), (1, "oops\n"), (2, "step 2\n")]
    assert [c.stream for c in store.logs.chunks(a.id)] == ["stdout", "stderr", "stdout"]
    record = store.jobs.attempt(a.key)
    assert record is not None and (record.log_bytes, record.log_dropped_bytes) == (19, 0)
    assert store.logs.chunks(a.id, after_seq=0, upto_seq=1)[0].seq == 1
    assert [c.seq for c in store.logs.chunks_before(a.id, before_seq=2)] == [1, 0]
    assert store.logs.last_seqs([a.id]) == {a.id: 2}


def test_past_the_cap_the_oldest_output_goes_first_and_is_counted(store: Store) -> None:
    one = attempt_of(store, "train", 1)
    two = attempt_of(store, "train", 2)
    append(store, one, *(chunk(i, f"{i}" * 30) for i in range(3)), cap=100)  # 90 bytes
    done = append(store, two, chunk(0, "é" * 20), chunk(1, "z" * 30), cap=100)  # 40 + 30 bytes
    # 160 bytes held against a cap of 100: attempt 1's first two chunks (60 bytes) go.
    assert done.dropped_bytes == 60
    assert [s for s, _ in held(store, one)] == [2]
    assert [s for s, _ in held(store, two)] == [0, 1]
    first, second = store.jobs.attempt(one.key), store.jobs.attempt(two.key)
    assert first is not None and (first.log_bytes, first.log_dropped_bytes) == (30, 60)
    assert second is not None and (second.log_bytes, second.log_dropped_bytes) == (70, 0)
    # Another job is under a cap of its own.
    other = attempt_of(store, "eval")
    assert append(store, other, chunk(0, "y" * 90), cap=100).dropped_bytes == 0
    assert held(store, two)[0][1] == "é" * 20  # counted in UTF-8 bytes, kept whole


def test_text_either_database_would_refuse_is_stored_with_replacement_characters(
    store: Store,
) -> None:
    a = attempt_of(store, "train")
    append(store, a, chunk(0, "nul\x00here \udc80 ok\n"))
    [(_, text)] = held(store, a)
    assert text.startswith("nul\ufffdhere ") and text.endswith(" ok\n") and "\x00" not in text
    with pytest.raises(ValueError, match="stream"):
        append(store, a, NewChunk(1, "stdin", "x"))


def test_the_exit_report_says_how_many_chunks_the_attempt_made(store: Store) -> None:
    a = attempt_of(store, "train")
    b = attempt_of(store, "train", 2)
    events = [{"id": "e1", "kind": "job_exited", "data": {"exit_code": 0, "log_chunks": 3}}]
    store.jobs.record_agent_events(a.key, events, T0)
    store.jobs.record_agent_events(b.key, [{"id": "e2", "kind": "heartbeat", "data": {}}], T0)
    assert store.jobs.exit_reports([a.key, b.key]) == {a.key: {"exit_code": 0, "log_chunks": 3}}


def end(store: Store, name: str, at: datetime) -> None:
    job = store.jobs.get_job(name)
    assert job is not None
    store.jobs.transition_job(job.id, expected="pending", state="succeeded", reason="", at=at)


def test_retention_prunes_the_logs_of_jobs_that_ended_long_enough_ago(store: Store) -> None:
    clock = ManualClock(T0)
    old, recent = attempt_of(store, "old"), attempt_of(store, "recent")
    live = attempt_of(store, "live")
    for a in (old, recent, live):
        append(store, a, *(chunk(i, f"line {i}\n") for i in range(5)))
    end(store, "old", T0)
    end(store, "recent", T0 + timedelta(days=20))
    prices = Retention(raw=timedelta(days=14), hourly=timedelta(days=400))
    leading = True
    loop = RetentionLoop(
        store,
        clock,
        prices,
        log_retention=timedelta(days=30),
        log_batch=2,
        leading=lambda: leading,
    )

    clock.set(T0 + timedelta(days=50, minutes=-1))  # `old` ended 50 days ago, `recent` 30
    leading = False
    assert loop.run_once().log_chunks == 0  # a follower prunes nothing
    assert len(held(store, old)) == 5
    leading = True
    assert loop.run_once().log_chunks == 5  # in batches of 2, all in one pass
    assert held(store, old) == []
    record = store.jobs.attempt(old.key)
    assert record is not None and record.log_bytes == 0
    assert len(held(store, recent)) == 5 and len(held(store, live)) == 5

    clock.advance(minutes=2)  # `recent` has now ended over 30 days ago too
    assert loop.run_once().log_chunks == 5
    assert held(store, recent) == []
    assert len(held(store, live)) == 5  # a live job's output stays, however old

    loop.stop()  # a stopping daemon: the pass ends before another batch
    end(store, "live", T0)
    assert loop.run_once().log_chunks == 0 and len(held(store, live)) == 5


def test_the_daemon_prunes_job_logs_in_its_retention_loop(tmp_path: Path) -> None:
    config = make_config(tmp_path, logs={"retention_days": 7})
    with running(config) as daemon:
        assert daemon.retention.log_retention == timedelta(days=7)


def test_a_page_stops_at_its_byte_budget_but_always_holds_one_chunk(store: Store) -> None:
    a = attempt_of(store, "train")
    append(store, a, chunk(0, "é" * 10), chunk(1, "x" * 5), chunk(2, "y" * 30), chunk(3, "z"))
    # 20 + 5 bytes fit in 25; the 30-byte chunk would not.
    page = store.logs.page(a.id, max_chunks=10, max_bytes=25)
    assert ([c.seq for c in page.chunks], page.more) == ([0, 1], True)
    page = store.logs.page(a.id, after_seq=1, max_chunks=10, max_bytes=25)
    assert ([c.seq for c in page.chunks], page.more) == ([2], True)  # over budget, alone
    page = store.logs.page(a.id, after_seq=2, max_chunks=10, max_bytes=25)
    assert ([c.text for c in page.chunks], page.more) == (["z"], False)
    page = store.logs.page(a.id, max_chunks=2, max_bytes=1 << 20)
    assert ([c.seq for c in page.chunks], page.more) == ([0, 1], True)
    page = store.logs.page(a.id, after_seq=0, upto_seq=2, max_chunks=10, max_bytes=1 << 20)
    assert ([c.seq for c in page.chunks], page.more) == ([1, 2], False)
    assert store.logs.page(a.id, after_seq=3, max_chunks=10, max_bytes=25).chunks == []


def test_line_counts_for_a_tail_come_from_the_database(store: Store) -> None:
    a = attempt_of(store, "train")
    append(
        store,
        a,
        chunk(0, "a\nb\n"),
        chunk(1, "", "stderr"),
        chunk(2, "日本\n語", "stderr"),
        chunk(3, "😀"),
    )
    shapes = store.logs.lines_before(a.id, before_seq=4, limit=10)
    assert [(s.seq, s.stream, s.newlines, s.ends_with_newline, s.empty) for s in shapes] == [
        (3, "stdout", 0, False, False),
        (2, "stderr", 1, False, False),
        (1, "stderr", 0, False, True),
        (0, "stdout", 2, True, False),
    ]
    assert [s.seq for s in store.logs.lines_before(a.id, before_seq=3, limit=2)] == [2, 1]
