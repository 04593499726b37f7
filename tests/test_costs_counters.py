"""The ledger's cumulative totals for the Prometheus counters (optimizer/jobs/counters.py):
they only grow while attempts run, end, are reported and frozen, and end at the frozen lines'
figures; on SQLite and PostgreSQL. Figures are computed by hand beside them."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest

from optimizer.daemon.policies import PolicyRegistry
from optimizer.daemon.spend import COUNTERS, CostCollector
from optimizer.jobs.counters import Cumulative, cumulative
from optimizer.jobs.ledger import Ledger
from optimizer.model import Market
from optimizer.store import Store
from tests.helpers.costs import T0, at, attempt, observe

SPOT = ("team", "aws", "spot")
ON_DEMAND = ("team", "aws", "on_demand")


def launch(store: Store, job: str, launched: datetime, **pool: Any) -> str:
    """A job's first attempt on the base pool (AWS g5.xlarge in use1-az1, $0.40/h spot),
    its instance launched at `launched`."""
    return attempt(store, job, launched=launched, **pool)


def end(store: Store, key: str, ended: datetime, **values: Any) -> None:
    store.jobs.update_attempt(key, ended_at=ended, state="ended", instance_gone=True, **values)


def test_the_totals_only_grow_as_attempts_run_end_and_freeze(store: Store) -> None:
    # spot: $0.40/h at the launch, $0.60/h from minute 20, $0.30/h from minute 100;
    # on-demand in the zone: $1.00/h throughout
    observe(store, at(20), 0.60)
    observe(store, at(100), 0.30)
    observe(store, T0 - timedelta(days=1), 1.00, market=Market.ON_DEMAND)
    ledger = Ledger(store)
    # minute -> what happens then, as the daemon would record it
    script: dict[int, Callable[[], None]] = {
        0: lambda: (launch(store, "long", at(0)), launch(store, "short", at(0))),
        # the cloud interrupts "short" at minute 50 (inside AWS's free first hour);
        # gpuopt notices at 55 and the provider's termination time comes with it
        55: lambda: end(store, "short-1", at(55), terminated_at=at(50), terminated_by="cloud"),
        30: lambda: launch(store, "steady", at(30), market=Market.ON_DEMAND, usd_per_hour=1.00),
        # the agent reports the job started at minute 32, a minute late
        35: lambda: store.jobs.update_attempt("steady-1", job_started_at=at(32)),
        # gpuopt ends "long" at 150; the provider's termination time (148) comes at 160
        150: lambda: end(store, "long-1", at(150)),
        160: lambda: store.jobs.update_attempt(
            "long-1", terminated_at=at(148), terminated_by="gpuopt"
        ),
        200: lambda: end(store, "steady-1", at(200), terminated_at=at(200)),
    }
    seen: dict[tuple[str, tuple[str, str, str]], float] = {}
    figures: dict[int, dict[tuple[str, str, str], Cumulative]] = {}
    for minute in range(0, 241, 5):
        if minute in script:
            script[minute]()
        ledger.freeze(at(minute))  # the reconcile pass's last step
        totals = cumulative(store, at(minute))
        figures[minute] = totals
        for key, value in totals.items():
            for field in COUNTERS:
                now = getattr(value, field)
                before = seen.get((field, key), 0.0)
                assert now >= before - 1e-12, (minute, key, field, before, now)
                seen[(field, key)] = now
    # minute 65: "long" is inside the free hour plus the 10-minute settling, so it counts
    # nothing yet; "short" is final: free, its 50 minutes' baseline counted as savings
    assert figures[65][SPOT] == Cumulative(on_demand_usd=50 / 60, savings_usd=50 / 60)
    # minute 75: "long" counts to minute 65: 20 min at 0.40 and 45 at 0.60
    assert figures[75][SPOT].spend_usd == pytest.approx(0.40 * 20 / 60 + 0.60 * 45 / 60)
    # minute 45: "steady" (on-demand, no credit) counts 30 to 35 at $1.00/h, the job's start
    # at 32 (reported at 35) inside it: 2 minutes of overhead
    assert figures[45][ON_DEMAND].spend_usd == pytest.approx(5 / 60)
    assert figures[45][ON_DEMAND].overhead_usd == pytest.approx(2 / 60)
    final = figures[240]
    # everything is frozen: the counters are the frozen lines
    assert store.costs.unfrozen() == []
    # "long": 0-20 at 0.40, 20-100 at 0.60, 100-148 at 0.30; "short" refunded (0)
    spend = 0.40 * 20 / 60 + 0.60 * 80 / 60 + 0.30 * 48 / 60
    baseline = 148 / 60 + 50 / 60  # both at on-demand's $1.00/h, the credit included
    assert final[SPOT].spend_usd == pytest.approx(spend)
    assert final[SPOT].on_demand_usd == pytest.approx(baseline)
    assert final[SPOT].savings_usd == pytest.approx(baseline - spend)
    assert final[ON_DEMAND].spend_usd == pytest.approx(170 / 60)
    assert final[ON_DEMAND].savings_usd == pytest.approx(0.0, abs=1e-9)
    # its job ran from 32 to the termination (no exit reported): 2 minutes of overhead
    assert final[ON_DEMAND].overhead_usd == pytest.approx(2 / 60)
    frozen = ledger.total(market="spot", now=at(240))
    assert final[SPOT].spend_usd == pytest.approx(frozen.spend_usd)


def test_frozen_totals_survive_downsampling_and_a_removed_job(store: Store) -> None:
    observe(store, T0 - timedelta(days=1), 1.00, market=Market.ON_DEMAND)
    key = launch(store, "done", at(0))
    end(store, key, at(90), terminated_at=at(90), terminated_by="gpuopt")
    Ledger(store).freeze(at(200))
    before = cumulative(store, at(200))
    assert before[SPOT].spend_usd == pytest.approx(0.60)  # 90 min at the launch price
    with store.engine.begin() as conn:  # every price point gone (pruned past retention)
        conn.exec_driver_sql("DELETE FROM price_history")
    job = store.jobs.get_job("done")
    assert job is not None
    store.jobs.transition_job(
        job.id, expected="pending", state="succeeded", reason="done", at=at(100)
    )
    assert store.jobs.remove_job("done", at=at(300)) is not None  # gpuopt jobs rm
    assert cumulative(store, at(60 * 24 * 40)) == before


def test_the_exposed_counter_holds_when_the_savings_dip(store: Store) -> None:
    # on-demand $1.00/h; the spot price climbs to $3.00/h from minute 120
    observe(store, T0 - timedelta(days=1), 1.00, market=Market.ON_DEMAND)
    observe(store, at(120), 3.00)
    launch(store, "pricey", at(0))
    collector = CostCollector(store, PolicyRegistry(), lambda: at(130), ttl_s=0)

    def exposed(name: str) -> float:
        for family in collector.collect():
            for sample in family.samples:
                if sample.name == name and sample.labels["market"] == "spot":
                    return float(sample.value)
        raise AssertionError(f"{name} not exposed")

    collector.refresh(at(130))  # counted to 120: 2 h at 0.40 against 2 h at 1.00
    assert exposed("gpuopt_savings_usd_total") == pytest.approx(2 * (1.00 - 0.40))
    collector.refresh(at(190))  # to 180: another hour at 3.00 against 1.00
    assert cumulative(store, at(190))[SPOT].savings_usd == pytest.approx(1.20 - 2.00)
    assert exposed("gpuopt_savings_usd_total") == pytest.approx(1.20)  # held, not lowered
    assert exposed("gpuopt_spend_usd_total") == pytest.approx(0.80 + 3.00)
