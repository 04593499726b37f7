"""The clocks: a machine's time moved by the offset its local cloud sets; the one UTC text form."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from optimizer.clock import (
    CLOCK_OFFSET_ENV,
    ManualClock,
    machine_now,
    parse_utc,
    utc_label,
    utc_text,
)


def test_a_machines_time_is_the_wall_clock_moved_by_the_offset_it_was_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wall = ManualClock(datetime(2026, 12, 1, 6, 0, tzinfo=UTC))
    monkeypatch.setattr("optimizer.clock.utc_now", wall)
    monkeypatch.delenv(CLOCK_OFFSET_ENV, raising=False)
    assert machine_now() == wall()
    monkeypatch.setenv(CLOCK_OFFSET_ENV, "-22615200.25")  # back to 2026-03-14 12:00 and a bit
    assert machine_now() == datetime(2026, 3, 14, 11, 59, 59, 750000, tzinfo=UTC)
    wall.advance(seconds=90)
    assert machine_now() == datetime(2026, 3, 14, 12, 1, 29, 750000, tzinfo=UTC)
    monkeypatch.setenv(CLOCK_OFFSET_ENV, "soon")
    with pytest.raises(ValueError, match="GPUOPT_CLOCK_OFFSET_S='soon' is not a number"):
        machine_now()


def test_utc_text_writes_each_form_the_wire_used_before_it() -> None:
    at = datetime(2026, 3, 14, 12, 3, 7, 250123, tzinfo=UTC)
    assert utc_text(at) == "2026-03-14T12:03:07.250123Z"  # events, API, files
    assert utc_text(at.replace(microsecond=0)) == "2026-03-14T12:03:07Z"
    assert utc_text(at, timespec="seconds") == at.strftime("%Y-%m-%dT%H:%M:%SZ")  # FOCUS, IMDS
    assert utc_text(at, timespec="milliseconds") == "2026-03-14T12:03:07.250Z"  # the agent
    assert utc_text(at, timespec="seconds", sep=" ") == "2026-03-14 12:03:07Z"
    assert utc_label(at) == at.strftime("%Y-%m-%d %H:%M:%S UTC")  # the console, Slack


def test_utc_text_converts_another_zone_and_refuses_a_naive_time() -> None:
    paris = datetime(2026, 3, 14, 13, 3, 7, tzinfo=timezone(timedelta(hours=1)))
    assert utc_text(paris) == "2026-03-14T12:03:07Z"
    assert utc_label(paris) == "2026-03-14 12:03:07 UTC"
    with pytest.raises(ValueError, match="naive datetime"):
        utc_text(datetime(2026, 3, 14, 12, 3, 7))


# Hand-written UTC text: `.replace("+00:00", "Z")` after isoformat, or a strftime pattern ending
# in `Z` or ` UTC`. Parsing (`.replace("Z", "+00:00")`) is not formatting.
HAND_WRITTEN = re.compile(r"""replace\(\s*["']\+00:00["']|strftime\(\s*["'][^"']*(Z|UTC)["']""")
ROOT = Path(__file__).resolve().parents[1]
# Files the rule rework owns (issue 28, item 3); they move to `utc_text` with it.
NOT_YET: set[str] = set()


def test_utc_text_is_written_in_one_place() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for top in ("optimizer", "providers", "policies")
        for path in sorted((ROOT / top).rglob("*.py"))
        if path.relative_to(ROOT).as_posix() not in {"optimizer/clock.py", *NOT_YET}
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if HAND_WRITTEN.search(line)
    ]
    assert found == []


def test_the_hand_written_pattern_is_caught() -> None:
    assert HAND_WRITTEN.search('    return at.isoformat().replace("+00:00", "Z")')
    assert HAND_WRITTEN.search('when.strftime("%Y-%m-%d %H:%M:%S UTC")')
    assert not HAND_WRITTEN.search('datetime.fromisoformat(raw.replace("Z", "+00:00"))')


def test_parse_utc_reads_back_what_utc_text_wrote_and_keeps_any_other_offset() -> None:
    at = datetime(2026, 3, 14, 12, 3, 7, 250123, tzinfo=UTC)
    for form in (
        utc_text(at),
        utc_text(at, timespec="seconds"),
        utc_text(at, timespec="milliseconds"),
        utc_text(at, timespec="seconds", sep=" "),
    ):
        back = parse_utc(form)
        assert back.utcoffset() == timedelta(0)
        assert at - back < timedelta(seconds=1)
    assert parse_utc(utc_text(at)) == at
    paris = parse_utc("2026-03-14T13:03:07+01:00")
    assert paris == datetime(2026, 3, 14, 12, 3, 7, tzinfo=UTC)
    assert paris.utcoffset() == timedelta(hours=1)  # the offset it was written with
    # No offset: naive, for the caller to read as UTC or refuse.
    assert parse_utc("2026-03-14T12:03:07").tzinfo is None
    assert parse_utc("2026-03-14") == datetime(2026, 3, 14)
    for bad in ("", "soon", "2026-13-01T00:00:00Z", "2026-03-14T12:03:07 UTC"):
        with pytest.raises(ValueError):
            parse_utc(bad)


# Hand-written UTC parsing: `fromisoformat` called directly, or the `Z` rewritten to `+00:00`.
HAND_PARSED = re.compile(r"""fromisoformat\(|replace\(\s*["']Z["']\s*,\s*["']\+00:00["']""")


def test_utc_text_is_read_in_one_place() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for top in ("optimizer", "providers", "policies")
        for path in sorted((ROOT / top).rglob("*.py"))
        if path.relative_to(ROOT).as_posix() != "optimizer/clock.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if HAND_PARSED.search(line)
    ]
    assert found == []


def test_the_hand_parsed_pattern_is_caught() -> None:
    assert HAND_PARSED.search('datetime.fromisoformat(raw.replace("Z", "+00:00"))')
    assert HAND_PARSED.search("when = datetime.fromisoformat(text)")
    assert HAND_PARSED.search("raw.replace('Z', '+00:00')")
    assert not HAND_PARSED.search("when = parse_utc(text)")
