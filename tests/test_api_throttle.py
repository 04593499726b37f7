"""The per-address token bucket of wrong tokens (optimizer/api/throttle.py), on an injected
time: the burst, the refill, the wait it announces, and a table that stays bounded."""

from __future__ import annotations

import pytest

from optimizer.api.throttle import AuthThrottle

T = 1_800_000_000.0  # epoch seconds


def test_an_address_gets_the_burst_then_waits_for_one_refill() -> None:
    limit = AuthThrottle(burst=3, refill_s=6)
    for _ in range(3):
        assert limit.retry_after("a", T) is None
        limit.failed("a", T)
    assert limit.retry_after("a", T) == 6
    assert limit.retry_after("a", T + 4.5) == 2  # rounded up
    assert limit.retry_after("b", T) is None  # per address
    assert limit.retry_after("a", T + 6) is None
    limit.failed("a", T + 6)
    assert limit.retry_after("a", T + 6) == 6  # one refilled, one spent


def test_a_clock_that_steps_back_refills_nothing() -> None:
    limit = AuthThrottle(burst=1, refill_s=10)
    limit.failed("a", T)
    assert limit.retry_after("a", T - 3600) == 10


def test_the_table_forgets_refilled_addresses_and_keeps_at_most_its_cap() -> None:
    limit = AuthThrottle(burst=2, refill_s=1, max_addresses=100)
    for i in range(10_000):
        limit.failed(f"10.0.{i // 256}.{i % 256}", T)
    assert len(limit) == 100
    assert limit.retry_after("10.0.39.15", T) is None  # the last one: one failure of two
    assert limit.retry_after("10.0.0.0", T) is None  # the first: dropped, so never seen
    assert limit.retry_after("10.0.39.15", T + 2) is None
    assert len(limit) == 99  # refilled, forgotten


def test_nonsense_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="burst"):
        AuthThrottle(burst=0)
    with pytest.raises(ValueError, match="refill_s"):
        AuthThrottle(refill_s=0)
