"""Spot traces in the public format of the Can't Be Late traces (docs/deadlines.md).

One JSON file per zone, named `<zone>_<gpu>_<count>.json`:
`{"metadata": {"gap_seconds": N}, "data": [k0, k1, ...]}`. In an availability trace each
value is the number of spot instances obtainable at that tick; in a preemption trace, the
number of the watched spot instances running at that tick (same reading: a job of n nodes
has spot at a tick where the value is >= n). Other keys (a preemption trace's `prices`) are
ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class TraceError(ValueError):
    """A trace that cannot be read: the message names the file and what is wrong."""


@dataclass(frozen=True)
class Trace:
    name: str  # the file name
    zone: str  # the file name up to its first "_"
    gap_s: float  # seconds between two ticks
    counts: tuple[int, ...]  # spot instances obtainable at each tick


def _fail(path: Path, problem: str) -> TraceError:
    return TraceError(f"{path}: {problem}")


def read_trace(path: Path) -> Trace:
    """One trace file."""
    try:
        raw: Any = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise _fail(path, f"cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise _fail(path, "not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise _fail(path, f"line {exc.lineno}: not JSON: {exc.msg}") from None
    if not isinstance(raw, dict):
        raise _fail(path, "expected an object with `metadata` and `data`")
    metadata = raw.get("metadata")
    if not isinstance(metadata, dict) or "gap_seconds" not in metadata:
        raise _fail(path, "metadata.gap_seconds: missing")
    gap = metadata["gap_seconds"]
    if isinstance(gap, bool) or not isinstance(gap, int | float) or not gap > 0:
        raise _fail(path, f"metadata.gap_seconds: expected a positive number, got {gap!r}")
    data = raw.get("data")
    if not isinstance(data, list):
        raise _fail(path, "data: missing or not a list")
    if not data:
        raise _fail(path, "data: empty")
    counts: list[int] = []
    for i, value in enumerate(data):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _fail(path, f"data[{i}]: expected a count, got {value!r}")
        if value < 0 or value != int(value):
            raise _fail(path, f"data[{i}]: expected a whole count >= 0, got {value!r}")
        counts.append(int(value))
    stem = path.name.removesuffix(".json")
    zone = stem.split("_", 1)[0] or stem
    return Trace(name=path.name, zone=zone, gap_s=float(gap), counts=tuple(counts))


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
