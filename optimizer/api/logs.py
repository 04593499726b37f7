"""GET /jobs/{name}/logs: the output agents shipped, as text, each attempt under a header.

    ==> attempt 2 · aws us-east-1a p5.48xlarge spot · i-0abc <==

Attempts come in number order, each one's chunks in seq order (stdout and stderr interleaved
as the agent read them; a line cut short where the stream changes is ended there). `attempt`
picks one attempt; `tail` keeps the last N lines of what is picked; `follow` keeps the answer
open and streams new output as it arrives, new attempts after an interruption included
(within WAKE_S of the chunk reaching this replica, FOLLOW_POLL_S of it reaching another).

A follower stops when the job has ended and its output is complete: every attempt has
reported `job_exited` and the daemon holds the chunks it counted (`log_chunks`), or the
attempt's instance is gone, or it never started the job. Output an agent still owes after
the job ended is waited for SETTLE_S at most. With `attempt`, following ends when that
attempt's output is complete. It also ends when the client goes away (the server cancels
the stream; nothing keeps running for it) and when the daemon stops.

Every answer reads the store a page at a time (at most PAGE chunks and, past the first chunk,
PAGE_BYTES bytes of text) and writes each page before it reads the next, so what an answer
holds stays about one page however large the log; a tail is found from the chunks' line
counts (logtail.py) and then streamed the same way. At most `logs.max_followers_per_job`
followers of one job and `logs.max_followers` in all are served at once (followers.py): one
more is answered 429 naming the limit.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from optimizer.api.followers import FollowerSlot, TooManyFollowers
from optimizer.api.logtail import skip_newlines, tail_cut
from optimizer.api.state import ApiState, StateDep
from optimizer.lifecycle import TERMINAL_JOB_STATES
from optimizer.store import Store
from optimizer.store.jobs import AttemptRecord
from optimizer.store.logs import ChunkLines, LogChunk

router = APIRouter(prefix="/jobs", tags=["jobs"])

FOLLOW_POLL_S = 0.5  # how often a follower looks in the store for new output
WAKE_S = 0.05  # and how often it checks whether this replica took new output meanwhile
SETTLE_S = 10.0  # after the job ended, how long a follower waits for output still owed
PAGE = 200  # chunks read per step at most
PAGE_BYTES = 256 << 10  # and bytes of text, past the first chunk (a chunk is <= 64 Ki characters)
LINES_PAGE = 1_000  # chunks' line counts read per step while finding where a tail begins
LINES_FIRST = 32  # in the first step (then twice as many each step, up to LINES_PAGE)
MAX_TAIL = 1_000_000


def header(attempt: AttemptRecord) -> str:
    """`==> attempt 2 · aws us-east-1a p5.48xlarge spot · i-0abc <==`"""
    where = attempt.zone or attempt.region
    instance = attempt.instance_id or "no instance"
    return (
        f"==> attempt {attempt.number} · {attempt.provider} {where} {attempt.instance_type} "
        f"{attempt.market} · {instance} <=="
    )


def dropped_note(attempt: AttemptRecord) -> str:
    return (
        f"[gpuopt: {attempt.log_dropped_bytes} bytes of this attempt's earliest output were "
        "dropped to keep the job's log under logs.max_bytes_per_job]"
    )


def last_lines(text: str, n: int) -> str:
    """The last `n` lines of `text` (a final line without its newline counts as one)."""
    if n <= 0 or not text:
        return ""
    pos = len(text) - 1 if text.endswith("\n") else len(text)
    for _ in range(n):
        pos = text.rfind("\n", 0, pos)
        if pos < 0:
            return text
    return text[pos + 1 :]


def count_lines(text: str) -> int:
    return text.count("\n") + (0 if not text or text.endswith("\n") else 1)


@dataclass
class Renderer:
    """Turns chunks into the answer's text: a header when the attempt changes, a newline
    where one stream's line was cut short by the other's."""

    attempt: int | None = None  # the attempt id whose output was written last
    stream: str | None = None
    at_line_start: bool = True
    started: bool = False

    def begin(self, attempt: AttemptRecord) -> str:
        """The header of `attempt` (and its note on dropped output)."""
        out = [] if self.at_line_start else ["\n"]
        if self.started:
            out.append("\n")  # a blank line between attempts
        out.append(header(attempt) + "\n")
        if attempt.log_dropped_bytes:
            out.append(dropped_note(attempt) + "\n")
        self.attempt, self.stream, self.at_line_start, self.started = attempt.id, None, True, True
        return "".join(out)

    def text(self, attempt: AttemptRecord, chunks: Sequence[LogChunk]) -> str:
        out = [] if self.attempt == attempt.id else [self.begin(attempt)]
        out.append(self.body(chunks))
        return "".join(out)

    def note(self, text: str) -> str:
        """A line of gpuopt's own, `[gpuopt: …]`, on a line of its own."""
        out = ("" if self.at_line_start else "\n") + f"[gpuopt: {text}]\n"
        self.at_line_start = True
        return out

    def verbatim(self, attempt: AttemptRecord, text: str, stream: str) -> str:
        """Text already rendered (a tail) from `stream`, under `attempt`'s header."""
        out = "" if self.attempt == attempt.id else self.begin(attempt)
        if text:
            self.stream, self.at_line_start = stream, text.endswith("\n")
        return out + text

    def body(self, chunks: Sequence[LogChunk]) -> str:
        out = []
        for chunk in chunks:
            if not chunk.text:
                continue
            if chunk.stream != self.stream and not self.at_line_start:
                out.append("\n")
            out.append(chunk.text)
            self.stream = chunk.stream
            self.at_line_start = chunk.text.endswith("\n")
        return "".join(out)


