"""Spot capacity that follows an availability trace (`gpuopt local capacity --trace FILE`).

A trace is a file in the public spot-traces format (github.com/skypilot-org/spot-traces):
`{"metadata": {"gap_seconds": N, ...}, "data": [count, ...]}`, the number of spot instances
obtainable in one pool at each tick, one tick every `gap_seconds`. The local cloud's spot
capacity in a pool then follows the counts over time (docs/local-cloud.md): a launch there
fails with `InsufficientInstanceCapacity` while the running spot instances already fill the
count, and when the count drops below them the newest get the normal interruption notice.
`--tick` rescales one trace tick to fewer real seconds, so a drill over two days of trace
takes minutes. After the last tick the last count holds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optimizer.common.spot_traces import MAX_TICKS, TraceError, read_counts


@dataclass(frozen=True, slots=True)
class CapacityTrace:
    """Counts of obtainable spot instances, one every `tick_s` real seconds from `start`
    (epoch s on the cloud's clock; None: not started yet — the running cloud stamps it when
    it first sees the trace, as it does a pin's duration)."""

    counts: tuple[int, ...]
    tick_s: float
    source: str = ""  # the file's name, for messages
    start: float | None = None

    def index(self, now: float) -> int:
        """The tick in force at `now` (the last once the trace has run out)."""
        if self.start is None or now <= self.start:
            return 0
        return min(int((now - self.start) // self.tick_s), len(self.counts) - 1)

    def capacity(self, now: float) -> int:
        return self.counts[self.index(now)]

    @property
    def span_s(self) -> float:
        return self.tick_s * len(self.counts)

    def to_json(self) -> dict[str, Any]:
        return {
            "counts": list(self.counts),
            "tick_s": self.tick_s,
            "source": self.source,
            "start": self.start,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CapacityTrace:
        start = data.get("start")
        return cls(
            tuple(int(c) for c in data["counts"]),
            float(data["tick_s"]),
            str(data.get("source") or ""),
            None if start is None else float(start),
        )


def read_trace(path: Path, *, tick_s: float | None = None) -> CapacityTrace:
    """A trace file in the public format (read by `optimizer.common.spot_traces`), each tick
    lasting `tick_s` real seconds (default: the trace's own `gap_seconds`)."""
    gap, counts = read_counts(path)
    if tick_s is not None and not (0 < tick_s < math.inf):
        raise TraceError(f"--tick must be a number of seconds above 0, got {tick_s:g}")
    return CapacityTrace(counts, float(tick_s if tick_s is not None else gap), path.name)


__all__ = ["MAX_TICKS", "CapacityTrace", "TraceError", "read_trace"]
