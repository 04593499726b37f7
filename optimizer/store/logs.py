"""The job logs repository: the output each attempt's agent shipped, in numbered chunks.

A chunk is stored once per (attempt, seq), so a batch the agent sends again is taken again
without a copy. Each attempt row keeps two running totals: `log_bytes` (what `job_log` holds
of it) and `log_dropped_bytes` (what the per-job cap dropped), so keeping a job under its cap
costs a read of its few attempt rows, not a sum over its chunks. Past the cap the oldest
chunks go first. `prune` deletes the logs of jobs that ended long ago, in bounded batches.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, delete, func, select, update

from optimizer.lifecycle import TERMINAL_JOB_STATES
from optimizer.store.engine import Database, dialect_insert, table
from optimizer.store.engine import chunks as batches
from optimizer.store.tables import Attempt, Job, JobLog

_LOG = table(JobLog)
_ATTEMPT = table(Attempt)
_JOB = table(Job)

STREAMS = ("stdout", "stderr")
DEFAULT_MAX_BYTES_PER_JOB = 16 << 20  # logs.max_bytes_per_job's default
DEFAULT_FOLLOWERS_PER_JOB = 16  # logs.max_followers_per_job's default
DEFAULT_FOLLOWERS = 128  # logs.max_followers's default
PRUNE_BATCH = 5_000  # chunks one prune call deletes at most
_TRIM_PAGE = 1_000  # oldest chunks read per step while trimming to the cap
PAGE_ROWS = 8  # rows a page's read fetches from the database at a time


@dataclass(frozen=True, slots=True)
class NewChunk:
    """A chunk as an agent sends it: its number in the attempt, the stream, the text."""

    seq: int
    stream: str
    text: str
    at: datetime | None = None  # when the agent read it (None: when it arrived)


@dataclass(frozen=True, slots=True)
class LogChunk:
    """A stored chunk."""

    attempt_id: int
    seq: int
    stream: str
    at: datetime
    text: str


@dataclass(frozen=True, slots=True)
class LogPage:
    """Chunks read in one page, and whether more were held past them when it was read."""

    chunks: list[LogChunk]
    more: bool


@dataclass(frozen=True, slots=True)
class ChunkLines:
    """A stored chunk's shape without its text: its newlines, whether it ends with one,
    whether it is empty (what a tail counts lines with)."""

    seq: int
    stream: str
    newlines: int
    ends_with_newline: bool
    empty: bool


@dataclass(frozen=True, slots=True)
class Appended:
    """What one `append` did: the seqs now held (new or already there), how many chunks and
    bytes were new, and how many bytes of the job's oldest output the cap dropped."""

    acked: list[int]
    stored: int
    stored_bytes: int
    dropped_bytes: int


def storable(text: str) -> str:
    """`text` as both databases take it: lone surrogates (valid in JSON, not in UTF-8) and NUL
    (which PostgreSQL's text refuses) become U+FFFD."""
    return (
        text.encode("utf-8", errors="surrogatepass")
        .decode("utf-8", errors="replace")
        .replace("\0", "\ufffd")
    )


