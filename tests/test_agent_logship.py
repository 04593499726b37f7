"""The agent's log shipper: the job's output files cut into numbered chunks on line ends and
character boundaries, sent in order, retried while the daemon is away, and resumed by a
restarted agent without a chunk lost or sent with other bytes."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from optimizer.agent.logship import LogShipper, cut_length, utf8_boundary
from optimizer.agent.reporter import DaemonError
from optimizer.common.retry import Backoff
from tests.helpers import wait_until


class Daemon:
    """Takes chunks like the daemon does (once per seq); fails while told to."""

    def __init__(self) -> None:
        self.chunks: dict[int, dict[str, Any]] = {}
        self.conflicts: list[int] = []  # a seq sent again with other bytes
        self.posts: list[list[int]] = []
        self.down = False
        self.refuse: int | None = None  # answer this status to every post
        self.max_chunks: int | None = None  # 413 for batches with more chunks than this
        self.lock = threading.Lock()

    def send_logs(self, chunks: list[dict[str, Any]]) -> list[int]:
        with self.lock:
            self.posts.append([c["seq"] for c in chunks])
            if self.down:
                raise DaemonError("connection refused", retryable=True)
            if self.refuse is not None:
                raise DaemonError(f"{self.refuse}", retryable=False, status=self.refuse)
            if self.max_chunks is not None and len(chunks) > self.max_chunks:
                raise DaemonError("413", retryable=False, status=413)
            for chunk in chunks:
                seen = self.chunks.setdefault(chunk["seq"], chunk)
                if (seen["stream"], seen["text"]) != (chunk["stream"], chunk["text"]):
                    self.conflicts.append(chunk["seq"])
            return [c["seq"] for c in chunks]

    def output(self, stream: str) -> str:
        with self.lock:
            return "".join(
                c["text"] for _, c in sorted(self.chunks.items()) if c["stream"] == stream
            )


def shipper(tmp_path: Path, daemon: Daemon, **kwargs: Any) -> LogShipper:
    files = {"stdout": tmp_path / "job.log", "stderr": tmp_path / "job.err.log"}
    kwargs.setdefault("backoff", Backoff(base=0.01, cap=0.05))
    kwargs.setdefault("poll_s", 0.01)
    return LogShipper(files, tmp_path / "logs.json", daemon, "train/1", **kwargs)


def write(path: Path, text: str | bytes) -> None:
    with path.open("ab") as f:
        f.write(text.encode() if isinstance(text, str) else text)


def test_cuts_end_on_a_line_end_else_on_a_character_boundary() -> None:
    assert cut_length(b"a\nb\nc", at_eof=True, flush=False) == 4  # hold the partial line
    assert cut_length(b"a\nb\nc", at_eof=True, flush=True) == 5  # ... until it must go
    assert cut_length(b"10%\r20%\r3", at_eof=True, flush=False) == 8  # progress bars' \r
    assert cut_length(b"partial", at_eof=True, flush=False) == 0
    long = "é".encode() * 10
    assert cut_length(long[:7], at_eof=False, flush=False) == 6  # no line end in a chunk
    assert utf8_boundary("aé".encode()[:2]) == 1
    assert utf8_boundary("a€".encode()[:3]) == 1 and utf8_boundary("a€".encode()) == 4
    assert utf8_boundary("a😀".encode()[:4]) == 1 and utf8_boundary("a😀".encode()) == 5
    assert utf8_boundary(b"\x80\x80\x80\x80\x80") == 5  # not UTF-8: nothing to keep whole


def test_output_is_numbered_across_both_streams_and_kept_in_order(tmp_path: Path) -> None:
    daemon = Daemon()
    logs = shipper(tmp_path, daemon)
    write(tmp_path / "job.log", "before the job\n")  # left by an earlier attempt here
    logs.begin()
    write(tmp_path / "job.log", "step 1\nstep 2\n")
    write(tmp_path / "job.err.log", "warning\n")
    assert logs.collect() == 2
    write(tmp_path / "job.log", "step 3\n")
    assert logs.collect() == 1
    while logs.pending():
        assert logs.send_once()
    assert daemon.output("stdout") == "step 1\nstep 2\nstep 3\n"
    assert daemon.output("stderr") == "warning\n"
    assert [daemon.chunks[s]["stream"] for s in sorted(daemon.chunks)] == [
        "stdout",
        "stderr",
        "stdout",
    ]
    assert logs.next_seq == 3


def test_long_lines_and_multibyte_text_are_cut_without_breaking_a_character(
    tmp_path: Path,
) -> None:
    daemon = Daemon()
    logs = shipper(tmp_path, daemon, chunk_bytes=64)
    logs.begin()
    text = "ünïcödé " * 40 + "\n"  # one line of 400+ bytes, two-byte characters throughout
    write(tmp_path / "job.log", text)
    assert logs.collect() > 5
    while logs.pending():
        assert logs.send_once()
    pieces = [c["text"] for _, c in sorted(daemon.chunks.items())]
    assert "".join(pieces) == text and not any("\ufffd" in p for p in pieces)
    assert all(len(p.encode()) <= 64 for p in pieces)


def test_a_partial_line_ships_once_it_stops_growing_or_the_job_ends(tmp_path: Path) -> None:
    daemon = Daemon()
    logs = shipper(tmp_path, daemon, hold_s=3600)
    logs.begin()
    write(tmp_path / "job.log", "epoch 1: 10%")
    assert logs.collect() == 0  # it may still grow into a line
    write(tmp_path / "job.log", " 20%")
    assert logs.collect() == 0  # it did grow
    assert logs.collect() == 1  # it stood still for a look: out it goes
    write(tmp_path / "job.err.log", "bye")
    assert logs.collect(final=True) == 1  # the job exited: the rest goes at once
    while logs.pending():
        assert logs.send_once()
    assert (daemon.output("stdout"), daemon.output("stderr")) == ("epoch 1: 10% 20%", "bye")


def test_a_restarted_agent_resends_what_was_not_acknowledged_and_goes_on_from_there(
    tmp_path: Path,
) -> None:
    daemon = Daemon()
    first = shipper(tmp_path, daemon)
    first.begin()
    write(tmp_path / "job.log", "".join(f"line {i}\n" for i in range(5)))
    write(tmp_path / "job.err.log", "oops\n")
    first.collect()
    assert first.send_once()  # the first batch went
    write(tmp_path / "job.log", "line 5\n")
    first.collect()
    daemon.down = True
    assert not first.send_once()  # this one did not; then the agent died
    assert first.pending() == 1 and first.next_seq == 3

    second = shipper(tmp_path, daemon)  # the next agent, adopting the job
    second.begin()  # an attempt already begun keeps its state
    daemon.down = False
    write(tmp_path / "job.log", "line 6\n")
    second.start()
    try:
        assert second.finish(10) == 4
    finally:
        second.stop()
    assert daemon.output("stdout") == "".join(f"line {i}\n" for i in range(7))
    assert daemon.output("stderr") == "oops\n"
    assert sorted(daemon.chunks) == [0, 1, 2, 3] and daemon.conflicts == []
    assert second.pending() == 0


def test_the_daemon_being_away_delays_the_output_and_loses_none(tmp_path: Path) -> None:
    daemon = Daemon()
    daemon.down = True
    logs = shipper(tmp_path, daemon).start()
    try:
        logs.begin()
        for i in range(200):  # the job writes on, never waiting for the daemon
            write(tmp_path / "job.log", f"step {i}\n")
        wait_until(lambda: len(daemon.posts) >= 3, what="a few failed sends")
        assert daemon.chunks == {}
        assert logs.finish(0.5) >= 1  # gives up waiting at the first failure
        daemon.down = False
        assert logs.flush(10)
    finally:
        logs.stop()
    assert daemon.output("stdout") == "".join(f"step {i}\n" for i in range(200))
    assert daemon.conflicts == []


def test_a_batch_too_large_goes_one_chunk_at_a_time_and_a_refused_chunk_is_dropped(
    tmp_path: Path,
) -> None:
    daemon = Daemon()
    daemon.max_chunks = 1
    logs = shipper(tmp_path, daemon, chunk_bytes=8)
    logs.begin()
    write(tmp_path / "job.log", "aaaaaaa\nbbbbbbb\nccccccc\n")
    assert logs.collect() == 3
    while logs.pending():
        assert logs.send_once()
    assert daemon.output("stdout") == "aaaaaaa\nbbbbbbb\nccccccc\n"
    assert [len(p) for p in daemon.posts] == [3, 1, 1, 1]
    daemon.refuse = 422
    write(tmp_path / "job.log", "ddddddd\n")
    logs.collect()
    assert logs.send_once() and logs.pending() == 0 and logs.dropped == 1


@pytest.mark.parametrize("saved", ['{"attempt_key": "train/1", "seq": "x"}', "not json"])
def test_a_damaged_state_file_starts_the_attempt_afresh(tmp_path: Path, saved: str) -> None:
    (tmp_path / "logs.json").write_text(saved)
    daemon = Daemon()
    logs = shipper(tmp_path, daemon)
    logs.begin()
    write(tmp_path / "job.log", "fresh\n")
    logs.collect()
    assert logs.send_once() and daemon.output("stdout") == "fresh\n"