@dataclass
class TailPart:
    """One attempt's share of a tail: its chunks in (after, upto], rendered afresh, with the
    first `skip` newlines of that text left out."""

    attempt: AttemptRecord
    after: int
    upto: int
    skip: int
    last_stream: str
    render: Renderer = field(default_factory=Renderer)
    wrote: str = ""  # the last character written of it ("" while none)


@dataclass
class LogStream:
    """One answer's worth of a job's output, read step by step (each step a bounded read of
    the store, run off the event loop). `step()` returns the next text, "" when there is none
    yet (a follower waits and asks again), None when the answer is complete."""

    store: Store
    job_id: int
    number: int | None = None  # the one attempt asked for
    tail: int | None = None
    follow: bool = False
    render: Renderer = field(default_factory=Renderer)
    cursors: dict[int, int] = field(default_factory=dict)  # attempt id -> last seq written
    caught_up: dict[int, int] = field(default_factory=dict)  # attempt id -> bytes read up to
    _began: bool = False
    _tail_parts: list[TailPart] = field(default_factory=list)  # still to write, oldest first
    _reading: tuple[AttemptRecord, int] | None = None  # read part way: (attempt, bytes shipped)
    _ended_at: float | None = None  # monotonic time the job was first seen ended

    def attempts(self) -> list[AttemptRecord]:
        found = self.store.jobs.attempts(self.job_id)
        return [a for a in found if self.number is None or a.number == self.number]

    def step(self) -> str | None:
        text = ""
        if not self._began:
            self._began = True
            text = self._start()
        while self._tail_parts:  # a page whose lines are all skipped gives nothing: read on
            text += self._tail_page()
            if text:
                return text
        text += self._read_new()
        if text:
            return text
        if not self.follow or self._finished():
            return None
        return ""

    def _start(self) -> str:
        attempts = self.attempts()
        out = ""
        if self.number is not None and attempts:  # asked for by number: its header at once
            out = self.render.begin(attempts[0])
        if self.tail is not None:
            self._plan_tail(attempts)
        return out

    def _page(
        self, attempt_id: int, after: int, upto: int | None = None
    ) -> tuple[list[LogChunk], bool]:
        page = self.store.logs.page(
            attempt_id, after_seq=after, upto_seq=upto, max_chunks=PAGE, max_bytes=PAGE_BYTES
        )
        return page.chunks, page.more

    def _read_new(self) -> str:
        """What arrived past the cursors, up to one page of one attempt (an attempt read part
        way is read on without asking the store for the job's attempts again)."""
        if self._reading is not None:
            text = self._read_attempt(*self._reading)
            if text:
                return text
        for attempt in self.attempts():
            shipped = attempt.log_bytes + attempt.log_dropped_bytes  # grows with every chunk
            if self.caught_up.get(attempt.id) == shipped:
                continue
            text = self._read_attempt(attempt, shipped)
            if text:
                return text
        return ""

    def _read_attempt(self, attempt: AttemptRecord, shipped: int) -> str:
        """The next page of `attempt` past its cursor ("" when it has no more)."""
        self._reading = None
        while True:  # pages of empty chunks give no text: read on
            chunks, more = self._page(attempt.id, self.cursors.get(attempt.id, -1))
            if not more:
                self.caught_up[attempt.id] = shipped
            if chunks:
                self.cursors[attempt.id] = chunks[-1].seq
                text = self.render.text(attempt, chunks)
                if text:
                    if more:
                        self._reading = (attempt, shipped)
                    return text
            if not (chunks and more):
                return ""

    def _plan_tail(self, attempts: list[AttemptRecord]) -> None:
        """Where the last `tail` lines of what is held now begin (attempts newest first, each
        counted backwards from its chunks' line counts until it gives enough lines); the
        cursors move past all of it, and `_tail_page` writes it a page at a time."""
        last = self.store.logs.last_seqs([a.id for a in attempts])
        self.cursors.update(last)
        wanted = self.tail or 0
        parts: list[TailPart] = []
        for attempt in reversed(attempts):
            if wanted <= 0:
                break
            if attempt.id not in last:
                continue
            shapes: list[ChunkLines] = []
            newlines = 0
            before = last[attempt.id] + 1
            limit = min(LINES_FIRST, LINES_PAGE)  # a short tail needs only the last few
            while newlines <= wanted:
                page = self.store.logs.lines_before(attempt.id, before_seq=before, limit=limit)
                limit = min(limit * 2, LINES_PAGE)
                if not page:
                    break
                shapes.extend(page)
                newlines += sum(c.newlines for c in page)
                before = page[-1].seq
            if not shapes:
                continue
            shapes.reverse()
            cut = tail_cut(shapes, wanted)
            wanted -= cut.lines
            parts.append(
                TailPart(
                    attempt,
                    after=shapes[cut.start].seq - 1,
                    upto=last[attempt.id],
                    skip=cut.skip,
                    last_stream=shapes[-1].stream,
                    render=Renderer(stream=cut.stream, at_line_start=cut.at_line_start),
                )
            )
        self._tail_parts = parts[::-1]

    def _tail_page(self) -> str:
        """The next page of the tail (a header first where the attempt changes)."""
        part = self._tail_parts[0]
        out = "" if self.render.attempt == part.attempt.id else self.render.begin(part.attempt)
        chunks, more = self._page(part.attempt.id, part.after, part.upto)
        text, part.skip = skip_newlines(part.render.body(chunks), part.skip)
        if chunks:
            part.after = chunks[-1].seq
        if text:
            part.wrote = text[-1]
        if not (chunks and more):  # this attempt's share is written
            self._tail_parts.pop(0)
            if part.wrote:
                self.render.stream = part.last_stream
                self.render.at_line_start = part.wrote == "\n"
        return out + text

    def _finished(self) -> bool:
        """Whether the output followed is complete (see the module's docstring)."""
        job = self.store.jobs.get_job_by_id(self.job_id)
        attempts = self.attempts()
        ended = job is None or job.state in TERMINAL_JOB_STATES
        if self.number is None and not ended:
            return False
        reports = self.store.jobs.exit_reports(a.key for a in attempts)
        if all(self._complete(a, reports.get(a.key)) for a in attempts):
            return True
        if not ended:
            return False
        now = time.monotonic()
        if self._ended_at is None:
            self._ended_at = now
        return now - self._ended_at >= SETTLE_S

    def _complete(self, attempt: AttemptRecord, report: dict[str, Any] | None) -> bool:
        if report is not None:
            owed = report.get("log_chunks")
            if not isinstance(owed, int):  # an agent that does not count its chunks
                return True
            return self.cursors.get(attempt.id, -1) >= owed - 1
        return attempt.instance_gone or (attempt.ended and attempt.job_started_at is None)