class Logs:
    """Append, read and prune the job_log table."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def append(
        self,
        *,
        job_id: int,
        attempt_id: int,
        chunks: Iterable[NewChunk],
        max_bytes_per_job: int = DEFAULT_MAX_BYTES_PER_JOB,
        at: datetime | None = None,
    ) -> Appended:
        """Store the chunks not held yet (by seq), then drop the job's oldest chunks while it
        holds more than `max_bytes_per_job` bytes. One transaction."""
        now = self._db.now(at)
        unique: dict[int, NewChunk] = {}
        for chunk in chunks:
            if chunk.stream not in STREAMS:
                raise ValueError(f"unknown stream {chunk.stream!r}; expected one of {STREAMS}")
            if chunk.seq < 0:
                raise ValueError(f"seq must be >= 0, got {chunk.seq}")
            unique.setdefault(chunk.seq, chunk)
        if not unique:
            return Appended([], 0, 0, 0)
        rows = []
        for c in unique.values():
            text = storable(c.text)
            rows.append(
                {
                    "job_id": job_id,
                    "attempt_id": attempt_id,
                    "seq": c.seq,
                    "stream": c.stream,
                    "at": self._db.now(c.at) if c.at is not None else now,
                    "text": text,
                    "nbytes": len(text.encode("utf-8")),
                }
            )
        stmt = (
            dialect_insert(self._db.dialect, _LOG)
            .values(rows)
            .on_conflict_do_nothing(index_elements=["attempt_id", "seq"])
            .returning(_LOG.c.nbytes)
        )
        with self._db.begin() as conn:
            new = [int(n) for n in conn.execute(stmt).scalars()]
            stored_bytes = sum(new)
            dropped = 0
            if new:
                conn.execute(
                    update(_ATTEMPT)
                    .where(_ATTEMPT.c.id == attempt_id)
                    .values(log_bytes=_ATTEMPT.c.log_bytes + stored_bytes)
                )
                dropped = _trim(conn, job_id, max_bytes_per_job)
        return Appended(sorted(unique), len(new), stored_bytes, dropped)

    def chunks(
        self, attempt_id: int, *, after_seq: int = -1, upto_seq: int | None = None, limit: int = 500
    ) -> list[LogChunk]:
        """The attempt's chunks with seq in (after_seq, upto_seq], in seq order, at most
        `limit` of them."""
        query = (
            select(_LOG.c.attempt_id, _LOG.c.seq, _LOG.c.stream, _LOG.c.at, _LOG.c.text)
            .where(_LOG.c.attempt_id == attempt_id, _LOG.c.seq > after_seq)
            .order_by(_LOG.c.seq)
            .limit(limit)
        )
        if upto_seq is not None:
            query = query.where(_LOG.c.seq <= upto_seq)
        with self._db.connect() as conn:
            return [LogChunk(*row) for row in conn.execute(query)]

    def page(
        self,
        attempt_id: int,
        *,
        after_seq: int = -1,
        upto_seq: int | None = None,
        max_chunks: int,
        max_bytes: int,
    ) -> LogPage:
        """The attempt's chunks with seq in (after_seq, upto_seq], in seq order: at most
        `max_chunks` of them and, past the first, at most `max_bytes` bytes of text in all (a
        reader holds one page at a time, however large the log).

        Rows are fetched a few at a time (`yield_per`: a server-side cursor on PostgreSQL,
        SQLite steps row by row) and the read stops once the budget is spent, so no more than
        PAGE_ROWS rows past it are held. The sizes are not read first on their own: SQLite
        keeps `nbytes` after the text in each row, and reading it walks the text anyway."""
        query = (
            select(
                _LOG.c.attempt_id,
                _LOG.c.seq,
                _LOG.c.stream,
                _LOG.c.at,
                _LOG.c.text,
                _LOG.c.nbytes,
            )
            .where(_LOG.c.attempt_id == attempt_id, _LOG.c.seq > after_seq)
            .order_by(_LOG.c.seq)
            .limit(max_chunks + 1)
        )
        if upto_seq is not None:
            query = query.where(_LOG.c.seq <= upto_seq)
        chunks: list[LogChunk] = []
        total = 0
        more = False
        with self._db.connect() as conn:
            result = conn.execution_options(yield_per=PAGE_ROWS).execute(query)
            try:
                for *fields, nbytes in result:
                    if chunks and (len(chunks) >= max_chunks or total + int(nbytes) > max_bytes):
                        more = True
                        break
                    chunks.append(LogChunk(*fields))
                    total += int(nbytes)
            finally:
                result.close()
        return LogPage(chunks, more)

    def chunks_before(
        self, attempt_id: int, *, before_seq: int, limit: int = 200
    ) -> list[LogChunk]:
        """The attempt's chunks with seq below `before_seq`, newest first (for a tail)."""
        query = (
            select(_LOG.c.attempt_id, _LOG.c.seq, _LOG.c.stream, _LOG.c.at, _LOG.c.text)
            .where(_LOG.c.attempt_id == attempt_id, _LOG.c.seq < before_seq)
            .order_by(_LOG.c.seq.desc())
            .limit(limit)
        )
        with self._db.connect() as conn:
            return [LogChunk(*row) for row in conn.execute(query)]

    def lines_before(
        self, attempt_id: int, *, before_seq: int, limit: int = 1_000
    ) -> list[ChunkLines]:
        """What a tail needs to know of the attempt's chunks with seq below `before_seq`,
        newest first, counted by the database: no text is read into this process."""
        text = _LOG.c.text
        query = (
            select(
                _LOG.c.seq,
                _LOG.c.stream,
                func.length(text) - func.length(func.replace(text, "\n", "")),
                func.substr(text, func.length(text), 1) == "\n",
                _LOG.c.nbytes == 0,
            )
            .where(_LOG.c.attempt_id == attempt_id, _LOG.c.seq < before_seq)
            .order_by(_LOG.c.seq.desc())
            .limit(limit)
        )
        with self._db.connect() as conn:
            return [
                ChunkLines(int(seq), stream, int(newlines), bool(ends), bool(empty))
                for seq, stream, newlines, ends, empty in conn.execute(query)
            ]

    def last_seqs(self, attempt_ids: Sequence[int]) -> dict[int, int]:
        """The highest seq held of each attempt (attempts with no chunk left out)."""
        if not attempt_ids:
            return {}
        query = (
            select(_LOG.c.attempt_id, func.max(_LOG.c.seq))
            .where(_LOG.c.attempt_id.in_(list(attempt_ids)))
            .group_by(_LOG.c.attempt_id)
        )
        with self._db.connect() as conn:
            return {int(a): int(s) for a, s in conn.execute(query)}

    def prune(self, *, ended_before: datetime, limit: int = PRUNE_BATCH) -> int:
        """Delete up to `limit` chunks of jobs that ended (succeeded, failed, cancelled) before
        `ended_before`; returns how many went (fewer than `limit`: nothing more to prune)."""
        cutoff = self._db.now(ended_before, "ended_before")
        old_jobs = select(_JOB.c.id).where(
            _JOB.c.state.in_(sorted(TERMINAL_JOB_STATES)), _JOB.c.updated_at < cutoff
        )
        ids = select(_LOG.c.id).where(_LOG.c.job_id.in_(old_jobs)).order_by(_LOG.c.id).limit(limit)
        with self._db.begin() as conn:
            doomed = list(conn.execute(ids).scalars())
            gone = _delete(conn, doomed)
            for attempt_id, nbytes in gone.items():
                conn.execute(
                    update(_ATTEMPT)
                    .where(_ATTEMPT.c.id == attempt_id)
                    .values(log_bytes=_ATTEMPT.c.log_bytes - nbytes)
                )
        return len(doomed)


