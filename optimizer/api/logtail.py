"""Where a tail of a job's output begins, worked out from the chunks' shapes alone (how many
newlines each holds, whether it ends with one, its stream), so that the tail can then be
streamed from the store a page at a time instead of read whole and cut.

The rendered text of an attempt's chunks is their texts with a newline put in where one
stream's unfinished line is cut short by the other's (`Renderer.body` in logs.py). The last
`n` lines of it (`last_lines`) begin right after its k-th newline, k counted from the start:
`TailCut.skip`. These are pure functions over plain values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from optimizer.store.logs import ChunkLines


@dataclass(frozen=True, slots=True)
class TailCut:
    """Of the text rendered from some chunks, where its last `n` lines begin: render from
    chunk `start` on (with the stream and line state the chunks before it left, `stream` and
    `at_line_start`), skip the first `skip` newlines of that, and what follows holds `lines`
    lines (`empty`: the chunks render no text at all)."""

    start: int
    skip: int
    stream: str | None
    at_line_start: bool
    lines: int
    empty: bool


def tail_cut(chunks: Sequence[ChunkLines], n: int) -> TailCut:
    """Where the last `n` lines (n >= 1) of the text `Renderer().body` renders from `chunks`
    (in seq order) begin, as `last_lines` would cut them."""
    # Newlines rendered before each chunk, and the render state each chunk starts from.
    before: list[tuple[int, str | None, bool]] = []
    newlines = 0
    stream: str | None = None
    at_line_start = True
    written = False
    for chunk in chunks:
        before.append((newlines, stream, at_line_start))
        if chunk.empty:
            continue
        if chunk.stream != stream and not at_line_start:
            newlines += 1  # the newline put in where the other stream begins
        newlines += chunk.newlines
        stream, at_line_start, written = chunk.stream, chunk.ends_with_newline, True
    if not written or n <= 0:
        return TailCut(0, 0, None, True, lines=0, empty=True)
    # A last line without its newline counts as one of the n.
    kept_newlines = n if at_line_start else n - 1
    skip = max(newlines - kept_newlines, 0)
    lines = newlines - skip + (0 if at_line_start else 1)
    # Start at the last chunk with fewer than `skip` newlines rendered before it.
    start = 0
    for index, (count, _, _) in enumerate(before):
        if count < skip or index == 0:
            start = index
    count, start_stream, start_at_line = before[start]
    return TailCut(start, skip - count, start_stream, start_at_line, lines=lines, empty=False)


def skip_newlines(text: str, skip: int) -> tuple[str, int]:
    """`text` after its first `skip` newlines, and how many are still to skip (all of `text`
    went when it held fewer)."""
    pos = 0
    while skip > 0:
        found = text.find("\n", pos)
        if found < 0:
            return "", skip
        pos = found + 1
        skip -= 1
    return text[pos:], 0
