"""The one back-off helper: exponential, capped, equal jitter in [d/2, d], seeded in tests."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from optimizer.alerts import RetryConfig, backoff
from optimizer.common.retry import Backoff, backoff_delay


def test_the_lowest_and_highest_draws_are_half_and_all_of_the_doubling_delay() -> None:
    low = [backoff_delay(n, base=1, cap=8, rng=lambda: 0.0) for n in range(1, 7)]
    assert low == [0.5, 1, 2, 4, 4, 4]
    high = [backoff_delay(n, base=1, cap=8, rng=lambda: 1.0) for n in range(1, 7)]
    assert high == [1, 2, 4, 8, 8, 8]


def test_no_failure_yet_waits_as_the_first() -> None:
    assert backoff_delay(0, base=2, cap=60, rng=lambda: 0.5) == 1.5
    assert backoff_delay(-3, base=2, cap=60, rng=lambda: 0.5) == 1.5


@given(
    failures=st.integers(min_value=1, max_value=10_000),
    base=st.floats(min_value=0.001, max_value=100),
    cap=st.floats(min_value=0.001, max_value=10_000),
    draw=st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
)
def test_every_wait_lies_in_half_to_all_of_the_capped_delay(
    failures: int, base: float, cap: float, draw: float
) -> None:
    full = min(cap, base * 2 ** min(failures - 1, 32))
    wait = backoff_delay(failures, base=base, cap=cap, rng=lambda: draw)
    assert full / 2 <= wait <= full
    assert wait <= cap


def test_a_seeded_source_gives_the_same_schedule_and_others_spread_it() -> None:
    def schedule(seed: int) -> list[float]:
        rng = random.Random(seed).random
        return [backoff_delay(n, base=1, cap=30, rng=rng) for n in range(1, 8)]

    assert schedule(7) == schedule(7)
    assert schedule(7) != schedule(8)


def test_the_counting_helper_doubles_up_to_its_cap_and_resets() -> None:
    low = Backoff(base=1, cap=8, rng=lambda: 0.0)
    assert [low.next() for _ in range(6)] == [0.5, 1, 2, 4, 4, 4]
    high = Backoff(base=1, cap=8, rng=lambda: 1.0)
    assert [high.next() for _ in range(5)] == [1, 2, 4, 8, 8]
    assert high.failures == 5
    high.reset()
    assert high.next() == 1


@pytest.mark.parametrize("attempts", [1, 3, 40])
def test_the_alert_outbox_paces_with_the_same_formula(attempts: int) -> None:
    retry = RetryConfig(base_s=5, max_s=60)
    expected = backoff_delay(attempts, base=5, cap=60, rng=random.Random(3).random)
    assert backoff(attempts, retry, random.Random(3)) == timedelta(seconds=expected)
