"""Wrong API tokens are throttled per client address: a token bucket of failures.

Each address may get `burst` tokens wrong at once, and one more every `refill_s` seconds
after that. An address whose bucket is empty is refused with 429 and a Retry-After for every
attempt, a right token included, until a failure's worth has refilled: its guesses are not
checked at all, so a guesser learns nothing faster than the refill (SECURITY.md says why a
right token does not pass). A right token from an address that is not throttled passes and
costs nothing. The bearer token of the API and the console's sign-in form share one table,
since they check the same secret.

The table is bounded: at most `max_addresses` entries, the least recently seen dropped first,
and an entry whose bucket has refilled is forgotten. Pure but for a lock: the time is an
argument (epoch seconds from the daemon's injected clock).
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass

BURST = 10  # wrong tokens an address may send at once
REFILL_S = 6.0  # then one more every 6 s: 10 a minute
MAX_ADDRESSES = 4096


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float  # when `tokens` was counted


class AuthThrottle:
    """Failed sign-ins and wrong bearer tokens per client address (module docstring)."""

    def __init__(
        self, burst: int = BURST, refill_s: float = REFILL_S, max_addresses: int = MAX_ADDRESSES
    ) -> None:
        if burst < 1 or refill_s <= 0 or max_addresses < 1:
            raise ValueError("burst and max_addresses must be at least 1, refill_s above 0")
        self.burst = burst
        self.refill_s = refill_s
        self.max_addresses = max_addresses
        self._lock = threading.Lock()
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def _level(self, bucket: _Bucket, now: float) -> float:
        # A clock that stepped back refills nothing (and takes nothing away).
        gained = max(0.0, now - bucket.at) / self.refill_s
        return min(float(self.burst), bucket.tokens + gained)

    def retry_after(self, address: str, now: float) -> int | None:
        """Whole seconds until `address` may try again; None: it may try now."""
        with self._lock:
            bucket = self._buckets.get(address)
            if bucket is None:
                return None
            level = self._level(bucket, now)
            if level >= self.burst:
                del self._buckets[address]  # refilled: the same as never seen
                return None
            if level >= 1:
                return None
            return max(1, math.ceil((1 - level) * self.refill_s))

    def failed(self, address: str, now: float) -> None:
        """Count one wrong token from `address`."""
        with self._lock:
            bucket = self._buckets.pop(address, None)
            level = float(self.burst) if bucket is None else self._level(bucket, now)
            self._buckets[address] = _Bucket(max(0.0, level - 1), now)  # most recent last
            while len(self._buckets) > self.max_addresses:
                self._buckets.popitem(last=False)
