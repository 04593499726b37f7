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

import math
from collections.abc import Sequence
from math import gcd
from typing import TYPE_CHECKING

from policies.deadline.timeline import timeline
from policies.deadline.traces import Trace

if TYPE_CHECKING:
    import numpy as np
else:
    from optimizer.common.lazy import numpy as np

INF = math.inf


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
    modes = 2 + zones  # 0 nothing, 1 on-demand, 2 + z spot in zone z
    price = np.array([on_demand_price] + [spot_price] * zones) * nodes / 3600  # USD/s, modes 1..
    ticks = -(-deadline // gap)
    # Two buffers, one per tick parity, padded by one tick of grid: a tick reads the next
    # only inside its band, where the next one wrote; everything below a band was never
    # written (infinite: unfinished), and nothing above a band is read.
    values = [np.full((modes, size + shift), INF), np.full((modes, size + shift), INF)]
    up = line.up
    for k in range(ticks - 1, -1, -1):
        value, fresh = values[(k + 1) % 2], values[k % 2]
        t = k * gap
        step = min(gap, deadline - t)
        lo = max(0, -(-(work - (deadline - t) + overhead) // unit))
        hi = min(size - 1, t // unit + lag)
        base = max(0, lo - lag)  # starts read the run values `lag` below the band
        if step == gap:
            runs = value[1:, base + shift : hi + 1 + shift] + (gap * price)[:, None]
        else:
            runs = np.full((modes - 1, hi + 1 - base), INF)
        # finishing inside this tick: work - q <= step; pays only the seconds it runs
        done = max(base, -(-(work - step + overhead) // unit))
        if done <= hi:
            runs[:, done - base :] = (work - q[done : hi + 1])[None, :] * price[:, None]
        tick = start_tick + k
        if tick < up.shape[1]:
            runs[1:][~up[:, tick]] = INF
        else:
            runs[1:] = INF
        # a start at q runs from q - overhead
        first = max(lo, base + lag)
        best = value[0, lo : hi + 1].copy()  # waiting
        if first <= hi:
            np.minimum(
                best[first - lo :],
                runs[:, first - lag - base : hi + 1 - lag - base].min(axis=0),
                out=best[first - lo :],
            )
        fresh[0, lo : hi + 1] = best
        np.minimum(best[None, :], runs[:, lo - base : hi + 1 - base], out=fresh[1:, lo : hi + 1])
    answer = float(values[0][0, lag])  # tick 0, nothing running, no progress
    return None if answer == INF else answer
