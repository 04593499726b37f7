"""Spot traces in the public format of the Can't Be Late traces (docs/deadlines.md).

One JSON file per zone, named `<zone>_<gpu>_<count>.json`:
`{"metadata": {"gap_seconds": N}, "data": [k0, k1, ...]}`. In an availability trace each
value is the number of spot instances obtainable at that tick; in a preemption trace, the
number of the watched spot instances running at that tick (same reading: a job of n nodes
has spot at a tick where the value is >= n). Other keys (a preemption trace's `prices`) are
ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from optimizer.common.spot_traces import TraceError, read_counts


@dataclass(frozen=True)
class Trace:
    name: str  # the file name
    zone: str  # the file name up to its first "_"
    gap_s: float  # seconds between two ticks
    counts: tuple[int, ...]  # spot instances obtainable at each tick


def read_trace(path: Path) -> Trace:
    """One trace file (the format is read by `optimizer.common.spot_traces`)."""
    gap, counts = read_counts(path)
    stem = path.name.removesuffix(".json")
    zone = stem.split("_", 1)[0] or stem
    return Trace(name=path.name, zone=zone, gap_s=gap, counts=counts)


def read_traces(path: Path) -> list[Trace]:
    """A trace file, or every `*.json` of a folder (sorted by name)."""
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix == ".json" and p.is_file())
        if not files:
            raise TraceError(f"{path}: no *.json trace files in this folder")
        return [read_trace(p) for p in files]
    if not path.exists():
        raise TraceError(f"{path}: no such file or folder")
    return [read_trace(path)]


__all__ = ["Trace", "TraceError", "read_trace", "read_traces"]
