"""Job logs over HTTP on a real loopback server: agents ship chunks with their own token
(POST /agent/v1/logs), people read them (GET /jobs/{name}/logs) whole, by attempt, as a tail,
or followed as they arrive until the job's output is complete."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from optimizer.api.logs import PAGE_BYTES
from optimizer.daemon.service import Daemon
from optimizer.store import NewChunk, token_sha256
from optimizer.store.jobs import AttemptRecord
from tests.helpers import (
    TOKEN,
    api,
    make_config,
    make_offer,
    running,
    steady_clock,
    wait_until,
)
from tests.helpers.daemon import without_job_passes

pytestmark = pytest.mark.usefixtures("daemon_env")

H1 = "==> attempt 1 · aws use1-az1 g5.xlarge spot · i-train-1 <=="
H2 = "==> attempt 2 · aws us-east-1 p5.48xlarge on_demand · i-train-2 <=="


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    config = make_config(tmp_path, logs={"max_bytes_per_job": 65536})
    with running(config, clock=steady_clock()) as d:
        without_job_passes(d)  # the tests play the jobs' agents
        yield d


def add_attempt(daemon: Daemon, job: str, number: int, **offer: Any) -> AttemptRecord:
    store = daemon.store
    found = store.jobs.get_job(job)
    job_id = found.id if found else store.jobs.add_job(job, "small", {"run": "x"})
    key = f"{job}-{number}"
    record = store.jobs.create_attempt(
        job_id, number, key, make_offer(**offer), token_sha256(f"token-{key}"), daemon.clock()
    )
    store.jobs.update_attempt(key, instance_id=f"i-{key}")
    return record


def ship(daemon: Daemon, key: str, *chunks: tuple[int, str, str], token: str | None = None):
    body = {
        "attempt_key": key,
        "chunks": [{"seq": s, "stream": st, "text": t} for s, st, t in chunks],
    }
    headers = {"Authorization": f"Bearer {token or 'token-' + key}"}
    return httpx.post(f"{daemon.url}/agent/v1/logs", json=body, headers=headers, timeout=10)


def logs(daemon: Daemon, name: str, **params: Any) -> httpx.Response:
    with api(daemon) as client:
        return client.get(f"/jobs/{name}/logs", params=params)


def two_attempts(daemon: Daemon) -> None:
    add_attempt(daemon, "train", 1)
    add_attempt(
        daemon, "train", 2, region="us-east-1", zone=None, instance_type="p5.48xlarge",
        market="on_demand",
    )  # fmt: skip
    assert ship(daemon, "train-1", (0, "stdout", "step 1\nstep 2\n"), (1, "stderr", "warn\n"))
    ship(daemon, "train-1", (2, "stdout", "step 3\n"))
    ship(daemon, "train-2", (0, "stdout", "resumed at 3\nstep 4\n"))


def test_an_agent_ships_with_its_own_token_and_a_resend_is_stored_once(daemon: Daemon) -> None:
    add_attempt(daemon, "train", 1)
    add_attempt(daemon, "other", 1)
    first = ship(daemon, "train-1", (0, "stdout", "a\n"), (1, "stderr", "b\n"))
    assert first.status_code == 200 and first.json() == {"ack": [0, 1]}
    again = ship(daemon, "train-1", (1, "stderr", "b\n"), (2, "stdout", "c\n"))
    assert again.json() == {"ack": [1, 2]}
    assert logs(daemon, "train").text == f"{H1}\na\nb\nc\n"
    # Another attempt's token does not reach this attempt's log; no token, nothing read.
    assert ship(daemon, "train-1", (3, "stdout", "x\n"), token="token-other-1").status_code == 401
    assert ship(daemon, "train-1", (3, "stdout", "x\n"), token="nope").status_code == 401
    assert ship(daemon, "train-1", (3, "stdin", "x\n")).status_code == 422
    assert ship(daemon, "train-1", (-1, "stdout", "x\n")).status_code == 422
    assert api(daemon, token=None).get("/jobs/train/logs").status_code == 401
    assert logs(daemon, "train").text == f"{H1}\na\nb\nc\n"


def test_each_attempt_shows_under_its_header_in_order(daemon: Daemon) -> None:
    two_attempts(daemon)
    answer = logs(daemon, "train")
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "text/plain; charset=utf-8"
    assert answer.text == (f"{H1}\nstep 1\nstep 2\nwarn\nstep 3\n\n{H2}\nresumed at 3\nstep 4\n")
    assert logs(daemon, "train", attempt=2).text == f"{H2}\nresumed at 3\nstep 4\n"


def test_tail_keeps_the_last_lines_under_the_headers_they_belong_to(daemon: Daemon) -> None:
    two_attempts(daemon)
    assert logs(daemon, "train", tail=3).text == f"{H1}\nstep 3\n\n{H2}\nresumed at 3\nstep 4\n"
    assert logs(daemon, "train", tail=1).text == f"{H2}\nstep 4\n"
    assert logs(daemon, "train", tail=2, attempt=1).text == f"{H1}\nwarn\nstep 3\n"
    assert logs(daemon, "train", tail=0).text == ""
    assert logs(daemon, "train", tail=100).text == logs(daemon, "train").text


def test_unknown_jobs_and_attempts_are_404s_that_say_what_exists(daemon: Daemon) -> None:
    two_attempts(daemon)
    missing = logs(daemon, "nope")
    assert missing.status_code == 404 and missing.json() == {"detail": "no job named 'nope'"}
    attempt = logs(daemon, "train", attempt=5)
    assert attempt.status_code == 404
    assert attempt.json()["detail"] == "job 'train' has no attempt 5; its attempts: 1, 2"
    daemon.store.jobs.add_job("fresh", "small", {"run": "x"})
    assert logs(daemon, "fresh", attempt=1).json()["detail"].endswith("it has no attempts yet")
    assert logs(daemon, "fresh").text == ""
    assert logs(daemon, "train", tail=-1).status_code == 422


def test_a_line_cut_short_by_the_other_stream_is_ended_there(daemon: Daemon) -> None:
    add_attempt(daemon, "train", 1)
    ship(daemon, "train-1", (0, "stdout", "epoch 1: 50%"), (1, "stderr", "warning\n"))
    ship(daemon, "train-1", (2, "stdout", "\repoch 1: 100%\n"))
    assert logs(daemon, "train").text == f"{H1}\nepoch 1: 50%\nwarning\n\repoch 1: 100%\n"


def test_past_the_cap_the_output_says_how_much_was_dropped(daemon: Daemon) -> None:
    add_attempt(daemon, "train", 1)
    for part in (range(40), range(40, 70)):
        ship(daemon, "train-1", *((i, "stdout", f"{i:04d}" + "x" * 1019 + "\n") for i in part))
    text = logs(daemon, "train").text
    lines = text.splitlines()
    assert lines[0] == H1
    # 70 KiB shipped against a cap of 64 KiB: the 6 oldest chunks went.
    assert lines[1] == (
        "[gpuopt: 6144 bytes of this attempt's earliest output were dropped to keep the job's "
        "log under logs.max_bytes_per_job]"
    )
    assert lines[2].startswith("0006") and lines[-1].startswith("0069") and len(lines) == 66


class Follower:
    """GET …/logs?follow=true read on a thread: what arrived so far, and how it ended."""

    def __init__(self, daemon: Daemon, name: str, **params: Any) -> None:
        self.text = ""
        self.ended: str | None = None  # "done" or the exception's name
        self.client = api(daemon)
        self._response: httpx.Response | None = None
        params = {"follow": "true", **params}
        threading.Thread(target=self._read, args=(name, params), daemon=True).start()

    def _read(self, name: str, params: dict[str, Any]) -> None:
        try:
            with self.client.stream(
                "GET", f"/jobs/{name}/logs", params=params, timeout=httpx.Timeout(10, read=60)
            ) as response:
                self._response = response
                for piece in response.iter_text():
                    self.text += piece
            self.ended = "done"
        except Exception as exc:
            self.ended = type(exc).__name__

    def close(self) -> None:
        if self._response is not None:
            self._response.close()
        self.client.close()


def followers(daemon: Daemon) -> float:
    return daemon.metrics.sample("gpuopt_log_followers") or 0.0


def finish(daemon: Daemon, key: str, chunks: int, state: str = "succeeded") -> None:
    """The agent's job_exited report counting `chunks`, and the job ended."""
    event = {
        "id": f"exit-{key}",
        "kind": "job_exited",
        "data": {"exit_code": 0, "log_chunks": chunks},
    }
    daemon.store.jobs.record_agent_events(key, [event], daemon.clock())
    job = daemon.store.jobs.get_job(key.rsplit("-", 1)[0])
    assert job is not None
    if state:
        daemon.store.jobs.transition_job(
            job.id, expected=job.state, state=state, reason="done", at=daemon.clock()
        )


