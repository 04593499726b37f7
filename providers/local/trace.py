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

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_TICKS = 1_000_000  # a year of one-minute ticks, and then some


class TraceError(ValueError):
    """A trace file that cannot be followed; the message names the file and what is wrong."""


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


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int) and value >= 0:
        return value
    if isinstance(value, float) and math.isfinite(value) and value >= 0 and value.is_integer():
        return int(value)
    raise TraceError(f"{where}: {value!r} is not a count of instances (a whole number >= 0)")


def read_trace(path: Path, *, tick_s: float | None = None) -> CapacityTrace:
    """A trace file in the public format, each tick lasting `tick_s` real seconds (default:
    the trace's own `gap_seconds`)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise TraceError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise TraceError(f"{path}: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise TraceError(f'{path}: expected an object with "metadata" and "data"')
    meta, data = doc.get("metadata"), doc.get("data")
    if not isinstance(meta, dict) or "gap_seconds" not in meta:
        raise TraceError(f"{path}: metadata.gap_seconds is missing")
    gap = meta["gap_seconds"]
    if isinstance(gap, bool) or not isinstance(gap, int | float) or not (0 < gap < math.inf):
        raise TraceError(f"{path}: metadata.gap_seconds must be a number of seconds above 0")
    if not isinstance(data, list) or not data:
        raise TraceError(f"{path}: data must be a non-empty list of counts")
    if len(data) > MAX_TICKS:
        raise TraceError(f"{path}: data has {len(data)} ticks; at most {MAX_TICKS}")
    counts = tuple(_count(v, f"{path}: data[{i}]") for i, v in enumerate(data))
    if tick_s is not None and not (0 < tick_s < math.inf):
        raise TraceError(f"--tick must be a number of seconds above 0, got {tick_s:g}")
    return CapacityTrace(counts, float(tick_s if tick_s is not None else gap), path.name)


__all__ = ["MAX_TICKS", "CapacityTrace", "TraceError", "read_trace"]