def _delete(conn: Connection, ids: Sequence[int]) -> dict[int, int]:
    """Delete these chunks; the bytes each attempt lost (only rows this call deleted count,
    so two writers trimming at once never count one chunk twice)."""
    lost: dict[int, int] = defaultdict(int)
    for part in batches(ids, 5_000):
        stmt = delete(_LOG).where(_LOG.c.id.in_(part)).returning(_LOG.c.attempt_id, _LOG.c.nbytes)
        for attempt_id, nbytes in conn.execute(stmt):
            lost[int(attempt_id)] += int(nbytes)
    return lost


def _trim(conn: Connection, job_id: int, cap: int) -> int:
    """Drop the job's oldest chunks while it holds more than `cap` bytes; bytes dropped."""
    held = conn.execute(
        select(func.coalesce(func.sum(_ATTEMPT.c.log_bytes), 0)).where(_ATTEMPT.c.job_id == job_id)
    ).scalar_one()
    excess = int(held) - cap
    if excess <= 0:
        return 0
    doomed: list[int] = []
    after = 0
    while excess > 0:
        page = conn.execute(
            select(_LOG.c.id, _LOG.c.nbytes)
            .where(_LOG.c.job_id == job_id, _LOG.c.id > after)
            .order_by(_LOG.c.id)
            .limit(_TRIM_PAGE)
        ).all()
        if not page:
            break
        for row_id, nbytes in page:
            doomed.append(int(row_id))
            excess -= int(nbytes)
            after = int(row_id)
            if excess <= 0:
                break
    lost = _delete(conn, doomed)
    for attempt_id, nbytes in lost.items():
        conn.execute(
            update(_ATTEMPT)
            .where(_ATTEMPT.c.id == attempt_id)
            .values(
                log_bytes=_ATTEMPT.c.log_bytes - nbytes,
                log_dropped_bytes=_ATTEMPT.c.log_dropped_bytes + nbytes,
            )
        )
    return sum(lost.values())