def test_following_streams_new_output_and_new_attempts_until_the_output_is_complete(
    daemon: Daemon,
) -> None:
    add_attempt(daemon, "train", 1)
    ship(daemon, "train-1", (0, "stdout", "step 1\n"))
    follower = Follower(daemon, "train")
    try:
        wait_until(lambda: "step 1\n" in follower.text, what="the output so far")
        assert followers(daemon) == 1
        ship(daemon, "train-1", (1, "stdout", "step 2\n"))
        wait_until(lambda: "step 2\n" in follower.text, what="new output")
        # An interruption: attempt 1 reported its end, attempt 2 takes over.
        finish(daemon, "train-1", 2, state="")
        add_attempt(
            daemon, "train", 2, region="us-east-1", zone=None,
            instance_type="p5.48xlarge", market="on_demand",
        )  # fmt: skip
        ship(daemon, "train-2", (0, "stdout", "step 3\n"))
        wait_until(lambda: H2 in follower.text, what="the next attempt's output")
        # The job has ended but attempt 2's agent counted 2 chunks: the follower waits.
        finish(daemon, "train-2", 2)
        ship(daemon, "train-2", (1, "stdout", "done\n"))
        wait_until(lambda: follower.ended, what="the stream to end")
        assert follower.ended == "done"
        assert follower.text == f"{H1}\nstep 1\nstep 2\n\n{H2}\nstep 3\ndone\n"
        wait_until(lambda: followers(daemon) == 0, what="no follower left")
    finally:
        follower.close()


