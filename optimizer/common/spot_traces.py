"""The public spot-traces file format (github.com/skypilot-org/spot-traces), read in one place.

`{"metadata": {"gap_seconds": N, ...}, "data": [k0, k1, ...]}`: one value per tick, a tick
every `gap_seconds`. In an availability trace a value is the number of spot instances
obtainable at that tick; in a preemption trace, the number of the watched spot instances
running then. Other keys (a preemption trace's `prices`) are ignored. The deadline replay
(policies/deadline/traces.py) and the local cloud's capacity drill (providers/local/trace.py)
both read files through `read_counts`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

MAX_TICKS = 1_000_000  # a year of one-minute ticks, and then some


class TraceError(ValueError):
    """A trace that cannot be read: the message names the file and what is wrong."""


def _fail(path: Path, problem: str) -> TraceError:
    return TraceError(f"{path}: {problem}")


def read_counts(path: Path) -> tuple[float, tuple[int, ...]]:
    """A trace file's tick (`gap_seconds`) and its counts, or a TraceError naming the file
    and the field at fault."""
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
    if isinstance(gap, bool) or not isinstance(gap, int | float) or not 0 < gap < math.inf:
        raise _fail(path, f"metadata.gap_seconds: expected a positive number, got {gap!r}")
    data = raw.get("data")
    if not isinstance(data, list):
        raise _fail(path, "data: missing or not a list")
    if not data:
        raise _fail(path, "data: empty")
    if len(data) > MAX_TICKS:
        raise _fail(path, f"data: {len(data)} ticks; at most {MAX_TICKS}")
    counts: list[int] = []
    for i, value in enumerate(data):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _fail(path, f"data[{i}]: expected a count, got {value!r}")
        if not 0 <= value < math.inf or value != int(value):
            raise _fail(path, f"data[{i}]: expected a whole count >= 0, got {value!r}")
        counts.append(int(value))
    return float(gap), tuple(counts)


__all__ = ["MAX_TICKS", "TraceError", "read_counts"]
