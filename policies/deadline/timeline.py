"""The traces of one replay as integer seconds and a zones x ticks availability matrix."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from policies.deadline.traces import Trace, TraceError

if TYPE_CHECKING:
    import numpy as np
else:
    from optimizer.common.lazy import numpy as np


@dataclass(frozen=True)
class Timeline:
    zones: tuple[str, ...]  # one per trace
    gap_s: int
    up: np.ndarray  # bool [zones, ticks]: spot obtainable for the job's nodes

    @property
    def ticks(self) -> int:
        return int(self.up.shape[1])

    def up_at(self, zone: int, tick: int) -> bool:
        return 0 <= tick < self.ticks and bool(self.up[zone, tick])


def timeline(traces: Sequence[Trace], nodes: int = 1) -> Timeline:
    """The traces as zones of one replay: they must share their tick; a shorter trace has
    no spot past its end. Zones are named by the trace's zone, by its file where two traces
    share a zone."""
    if not traces:
        raise TraceError("no traces to replay")
    if nodes < 1:
        raise ValueError(f"nodes: expected >= 1, got {nodes}")
    gaps = {t.gap_s for t in traces}
    if len(gaps) > 1:
        listed = ", ".join(f"{t.name} {t.gap_s:g} s" for t in traces)
        raise TraceError(f"traces of one replay must share gap_seconds: {listed}")
    gap = traces[0].gap_s
    if gap != int(gap):
        raise TraceError(f"{traces[0].name}: metadata.gap_seconds must be whole seconds")
    seen = [t.zone for t in traces]
    zones = tuple(
        t.zone if seen.count(t.zone) == 1 else t.name.removesuffix(".json") for t in traces
    )
    width = max(len(t.counts) for t in traces)
    up = np.zeros((len(traces), width), dtype=bool)
    for i, t in enumerate(traces):
        up[i, : len(t.counts)] = np.asarray(t.counts, dtype=np.int64) >= nodes
    return Timeline(zones=zones, gap_s=int(gap), up=up)
