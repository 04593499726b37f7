"""The tick simulator every strategy is replayed with (docs/deadlines.md, "The replay").

Integer seconds. Spot in a zone is obtainable for a whole tick or not at all: a spot run
ends at the first tick boundary where its zone has none (a preemption). A strategy decides
at each tick boundary. Any start on a new instance (the first, after a preemption, a change
of market or zone) costs `overhead_s` of running time without progress; a run that ends
during its overhead loses only that time. Billing is per second, for `nodes` instances;
finishing mid-tick bills the seconds used. Beyond a trace's end there is no spot.
`optimum` (optimum.py) solves the same model knowing the future.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from policies.deadline.model import DeadlineStrategy, Situation, Use, ZoneStats
from policies.deadline.optimum import optimum
from policies.deadline.timeline import Timeline, timeline
from policies.deadline.traces import Trace

if TYPE_CHECKING:
    import numpy as np
else:
    from optimizer.common.lazy import numpy as np

__all__ = ["HISTORY_S", "Outcome", "optimum", "replay", "zone_stats"]

# What a strategy sees of each zone: the ticks of this trailing window (the job's own
# time and, where the trace has them, the days before its start, as a daemon watching the
# markets would have seen them).
HISTORY_S = 14 * 86400


@dataclass(frozen=True)
class Outcome:
    cost_usd: float
    on_demand_cost_usd: float  # the same work on on-demand from the start (one start-up)
    deadline_met: bool
    restarts: int  # starts after the first
    spot_hours: float  # billed hours (per node)
    on_demand_hours: float
    finish_s: float | None  # after the start; None: not finished by the deadline


class _Stats:
    """Per-zone window statistics from prefix sums: O(1) per zone and tick."""

    def __init__(self, line: Timeline) -> None:
        up = line.up.astype(np.int64)
        self.gap = line.gap_s
        self.zones = line.zones
        self.up_cum = np.concatenate([np.zeros((up.shape[0], 1), np.int64), up.cumsum(1)], 1)
        ends = np.zeros_like(up)
        ends[:, 1:] = (up[:, :-1] == 1) & (up[:, 1:] == 0)
        self.end_cum = np.concatenate([np.zeros((up.shape[0], 1), np.int64), ends.cumsum(1)], 1)
        # the first tick of the spell (run of equal values) each tick belongs to
        ticks = np.arange(up.shape[1])
        changed = np.zeros_like(up, dtype=bool)
        changed[:, 1:] = up[:, 1:] != up[:, :-1]
        self.since = np.maximum.accumulate(np.where(changed, ticks, 0), axis=1)
        self.last_up = up[:, -1] == 1

    def at(self, tick: int, window: int) -> dict[str, ZoneStats]:
        """What was seen over the ticks [tick - window, tick)."""
        end = min(tick, self.up_cum.shape[1] - 1)
        first = max(0, tick - window)
        start = min(first, end)
        out = {}
        width = self.since.shape[1]
        for i, z in enumerate(self.zones):
            if tick < width:
                since = int(self.since[i, tick])
            else:  # past the trace: down since its end (or since its last spell if down)
                since = width if self.last_up[i] else int(self.since[i, width - 1])
            out[z] = ZoneStats(
                observed_s=float((tick - first) * self.gap),
                available_s=float((self.up_cum[i, end] - self.up_cum[i, start]) * self.gap),
                interruptions=int(self.end_cum[i, end] - self.end_cum[i, start]),
                spell_s=float((tick - max(since, first)) * self.gap),
            )
        return out


def zone_stats(traces: Sequence[Trace], tick: int, *, nodes: int = 1) -> dict[str, ZoneStats]:
    """What a strategy would have seen of each zone by `tick` (the replay's window)."""
    line = timeline(traces, nodes)
    return _Stats(line).at(tick, HISTORY_S // line.gap_s)


def _seconds(name: str, value: float) -> int:
    if value < 0:
        raise ValueError(f"{name}: expected >= 0 seconds, got {value:g}")
    return round(value)


def replay(
    strategy: DeadlineStrategy,
    traces: Sequence[Trace],
    *,
    start_tick: int,
    work_s: float,
    deadline_s: float,
    overhead_s: float,
    spot_price: float,
    on_demand_price: float,
    nodes: int = 1,
) -> Outcome:
    """Run one job from `start_tick` with the strategy deciding at every tick."""
    line = timeline(traces, nodes)
    work, deadline, overhead = (
        _seconds("work", work_s),
        _seconds("deadline", deadline_s),
        _seconds("overhead", overhead_s),
    )
    if not 0 <= start_tick < line.ticks:
        raise ValueError(f"start tick {start_tick} is outside the trace (0..{line.ticks - 1})")
    gap = line.gap_s
    stats = _Stats(line)
    window = max(1, HISTORY_S // gap)
    index = {z: i for i, z in enumerate(line.zones)}
    running, zone = Use.WAIT, None
    overhead_left = done = spot_s = on_demand_s = 0
    starts = 0
    elapsed = 0
    finish: int | None = 0 if work == 0 else None
    tick = start_tick
    while elapsed < deadline and done < work:
        spot_now = frozenset(z for z, i in index.items() if line.up_at(i, tick))
        if running is Use.SPOT and zone not in spot_now:
            running, zone, overhead_left = Use.WAIT, None, 0  # preempted at the boundary
        situation = Situation(
            elapsed_s=float(elapsed),
            deadline_s=float(deadline),
            work_left_s=float(work - done + overhead_left),
            overhead_s=float(overhead),
            running=running,
            zone=zone,
            spot_now=spot_now,
            stats=stats.at(tick, window),
            spot_price=spot_price,
            on_demand_price=on_demand_price,
            interval_s=float(gap),
            work_s=float(work),
        )
        choice = strategy.decide(situation)
        use, where = choice.use, choice.zone
        if use is Use.SPOT and where not in spot_now:
            where = min(spot_now) if where is None and spot_now else None
            use = Use.SPOT if where is not None else Use.WAIT
        if use is not Use.SPOT:
            where = None
        if use is Use.WAIT:
            overhead_left = 0
        elif (use, where) != (running, zone):
            starts += 1
            overhead_left = overhead
        running, zone = use, where
        step = min(gap, deadline - elapsed)
        if running is not Use.WAIT:
            lost = min(overhead_left, step)
            overhead_left -= lost
            progress = min(step - lost, work - done)
            done += progress
            used = lost + progress
            if running is Use.SPOT:
                spot_s += used
            else:
                on_demand_s += used
            if done >= work:
                finish = elapsed + used
        elapsed += step
        tick += 1
    rate = nodes / 3600
    return Outcome(
        cost_usd=(spot_s * spot_price + on_demand_s * on_demand_price) * rate,
        on_demand_cost_usd=(work + overhead) * on_demand_price * rate,
        deadline_met=finish is not None and finish <= deadline,
        restarts=max(0, starts - 1),
        spot_hours=spot_s / 3600,
        on_demand_hours=on_demand_s / 3600,
        finish_s=None if finish is None else float(finish),
    )