class LogResponse(StreamingResponse):
    """A streaming answer whose generator is closed however the response ends (the client
    going away included), so its `finally` runs at once, not when it is collected; a
    follower's slot is given back then too."""

    def __init__(self, content: AsyncIterator[str], slot: FollowerSlot | None = None) -> None:
        super().__init__(content, media_type="text/plain; charset=utf-8")
        self._content = content
        self._slot = slot

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self._slot is not None:
                self._slot.release()
            aclose = getattr(self._content, "aclose", None)
            if aclose is not None:
                await aclose()


async def _quiet_spell(state: ApiState, job_id: int) -> None:
    """Wait FOLLOW_POLL_S, or less once this replica takes new output of the job (output
    another replica took is seen at the next look)."""
    seen = state.log_changes.count(job_id)
    deadline = anyio.current_time() + FOLLOW_POLL_S
    while anyio.current_time() < deadline and state.log_changes.count(job_id) == seen:
        await anyio.sleep(WAKE_S)


async def _pieces(
    stream: LogStream, state: ApiState, slot: FollowerSlot | None = None
) -> AsyncIterator[str]:
    followers = state.metrics.log_followers
    if stream.follow:
        followers.inc()
    try:
        while True:
            if state.stopping.is_set():
                if stream.follow:
                    yield stream.render.note("the daemon is stopping; follow again once it is back")
                return
            text = await run_in_threadpool(stream.step)
            if text is None:
                return
            if text:
                yield text
            else:
                await _quiet_spell(state, stream.job_id)
    finally:
        if slot is not None:
            slot.release()
        if stream.follow:
            followers.dec()


