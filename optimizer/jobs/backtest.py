"""The policy's `migration` block inside a backtest: at each snapshot where the job's pool is
still a candidate, the daemon's own migration pass (`optimizer.jobs.migration.plan`) decides
whether the job moves anyway: back to spot, or to a pool much cheaper for long enough that
the saving pays for the restart (docs/policies.md, Migration; docs/backtest.md).

What a history cannot say is taken as the daemon takes it when it has no measurement: the
restart overhead is 10 minutes, and the expected remaining time is as long again as the job
has run so far (a backtest has no `max_duration`). Pools are never in cooldown, and the job is
the policy's only one (the disruption budget never holds it back).
"""

from __future__ import annotations

from datetime import timedelta

import numpy as np

from optimizer.jobs.migration import (
    MAX_TARGETS,
    MigrationSettings,
    Option,
    PolicyMarket,
    RunningJob,
    plan,
)
from optimizer.model import Pool
from policies import schedule
from policies.backtest import History, Market_, instant
from policies.schema import Policy

# The restart overhead the migration pass assumes without a measured one (docs/policies.md).
ASSUMED_OVERHEAD = timedelta(minutes=10)
# Candidates ranked above the job's pool offered to the pass at each snapshot.
MAX_OPTIONS = 4 * MAX_TARGETS


class Migrations:
    """A `policies.backtest.Mover` that asks the migration pass (module docstring)."""

    def __init__(self, policy: Policy, history: History) -> None:
        self.policy = policy
        offers = history.pools.offers
        self.pools: list[Pool] = [o.pool for o in offers]
        self.moved_at: list[int] = []

    def __call__(
        self, found: Market_, snapshot: int, pool: int, placed: int, first_start: int
    ) -> int | None:
        now_s = int(found.times[snapshot])
        now = instant(now_s)
        settings = MigrationSettings.of(schedule.effective(self.policy, now))
        if not settings.enabled:
            return None
        ran = now_s - first_start
        if now_s - placed < settings.min_runtime.total_seconds():
            return None  # the guard would hold it: skip building the pass's inputs
        # The candidates that score at least as well as the job's pool, best first (ties by
        # pool row: the engine's full tie-break is not kept per snapshot).
        score = found.score[snapshot]
        above = np.flatnonzero(np.isfinite(score) & (score <= score[pool]))
        ranked = sorted(above[above != pool].tolist(), key=lambda i: (score[i], i))[:MAX_OPTIONS]
        if not ranked:
            return None
        options = [Option(self.pools[i], float(found.price[snapshot, i])) for i in ranked]
        options.append(Option(self.pools[pool], float(found.price[snapshot, pool])))
        start = now_s - settings.lookback.total_seconds()
        first = max(int(np.searchsorted(found.times, start, side="right")) - 1, 0)
        history = {
            self.pools[i]: [
                (instant(t), float(p))
                for t, p in zip(
                    found.times[first : snapshot + 1].tolist(),
                    found.price[first : snapshot + 1, i].tolist(),
                    strict=True,
                )
                if p == p  # NaN: not listed then
            ]
            for i in [*ranked, pool]
        }
        job = RunningJob(
            id=1,
            name="backtest",
            policy=self.policy.name,
            pool=self.pools[pool],
            usd_per_hour=float(found.price[snapshot, pool]),
            running_since=instant(placed),
            remaining=timedelta(seconds=max(ran, 0)),
            remaining_note="as long again as it has run",
            overhead=ASSUMED_OVERHEAD,
            overhead_note="assumed",
            moved_at=tuple(instant(t) for t in self.moved_at),
        )
        market = PolicyMarket(self.policy.name, settings, options, {}, history, {})
        moves = plan([job], {self.policy.name: market}, now).moves
        if not moves:
            return None
        self.moved_at.append(now_s)
        return self.pools.index(moves[0].targets[0])
