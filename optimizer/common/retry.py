"""The one retry pacing: exponential back-off with equal jitter.

After the n-th failure in a row (n >= 1) the full delay is `d = min(cap, base * 2**(n-1))`
and the wait is drawn uniformly from `[d/2, d]`: `d/2 + r * d/2` with `r` from the injected
random source (`[0, 1)`, `random.random` by default). Half of the delay is kept so waits
still grow when the draw is low; the other half is spread so that clients which failed
together (agents after a daemon restart, alerts after a receiver outage) do not all come back
at the same instant. Pass a seeded source (`random.Random(7).random`) or a constant
(`lambda: 0.0`) for a deterministic schedule in tests.

Callers: the agent's reporter and registration (`Backoff`, which counts the failures), the
alert outbox (`optimizer.alerts.outbox.backoff`, which stores the count with the alert) and
the instance-metadata client (`optimizer.agent.imds`).
"""

from __future__ import annotations

import random
from collections.abc import Callable

MAX_EXPONENT = 32  # past this `base * 2**n` is beyond any cap; keeps the float finite


def backoff_delay(
    failures: int, *, base: float, cap: float, rng: Callable[[], float] = random.random
) -> float:
    """Seconds to wait after the `failures`-th failure in a row, in `[d/2, d]` (see above).

    `failures` below 1 counts as 1: the first retry waits about `base`.
    """
    exponent = min(max(failures - 1, 0), MAX_EXPONENT)
    full = min(cap, base * 2**exponent)
    return full / 2 + rng() * full / 2


class Backoff:
    """`backoff_delay` for a loop that counts its own failures in a row.

    `next()` is the wait after one more failure; `reset()` after a success.
    """

    def __init__(
        self, base: float = 0.5, cap: float = 15.0, rng: Callable[[], float] = random.random
    ) -> None:
        self.base, self.cap, self.rng = base, cap, rng
        self.failures = 0

    def next(self) -> float:
        self.failures += 1
        return backoff_delay(self.failures, base=self.base, cap=self.cap, rng=self.rng)

    def reset(self) -> None:
        self.failures = 0