@router.get("/{name}/logs", response_class=StreamingResponse)
def job_logs(
    name: str,
    state: StateDep,
    attempt: Annotated[int | None, Query(ge=1, le=2**31 - 1, description="One attempt.")] = None,
    tail: Annotated[
        int | None, Query(ge=0, le=MAX_TAIL, description="The last N lines only.")
    ] = None,
    follow: Annotated[bool, Query(description="Stream new output until the job ends.")] = False,
) -> StreamingResponse:
    """A job's output as text, each attempt under a header; `follow=true` streams it (429
    past logs.max_followers_per_job followers of the job or logs.max_followers in all)."""
    job = state.store.jobs.get_job(name)
    if job is None:
        raise HTTPException(404, detail=f"no job named {name!r}")
    if attempt is not None:
        numbers = [a.number for a in state.store.jobs.attempts(job.id)]
        if attempt not in numbers:
            known = (
                f"its attempts: {', '.join(map(str, numbers))}"
                if numbers
                else "it has no attempts yet"
            )
            raise HTTPException(404, detail=f"job {name!r} has no attempt {attempt}; {known}")
    slot = None
    if follow:
        try:
            slot = state.followers.take(job.id, name)
        except TooManyFollowers as exc:
            raise HTTPException(429, detail=str(exc), headers={"Retry-After": "5"}) from None
    stream = LogStream(state.store, job.id, number=attempt, tail=tail, follow=follow)
    return LogResponse(_pieces(stream, state, slot), slot)
