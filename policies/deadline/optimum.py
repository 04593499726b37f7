"""The offline optimum of the replay's model: dynamic programming over the trace, knowing
the future (docs/deadlines.md, "The optimum").

State at a tick boundary: the market running (nothing, on-demand, spot in zone z) and
q = progress - overhead still to pay, on a grid of gcd(tick, overhead, work) seconds, so
every reachable value is on the grid and the answer is exact for the model. A start sets
q to progress - overhead; running adds the seconds run. A run stopped before its overhead
is paid (by a preemption or a switch) is kept at that q, below its true progress: such a
run is never better than waiting instead, so the pessimism cannot change the minimum.
Backward over the ticks, vectorised over q; only the band of q that can still finish and
could have been reached is computed.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import gcd

import numpy as np

from policies.deadline.timeline import timeline
from policies.deadline.traces import Trace

INF = np.inf


def optimum(
    traces: Sequence[Trace],
    *,
    start_tick: int,
    work_s: float,
    deadline_s: float,
    overhead_s: float,
    spot_price: float,
    on_demand_price: float,
    nodes: int = 1,
) -> float | None:
    """The least cost (USD) that finishes the work by the deadline; None if nothing does."""
    line = timeline(traces, nodes)
    work, deadline, overhead = round(work_s), round(deadline_s), round(overhead_s)
    if not 0 <= start_tick < line.ticks:
        raise ValueError(f"start tick {start_tick} is outside the trace (0..{line.ticks - 1})")
    if work <= 0:
        return 0.0
    if work + overhead > deadline:
        return None
    gap = line.gap_s
    unit = gcd(gcd(gap, overhead), work)
    size = (work + overhead) // unit + 1  # grid index i: q = -overhead + i * unit
    q = -overhead + unit * np.arange(size, dtype=np.int64)
    shift, lag = gap // unit, overhead // unit
    zones = line.up.shape[0]
    # modes: 0 nothing, 1 on-demand, 2 + z spot in zone z; price in USD per second
    price = np.array([0.0, on_demand_price] + [spot_price] * zones) * nodes / 3600
    ticks = -(-deadline // gap)
    value = np.full((2 + zones, size), INF)  # after the last tick: unfinished
    for k in range(ticks - 1, -1, -1):
        t = k * gap
        step = min(gap, deadline - t)
        lo = max(0, -(-(work - (deadline - t) + overhead) // unit))
        hi = min(size - 1, t // unit + lag)
        if lo > hi:
            value = np.full_like(value, INF)
            continue
        base = max(0, lo - lag)  # starts read the run values `lag` below the band
        span = slice(base, hi + 1)
        need = work - q[span]
        finishing = need <= step
        ahead = np.full((2 + zones, hi + 1 - base), INF)
        if step == gap:
            idx = np.arange(base, hi + 1) + shift
            ok = idx < size
            ahead[:, ok] = value[:, idx[ok]]
        runs = np.full((2 + zones, hi + 1 - base), INF)
        up = [True, True] + [bool(line.up_at(z, start_tick + k)) for z in range(zones)]
        for m in range(1, 2 + zones):
            if up[m]:
                runs[m] = np.where(finishing, need * price[m], gap * price[m] + ahead[m])
        # a start at q runs from q - overhead
        starts = np.full(hi + 1 - lo, INF)
        src = np.arange(lo, hi + 1) - lag - base
        ok = src >= 0
        starts[ok] = runs[1:, src[ok]].min(axis=0)
        band = slice(lo - base, hi + 1 - base)
        wait = value[0, lo : hi + 1].copy()
        fresh = np.full_like(value, INF)
        fresh[0, lo : hi + 1] = np.minimum(wait, starts)
        for m in range(1, 2 + zones):
            fresh[m, lo : hi + 1] = np.minimum(np.minimum(wait, starts), runs[m, band])
        value = fresh
    best = float(value[0, lag])
    return None if best == INF else best
