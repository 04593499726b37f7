"""The clocks: a machine's time moved by the offset its local cloud sets."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from optimizer.clock import CLOCK_OFFSET_ENV, ManualClock, machine_now


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
