"""Where a tail begins, from the chunks' line counts alone (optimizer/api/logtail.py): checked
against cutting the whole rendered text with last_lines, over many random chunk sequences;
and the follower slots' counting (optimizer/api/followers.py)."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from optimizer.api.followers import FollowerSlots, TooManyFollowers
from optimizer.api.logs import Renderer, count_lines, last_lines
from optimizer.api.logtail import skip_newlines, tail_cut
from optimizer.store.logs import ChunkLines, LogChunk

AT = datetime(2026, 1, 1, tzinfo=UTC)
PIECES = ["", "\n", "a", "é\n", "😀", "line\n", "\r50%", "x\ny", "\n\n", "日本\n語"]


def shape(chunk: LogChunk) -> ChunkLines:
    text = chunk.text
    return ChunkLines(chunk.seq, chunk.stream, text.count("\n"), text.endswith("\n"), not text)


def random_chunks(rng: random.Random) -> list[LogChunk]:
    return [
        LogChunk(1, seq, rng.choice(["stdout", "stderr"]), AT, "".join(rng.choices(PIECES, k=3)))
        for seq in range(rng.randint(1, 12))
    ]


@pytest.mark.parametrize("seed", range(300))
def test_the_cut_from_line_counts_gives_what_last_lines_gives(seed: int) -> None:
    rng = random.Random(seed)
    chunks = random_chunks(rng)
    whole = Renderer().body(chunks)
    for n in range(1, whole.count("\n") + 3):
        cut = tail_cut([shape(c) for c in chunks], n)
        expected = last_lines(whole, n)
        if cut.empty:
            assert expected == ""
            continue
        # Rendered from the start chunk on, with the state the chunks before it left.
        render = Renderer(stream=cut.stream, at_line_start=cut.at_line_start)
        text, left = skip_newlines(render.body(chunks[cut.start :]), cut.skip)
        assert (text, left) == (expected, 0), (seed, n)
        assert cut.lines == count_lines(expected)


def test_skipping_newlines_says_how_many_are_left_for_the_next_page() -> None:
    assert skip_newlines("a\nb\nc", 1) == ("b\nc", 0)
    assert skip_newlines("a\nb", 3) == ("", 2)  # two more to skip in the next page
    assert skip_newlines("abc", 0) == ("abc", 0)


def test_follower_slots_count_per_job_and_in_all_and_free_once() -> None:
    slots = FollowerSlots(per_job=2, total=3)
    a1, a2 = slots.take(1, "a"), slots.take(1, "a")
    with pytest.raises(TooManyFollowers, match=r"job 'a' already has 2 followers.*= 2\)"):
        slots.take(1, "a")
    slots.take(2, "b")
    with pytest.raises(TooManyFollowers, match=r"already serves 3 log followers.*= 3\)"):
        slots.take(3, "c")
    a1.release()
    a1.release()  # given back once, however often it is called
    assert (slots.count(1), slots.count()) == (1, 2)
    slots.take(3, "c")
    a2.release()
    assert (slots.count(1), slots.count()) == (0, 2)