def test_following_one_attempt_ends_when_its_output_is_complete(daemon: Daemon) -> None:
    add_attempt(daemon, "train", 1)
    follower = Follower(daemon, "train", attempt=1, tail=5)
    try:
        wait_until(lambda: H1 in follower.text, what="the header, before any output")
        shipped = ship(daemon, "train-1", (0, "stdout", "only\n"))
        assert shipped.status_code == 200, shipped.text
        finish(daemon, "train-1", 1, state="")  # the job itself goes on (a new attempt)
        wait_until(lambda: follower.ended, what="the stream to end")
        assert (follower.ended, follower.text) == ("done", f"{H1}\nonly\n")
    finally:
        follower.close()


def test_a_follower_gives_up_on_output_still_owed_once_the_job_ended(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("optimizer.api.logs.SETTLE_S", 0.2)
    add_attempt(daemon, "train", 1)
    ship(daemon, "train-1", (0, "stdout", "partial\n"))
    follower = Follower(daemon, "train")
    try:
        finish(daemon, "train-1", 5)  # 5 chunks counted, 1 arrived, and none will
        wait_until(lambda: follower.ended, what="the stream to end")
        assert (follower.ended, follower.text) == ("done", f"{H1}\npartial\n")
    finally:
        follower.close()


def test_a_client_that_goes_away_leaves_no_follower_behind(daemon: Daemon) -> None:
    add_attempt(daemon, "train", 1)
    ship(daemon, "train-1", (0, "stdout", "step 1\n"))
    host, port = daemon.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(
            b"GET /jobs/train/logs?follow=true HTTP/1.1\r\nHost: gpuopt\r\n"
            + f"Authorization: Bearer {TOKEN}\r\n\r\n".encode()
        )
        seen = b""
        while b"step 1" not in seen:
            seen += conn.recv(4096)
        assert followers(daemon) == 1
    wait_until(lambda: followers(daemon) == 0, what="the follower to end with its client")


def test_followers_end_cleanly_when_the_daemon_stops(tmp_path: Path) -> None:
    with running(make_config(tmp_path), clock=steady_clock()) as daemon:
        add_attempt(daemon, "train", 1)
        ship(daemon, "train-1", (0, "stdout", "step 1\n"))
        follower = Follower(daemon, "train")
        wait_until(lambda: "step 1" in follower.text, what="the output so far")
    try:
        wait_until(lambda: follower.ended, what="the stream to end")
        assert follower.ended == "done"  # a complete answer, not a connection cut mid-stream
        assert follower.text == (
            f"{H1}\nstep 1\n[gpuopt: the daemon is stopping; follow again once it is back]\n"
        )
    finally:
        follower.close()


# -- bounded reads and follower limits ------------------------------------------------------


class CountingLogs:
    """The store's job logs, counting the bytes of text each read hands back."""

    READS = ("chunks", "chunks_before", "page")

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.reads: list[int] = []

    def __getattr__(self, name: str) -> Any:
        found = getattr(self.inner, name)
        if name not in self.READS:
            return found

        def counted(*args: Any, **kwargs: Any) -> Any:
            out = found(*args, **kwargs)
            chunks = out.chunks if hasattr(out, "chunks") else out
            self.reads.append(sum(len(c.text.encode()) for c in chunks))
            return out

        return counted


def store_chunks(daemon: Daemon, key: str, *chunks: tuple[int, str, str]) -> None:
    """Chunks straight into the store (faster than shipping megabytes through the API)."""
    record = daemon.store.jobs.attempt(key)
    assert record is not None
    daemon.store.logs.append(
        job_id=record.job_id,
        attempt_id=record.id,
        chunks=[NewChunk(seq, stream, text) for seq, stream, text in chunks],
        max_bytes_per_job=64 << 20,
    )


def test_a_large_log_is_read_from_the_store_a_bounded_page_at_a_time(daemon: Daemon) -> None:
    add_attempt(daemon, "train", 1)
    # 48 chunks of 64 Ki characters, a third of them two bytes each in UTF-8: ~4 MiB.
    texts = [(f"{i:03d}" + ("é" if i % 3 == 0 else "x") * 65_532 + "\n") for i in range(48)]
    store_chunks(daemon, "train-1", *((i, "stdout", t) for i, t in enumerate(texts)))
    counting = CountingLogs(daemon.store.logs)
    daemon.store.logs = counting  # type: ignore[assignment]
    whole = logs(daemon, "train")
    assert whole.text == H1 + "\n" + "".join(texts)
    finish(daemon, "train-1", 48)
    follower = Follower(daemon, "train")
    try:
        wait_until(lambda: follower.ended, what="the follower to read it all and end")
        assert follower.text == whole.text
    finally:
        follower.close()
    assert logs(daemon, "train", tail=2).text == H1 + "\n" + "".join(texts[-2:])
    # Every byte was read twice (whole, followed), the tail's in a page or two.
    total = sum(len(t.encode()) for t in texts)
    assert 2 * total <= sum(counting.reads) <= 2 * total + 2 * (PAGE_BYTES + 4 * 65_536)
    # One page: at most PAGE_BYTES past its first chunk (a chunk is 256 KiB at most).
    assert max(counting.reads) <= PAGE_BYTES + 4 * 65_536


MIXED = [
    (0, "stdout", "héllo wörld\nstep 1: 50%"),
    (1, "stderr", "⚠ warning: 😀 emoji\n"),
    (2, "stdout", ""),
    (3, "stdout", "\rstep 1: 100%\n日本語の行\n"),
    (4, "stderr", "partial é"),
    (5, "stderr", "è continued\nlast stderr"),
    (6, "stdout", "\n"),
    (7, "stdout", "😀" * 5 + "\n" + "é" * 3),
]


def old_answer(daemon: Daemon, name: str, tail: int | None, number: int | None = None) -> str:
    """What the answer was when every attempt was read whole: all chunks rendered at once,
    and a tail cut with last_lines from each attempt's whole text (the oracle)."""
    from optimizer.api.logs import Renderer, count_lines, last_lines

    job = daemon.store.jobs.get_job(name)
    assert job is not None
    attempts = daemon.store.jobs.attempts(job.id)
    attempts = [a for a in attempts if number is None or a.number == number]
    everything = {a.id: daemon.store.logs.chunks(a.id, limit=10**6) for a in attempts}
    render = Renderer()
    start = render.begin(attempts[0]) if number is not None else ""
    if tail is None:
        return start + "".join(
            render.text(a, everything[a.id]) for a in attempts if everything[a.id]
        )
    wanted, parts = tail, []
    for attempt in reversed(attempts):
        if wanted <= 0:
            break
        chunks = everything[attempt.id]
        if not chunks:
            continue
        text = last_lines(Renderer().body(chunks), wanted)
        wanted -= count_lines(text)
        parts.append((attempt, text, chunks[-1].stream))
    return start + "".join(render.verbatim(a, t, s) for a, t, s in reversed(parts))


def test_output_is_the_same_whatever_the_page_boundaries(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_attempt(daemon, "train", 1)
    add_attempt(
        daemon, "train", 2, region="us-east-1", zone=None, instance_type="p5.48xlarge",
        market="on_demand",
    )  # fmt: skip
    store_chunks(daemon, "train-1", *MIXED)
    store_chunks(daemon, "train-2", *((seq, stream, text[::-1]) for seq, stream, text in MIXED))
    lines = old_answer(daemon, "train", None).count("\n")
    tails = [None, *range(lines + 3)]
    expected = {tail: old_answer(daemon, "train", tail) for tail in tails}
    expected_one = {tail: old_answer(daemon, "train", tail, number=2) for tail in tails}
    # Pages of one or two chunks, every 1-5 bytes: each boundary falls somewhere new.
    for page, page_bytes, lines_page in ((1, 1, 1), (2, 5, 2), (3, 3, 3), (200, 1 << 20, 1000)):
        monkeypatch.setattr("optimizer.api.logs.PAGE", page)
        monkeypatch.setattr("optimizer.api.logs.PAGE_BYTES", page_bytes)
        monkeypatch.setattr("optimizer.api.logs.LINES_PAGE", lines_page)
        for tail in tails:
            params = {} if tail is None else {"tail": tail}
            assert logs(daemon, "train", **params).text == expected[tail], (page, tail)
            assert logs(daemon, "train", attempt=2, **params).text == expected_one[tail]


def raw_follower(daemon: Daemon, name: str) -> socket.socket:
    """A follower on a socket of its own, once its first output came: closing it is a
    client going away."""
    host, port = daemon.url.removeprefix("http://").rsplit(":", 1)
    conn = socket.create_connection((host, int(port)), timeout=10)
    conn.sendall(
        f"GET /jobs/{name}/logs?follow=true HTTP/1.1\r\nHost: gpuopt\r\n".encode()
        + f"Authorization: Bearer {TOKEN}\r\n\r\n".encode()
    )
    seen = b""
    while b"step 1" not in seen:
        seen += conn.recv(4096)
    assert seen.startswith(b"HTTP/1.1 200 ")
    return conn


def try_follow(daemon: Daemon, name: str) -> httpx.Response:
    """The status and (for a refusal) the body of a follow request; the stream is closed."""
    with (
        api(daemon) as client,
        client.stream("GET", f"/jobs/{name}/logs", params={"follow": "true"}) as answer,
    ):
        if answer.status_code != 200:
            answer.read()
        return answer


def test_followers_past_the_limits_get_429_naming_them_and_a_slot_frees_when_one_leaves(
    tmp_path: Path,
) -> None:
    config = make_config(tmp_path, logs={"max_followers_per_job": 2, "max_followers": 3})
    with running(config, clock=steady_clock()) as daemon:
        for job in ("train", "eval", "other"):
            add_attempt(daemon, job, 1)
            ship(daemon, f"{job}-1", (0, "stdout", f"{job} step 1\n"))
        first = raw_follower(daemon, "train")
        second = Follower(daemon, "train")
        third: Follower | None = None
        try:
            wait_until(lambda: "step 1" in second.text)
            refused = try_follow(daemon, "train")
            assert refused.status_code == 429
            assert refused.headers["retry-after"]
            assert refused.json()["detail"] == (
                "job 'train' already has 2 followers, the limit "
                "(logs.max_followers_per_job = 2); try again once one ends"
            )
            assert logs(daemon, "train").status_code == 200  # reading without follow is not capped
            third = Follower(daemon, "eval")
            wait_until(lambda: "step 1" in third.text)
            refused = try_follow(daemon, "other")
            assert refused.status_code == 429
            assert "(logs.max_followers = 3)" in refused.json()["detail"]
            first.close()  # the client goes away: its slot frees
            wait_until(
                lambda: try_follow(daemon, "train").status_code == 200,
                what="a follower of train once one left",
            )
        finally:
            first.close()
            for follower in (second, third):
                if follower is not None:
                    follower.close()


def test_the_follower_limits_are_config_keys(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    assert (config.logs.max_followers_per_job, config.logs.max_followers) == (16, 128)
    with pytest.raises(ValueError, match="max_followers_per_job"):
        make_config(tmp_path, logs={"max_followers_per_job": 0})
