"""Shipping the job's output to the daemon: its stdout and stderr files, cut into numbered
chunks, sent in order and retried until acknowledged.

The job writes to files (`job.log`, `job.err.log` in the agent's directory), never to a pipe
the agent holds, so a slow or absent daemon never blocks the job and an agent that dies does
not take the job's output with it. A thread looks at the files every `poll_s`, cuts what is
new into chunks of at most `chunk_bytes` and numbers them per attempt (`seq`, from 0, stdout
and stderr in one sequence, in the order they were read). A chunk ends at a line end where
one is near (`\\n`, or `\\r` as progress bars write), otherwise on a UTF-8 character boundary;
a partial line is held back until it stops growing for a look or has waited `HOLD_S`, and
shipped whole once the job has exited.

What was cut is recorded in `logs.json` before it is sent: the next seq, how far each file
was read, and each chunk not yet acknowledged as (seq, stream, byte range). A restarted agent
(one that adopts the job, or only flushes what the last one left) sends those chunks again
with the same seqs and the same bytes, and goes on from where the last one stopped: nothing
lost, and the daemon, which stores a chunk once per (attempt, seq), keeps no copy.

Sends are batched (at most BATCH_CHUNKS chunks and BATCH_BYTES bytes of output) and retried
with the agent's back-off on transport errors and 5xx/401/404/408/425/429; a batch refused as
too large (413) is sent one chunk at a time, and a chunk refused for good is dropped with an
error in the agent's log.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from optimizer import protocol
from optimizer.agent.reporter import DaemonError
from optimizer.clock import machine_now, utc_text
from optimizer.common.retry import Backoff
from optimizer.protocol import LogChunk

log = logging.getLogger(__name__)

# JSON-encoded, well under the daemon's default body limit (1 MiB); the limits are the protocol's
CHUNK_BYTES = protocol.CHUNK_BYTES
BATCH_CHUNKS = protocol.LOG_BATCH_CHUNKS
BATCH_BYTES = protocol.LOG_BATCH_BYTES
MAX_PENDING = 64  # chunks cut and not yet acknowledged; later output waits in its file
POLL_S = 0.5
HOLD_S = 2.0  # a partial line still growing is shipped after this long anyway
TOO_LARGE = 413
STREAMS = ("stdout", "stderr")


class LogClient(Protocol):
    def send_logs(self, chunks: list[dict[str, Any]]) -> list[int]: ...


@dataclass(frozen=True, slots=True)
class Cut:
    """A chunk cut from a file and not yet acknowledged: bytes [start, end) of `stream`."""

    seq: int
    stream: str
    start: int
    end: int
    at: str


def utf8_boundary(data: bytes) -> int:
    """The length of the longest prefix of `data` that does not end inside a UTF-8 character
    (all of it when its tail is not UTF-8 at all)."""
    end = len(data)
    i = end - 1  # back over up to 3 continuation bytes, to where the last character starts
    while i >= 0 and end - i < 4 and data[i] & 0xC0 == 0x80:
        i -= 1
    if i < 0:
        return end
    lead = data[i]
    if lead < 0x80:
        need = 1
    elif lead >> 5 == 0b110:
        need = 2
    elif lead >> 4 == 0b1110:
        need = 3
    elif lead >> 3 == 0b11110:
        need = 4
    else:  # a fourth continuation byte or no lead byte: not UTF-8, nothing to keep whole
        return end
    return end if end - i >= need else i


def cut_length(data: bytes, *, at_eof: bool, flush: bool) -> int:
    """How much of `data` (the unread part of a file, at most one chunk) to ship now.

    `at_eof`: `data` reaches the end of the file as it is now; `flush`: ship a partial last
    line too (the job has exited, or the line stopped growing)."""
    if not data:
        return 0
    if at_eof and flush:
        return len(data)
    line_end = max(data.rfind(b"\n"), data.rfind(b"\r"))
    if line_end >= 0:
        return line_end + 1
    if at_eof:
        return 0  # a partial line: wait for its end (or for it to stop growing)
    return utf8_boundary(data) or len(data)  # a line longer than a chunk


def now_iso() -> str:
    return utc_text(machine_now(), timespec="milliseconds")


class LogShipper:
    """Ships `files` (stream name -> path) for one attempt; `begin()` before the job starts,
    `start()` the thread, `finish()` once the job has exited, `stop()` at the end."""

    def __init__(
        self,
        files: Mapping[str, Path],
        state_path: Path,
        client: LogClient,
        attempt_key: str,
        *,
        backoff: Backoff | None = None,
        poll_s: float = POLL_S,
        chunk_bytes: int = CHUNK_BYTES,
        hold_s: float = HOLD_S,
    ) -> None:
        self.files = dict(files)
        self.state_path = state_path
        self.client = client
        self.attempt_key = attempt_key
        self.backoff = backoff or Backoff()
        self.poll_s = poll_s
        self.chunk_bytes = chunk_bytes
        self.hold_s = hold_s
        self.failures = 0
        self.last_error: str | None = None
        self.dropped = 0  # chunks the daemon refused for good
        self._active = False  # a state for this attempt exists: its job has been started
        self._seq = 0
        self._offsets = dict.fromkeys(self.files, 0)
        self._pending: list[Cut] = []
        self._seen: dict[str, tuple[int, float]] = {}  # stream -> (size, since) of a held tail
        self._one_at_a_time = False  # the daemon refused a batch as too large
        self._lock = threading.Lock()
        self._sending = threading.Lock()
        self._changed = threading.Condition()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="agent-logs", daemon=True)
        self._load()

    # --- state ---------------------------------------------------------------------------

    def _load(self) -> None:
        try:
            saved = json.loads(self.state_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.warning("could not read the log state in %s: %s", self.state_path, exc)
            return
        if not isinstance(saved, dict) or saved.get("attempt_key") != self.attempt_key:
            return  # another attempt's, on a reused directory: `begin` starts afresh
        try:
            self._seq = int(saved["seq"])
            self._offsets.update({s: int(o) for s, o in saved["offsets"].items()})
            self._pending = [Cut(*item) for item in saved["pending"]]
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            log.warning("ignoring a malformed log state in %s: %s", self.state_path, exc)
            return
        self._active = True

    def _save(self) -> None:
        body = {
            "attempt_key": self.attempt_key,
            "seq": self._seq,
            "offsets": self._offsets,
            "pending": [[c.seq, c.stream, c.start, c.end, c.at] for c in self._pending],
        }
        tmp = self.state_path.with_name(self.state_path.name + ".tmp")
        try:
            tmp.write_text(json.dumps(body), encoding="utf-8")
            os.replace(tmp, self.state_path)
        except OSError as exc:  # a full disk must not stop the job or the shipping
            log.warning("could not save the log state to %s: %s", self.state_path, exc)

    def begin(self) -> None:
        """Just before the job starts: ship its files from here on. For a file that an earlier
        attempt on this machine left, that is from its current end; an attempt already begun
        (a restarted agent) keeps its state."""
        with self._lock:
            if self._active:
                return
            self._offsets = {s: _size(p) for s, p in self.files.items()}
            self._seq, self._pending, self._active = 0, [], True
            self._save()
        self._wake.set()

    @property
    def next_seq(self) -> int:
        """How many chunks this attempt's output has been cut into so far."""
        with self._lock:
            return self._seq

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    # --- cutting ---------------------------------------------------------------------------

    def collect(self, *, final: bool = False) -> int:
        """Cut what the files hold past the last cut into chunks; the number cut. `final`:
        the job has exited, so ship partial lines and ignore the bound on pending chunks."""
        with self._lock:
            if not self._active:
                return 0
            made = 0
            for stream, path in self.files.items():
                made += self._collect_one(stream, path, final)
            if made:
                self._save()
        if made:
            self._wake.set()
        return made

    def _collect_one(self, stream: str, path: Path, final: bool) -> int:
        size = _size(path)
        offset = self._offsets.get(stream, 0)
        if size < offset:  # the file was truncated or replaced: read it from its start
            log.warning("%s shrank to %d bytes; reading it from the start", path, size)
            offset = 0
        made = 0
        now = time.monotonic()
        while offset < size and (final or len(self._pending) < MAX_PENDING):
            try:
                with path.open("rb") as f:
                    f.seek(offset)
                    data = f.read(min(self.chunk_bytes, size - offset))
            except OSError as exc:
                log.warning("could not read %s: %s", path, exc)
                break
            at_eof = offset + len(data) >= size
            held = self._seen.get(stream)
            stale = held is not None and held[0] == size and held[1] <= now
            waited = held is not None and now - held[1] >= self.hold_s
            length = cut_length(data, at_eof=at_eof, flush=final or stale or waited)
            if length == 0:
                if held is None or held[0] != size:
                    # Note the size; the tail ships at the next look if the file stays put.
                    self._seen[stream] = (size, held[1] if held else now)
                break
            self._pending.append(Cut(self._seq, stream, offset, offset + length, now_iso()))
            self._seq += 1
            offset += length
            made += 1
            self._seen.pop(stream, None)
        self._offsets[stream] = offset
        return made

    # --- sending ---------------------------------------------------------------------------

    def _batch(self) -> list[Cut]:
        with self._lock:
            batch: list[Cut] = []
            total = 0
            limit = 1 if self._one_at_a_time else BATCH_CHUNKS
            for cut in self._pending:
                size = cut.end - cut.start
                if batch and (len(batch) >= limit or total + size > BATCH_BYTES):
                    break
                batch.append(cut)
                total += size
            return batch

    def _read(self, cut: Cut) -> str:
        try:
            with self.files[cut.stream].open("rb") as f:
                f.seek(cut.start)
                data = f.read(cut.end - cut.start)
        except OSError as exc:
            log.warning("could not read back chunk %d of %s: %s", cut.seq, cut.stream, exc)
            data = b""
        return data.decode("utf-8", errors="replace")

    def _ack(self, seqs: set[int]) -> int:
        with self._lock:
            before = len(self._pending)
            self._pending = [c for c in self._pending if c.seq not in seqs]
            removed = before - len(self._pending)
            if removed:
                self._save()
        if removed:
            with self._changed:
                self._changed.notify_all()
        return removed

    def send_once(self) -> bool:
        """Send the oldest batch once; True when it went (or there was none)."""
        with self._sending:
            batch = self._batch()
            if not batch:
                return True
            body = [
                LogChunk.model_validate(
                    {"seq": c.seq, "stream": c.stream, "at": c.at, "text": self._read(c)}
                ).wire()
                for c in batch
            ]
            try:
                acked = self.client.send_logs(body)
            except DaemonError as exc:
                return self._failed(batch, exc)
            if not self._ack(set(acked) & {c.seq for c in batch}):
                self._note_failure("the daemon acknowledged none of the chunks sent")
                return False
            return True

    def _failed(self, batch: list[Cut], exc: DaemonError) -> bool:
        if exc.status == TOO_LARGE and len(batch) > 1:
            log.warning("the daemon refused %d chunks at once as too large", len(batch))
            self._one_at_a_time = True
            return True  # not a failure of the daemon: try again at once
        if exc.retryable:
            self._note_failure(str(exc))
            log.warning("sending %d log chunk(s) failed, will retry: %s", len(batch), exc)
            return False
        log.error("the daemon refused %d log chunk(s) for good, dropping them: %s", len(batch), exc)
        self.dropped += len(batch)
        self._ack({c.seq for c in batch})
        return True

    def _note_failure(self, error: str) -> None:
        self.failures += 1
        self.last_error = error
        with self._changed:
            self._changed.notify_all()

    # --- the thread ------------------------------------------------------------------------

    def start(self) -> LogShipper:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=15)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.collect()
            except Exception:  # a bug here must not end the shipping for good
                log.exception("cutting the job's output failed")
            if self.pending():
                if self.send_once():
                    self.backoff.reset()
                    continue
                self._stop.wait(self.backoff.next())
                continue
            self._wake.wait(self.poll_s)
            self._wake.clear()

    def flush(self, timeout: float, *, until_failure: bool = False) -> bool:
        """Wait until every chunk cut so far is acknowledged, at most `timeout` s; True if so.
        `until_failure`: give up at the first failed send (the daemon is unreachable: the
        caller has something better to do than wait for it)."""
        deadline = time.monotonic() + timeout
        failures = self.failures
        with self._changed:
            while self.pending():
                left = deadline - time.monotonic()
                if left <= 0 or (until_failure and self.failures > failures):
                    return False
                self._wake.set()
                self._changed.wait(min(left, 0.2))
        return True

    def finish(self, timeout: float) -> int:
        """The job has exited: cut the rest of its output, partial lines included, and give
        the thread up to `timeout` s (less at the first failed send) to deliver it. Returns
        the number of chunks the attempt's output makes (what `job_exited` reports as
        `log_chunks`, so the daemon knows when it holds all of it)."""
        self.collect(final=True)
        if self._thread.is_alive():
            self.flush(timeout, until_failure=True)
        return self.next_seq


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
