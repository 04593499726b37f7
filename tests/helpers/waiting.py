"""Waiting on a condition with a deadline: the one way tests wait for something to happen."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# A wait's timeout detects a hang; it is not a speed target. A loaded CI host (four test
# workers on two cores, each with a daemon, a local cloud and agents) can stretch what takes
# 20 s alone past a minute, so every timeout is multiplied by this (the environment
# variable GPUOPT_TEST_WAIT_SCALE sets it; 1 gives the written figures).
SCALE = float(os.environ.get("GPUOPT_TEST_WAIT_SCALE", "3"))
# Polls start at the caller's interval and back off to this: a condition met at once is seen
# at once, and a wait of a minute does not ask a daemon its job's state 200 times a second.
SLOWEST_POLL_S = 0.1


def wait_until(
    condition: Callable[[], T], timeout: float = 10.0, what: str = "", *, interval: float = 0.005
) -> T:
    """Poll `condition` until it returns something truthy, and return that; fail after
    `timeout` s (times SCALE), naming `what` was awaited. Polls come every `interval` s at
    first, then further apart, up to SLOWEST_POLL_S (or `interval`, if that is longer)."""
    deadline = time.monotonic() + timeout * SCALE
    slowest = max(interval, SLOWEST_POLL_S)
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout * SCALE:g} s waiting for {what or condition}"
            )
        time.sleep(interval)
        interval = min(interval * 1.5, slowest)
