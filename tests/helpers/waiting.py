"""Waiting on a condition with a deadline: the one way tests wait for something to happen."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    condition: Callable[[], T], timeout: float = 10.0, what: str = "", *, interval: float = 0.005
) -> T:
    """Poll `condition` every `interval` s until it returns something truthy, and return that;
    fail after `timeout` s, naming `what` was awaited."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}")
        time.sleep(interval)
