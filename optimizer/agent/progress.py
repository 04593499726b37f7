"""The agent's side of the progress convention (docs/progress.md): tail the job's progress
file and queue its newest report as a `progress` event.

The job appends JSON lines to `$GPUOPT_PROGRESS_FILE`; every `poll_s` the tail reads the
complete lines written since, keeps the newest good report and, when it differs from the
last one queued, queues it (the queue keeps only the newest unsent one, so a job that reports
every step costs one event per send). A malformed line is skipped with a warning (one log
line each for the first few, then one per thousand); nothing here stops the job or the agent.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from optimizer.agent.reporter import EventQueue
from optimizer.progress import MAX_LINE_BYTES, ProgressLineError, Report, parse_line
from optimizer.protocol import PROGRESS_EVENT

log = logging.getLogger(__name__)

# A file met for the first time (an agent that restarted beside a running job) is read from
# this far before its end: the newest report is near the end, and the file may be large.
TAIL_BYTES = 64 * 1024
READ_BYTES = 1 << 20  # at most this much is read per poll
WARN_FIRST, WARN_EVERY = 10, 1000  # a job that writes only bad lines is not a log flood


class ProgressTail:
    """Reads the job's progress file and queues its newest report (module docstring)."""

    def __init__(self, path: Path, queue: EventQueue, *, poll_s: float = 2.0) -> None:
        self.path = path
        self.queue = queue
        self.poll_s = poll_s
        self.skipped = 0  # malformed lines so far
        self.sent: Report | None = None
        self._offset: int | None = None  # None: not read yet
        self._partial = b""  # a line the job has not finished writing
        self._lines = 0  # complete lines read (line numbers, counted from where reading began)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> ProgressTail:
        self._thread = threading.Thread(target=self._loop, name="progress-tail", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread, then read what the job wrote last (its final report goes out
        before the job's exit)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.poll()

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.poll()

    def poll(self) -> Report | None:
        """Read the new lines; queue the newest good report if it is new. Returns it."""
        with self._lock:
            try:
                newest = self._read()
            except OSError as exc:  # a file the job removed or cannot be read: try again
                log.debug("cannot read the progress file %s: %s", self.path, exc)
                return None
            if newest is not None and newest != self.sent:
                self.queue.put(PROGRESS_EVENT, newest.to_data())
                self.sent = newest
            return newest

    def _read(self) -> Report | None:
        if not self.path.exists():
            return None
        with self.path.open("rb") as f:
            size = f.seek(0, 2)
            if self._offset is None or size < self._offset:
                # First read, or the file was replaced by a shorter one: from near its end.
                self._offset = max(size - TAIL_BYTES, 0)
                self._partial = b""
                if self._offset > 0:
                    f.seek(self._offset - 1)
                    if f.read(1) != b"\n":
                        self._partial = b"\0"  # mid-line: the rest of that line is dropped
            f.seek(self._offset)
            data = f.read(READ_BYTES)
        self._offset += len(data)
        data = self._partial + data
        *complete, self._partial = data.split(b"\n")
        if len(self._partial) > MAX_LINE_BYTES:  # no end in sight: not a report
            self._bad(self._lines + 1, "longer than 4096 bytes")
            self._partial = b"\0"
        newest: Report | None = None
        for raw in complete:
            self._lines += 1
            if raw.startswith(b"\0"):  # the tail of a line cut where reading began
                continue
            text = raw.decode("utf-8", "replace").strip()
            if not text:
                continue
            try:
                newest = parse_line(text)
            except ProgressLineError as exc:
                self._bad(self._lines, str(exc))
        return newest

    def _bad(self, number: int, why: str) -> None:
        self.skipped += 1
        if self.skipped <= WARN_FIRST or self.skipped % WARN_EVERY == 0:
            log.warning(
                "skipped malformed line %d of the progress file %s (%s; %d skipped so far): "
                'expected {"step": N, "total": M}',
                number,
                self.path,
                why,
                self.skipped,
            )
