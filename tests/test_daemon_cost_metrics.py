"""The cost ledger on a real /metrics endpoint: spend and savings counters by policy, provider
and market, and budget use, scraped from a daemon on a manual clock, across a restart.
Figures are computed by hand beside them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from optimizer.clock import ManualClock
from optimizer.daemon.config import DaemonConfig
from optimizer.daemon.service import Daemon
from optimizer.model import Market
from optimizer.store import Store
from tests.helpers import (
    api,
    make_config,
    make_offer,
    policy_text,
    running,
    wait_until,
    write_policy,
)

pytestmark = pytest.mark.usefixtures("daemon_env")

T0 = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
SPOT = {"policy": "team", "provider": "aws", "market": "spot"}
ON_DEMAND = {"policy": "team", "provider": "aws", "market": "on_demand"}


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def scrape(daemon: Daemon) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with api(daemon, token=None) as client:
        text = client.get("/metrics").text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: dict[Any, float], name: str, labels: dict[str, str]) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def attempt(store: Store, job: str, launched: datetime, **values: Any) -> str:
    """An attempt of a finished job on AWS g5.xlarge in use1-az1, spot at $0.40/h unless
    `values` say otherwise. (A reconcile pass would end a finished job's open attempt: the
    test writes them after the daemon's first pass, and asks for no other.)"""
    pool = {k: values.pop(k) for k in ("market", "usd_per_hour") if k in values}
    job_id = store.jobs.add_job(job, "team", {"run": "x"}, at=launched)
    store.jobs.transition_job(job_id, expected="pending", state="succeeded", reason="", at=launched)
    key = f"{job}-1"
    offer = make_offer(observed_at=launched, **pool)
    store.jobs.create_attempt(job_id, 1, key, offer, "sha", launched)
    store.jobs.update_attempt(key, instance_id=f"i-{key}", launched_at=launched, **values)
    return key


def seed(store: Store) -> None:
    store.prices.record_offers(
        [
            make_offer(observed_at=T0, usd_per_hour=0.40),
            make_offer(
                observed_at=T0 - timedelta(days=1), usd_per_hour=1.00, market=Market.ON_DEMAND
            ),
        ]
    )
    # ended: 90 min at $0.40/h against on-demand's $1.00/h
    attempt(
        store,
        "done",
        T0,
        ended_at=at(90),
        state="ended",
        instance_gone=True,
        terminated_at=at(90),
        terminated_by="gpuopt",
    )
    attempt(store, "steady", T0, market=Market.ON_DEMAND, usd_per_hour=1.00)  # live
    attempt(store, "fresh", at(90))  # live spot, inside AWS's free first hour at first


def config(tmp_path: Path) -> DaemonConfig:
    text = policy_text("team") + "budget: {monthly_usd: 1000}\n"
    write_policy(tmp_path / "policies", "team.yaml", text)
    return make_config(tmp_path)


def test_spend_and_savings_counters_and_budget_use_on_metrics(tmp_path: Path) -> None:
    clock = ManualClock(at(120))
    cfg = config(tmp_path)
    with running(cfg, clock=clock) as daemon:
        wait_until(lambda: daemon.reconcile.passes >= 1, what="the first reconcile pass")
        seed(daemon.store)
        first = scrape(daemon)
        # spot: "done" (0.60 spent, 1.50 on-demand); "fresh" counts nothing inside its free
        # hour. On-demand "steady" counts to 10 minutes before now: 110 min at $1.00/h.
        assert value(first, "gpuopt_spend_usd_total", SPOT) == pytest.approx(0.60)
        assert value(first, "gpuopt_on_demand_usd_total", SPOT) == pytest.approx(1.50)
        assert value(first, "gpuopt_savings_usd_total", SPOT) == pytest.approx(0.90)
        assert value(first, "gpuopt_spend_usd_total", ON_DEMAND) == pytest.approx(110 / 60)
        assert value(first, "gpuopt_savings_usd_total", ON_DEMAND) == pytest.approx(0.0, abs=1e-9)
        # month to date: 0.60 + 2 h at 1.00 + 30 min at 0.40 = 2.80; live at 1.00 + 0.40 $/h
        # for the 514 h from 2026-03-10 14:00 to April: (2.80 + 1.40 x 514) / 1000
        ratio = value(first, "gpuopt_budget_used_ratio", {"policy": "team"})
        assert ratio == pytest.approx((2.80 + 1.40 * 514) / 1000)
        # within the cache's 30 s the figures stand, even as the store changes
        attempt(daemon.store, "late", at(0), market=Market.ON_DEMAND, usd_per_hour=1.00)
        assert value(scrape(daemon), "gpuopt_spend_usd_total", ON_DEMAND) == pytest.approx(110 / 60)
        clock.advance(hours=1)
        second = scrape(daemon)
        # now 180: "steady" and "late" 170 min each; "fresh" past its free hour: 80 min
        assert value(second, "gpuopt_spend_usd_total", ON_DEMAND) == pytest.approx(2 * 170 / 60)
        assert value(second, "gpuopt_spend_usd_total", SPOT) == pytest.approx(0.60 + 0.40 * 80 / 60)
    # a restarted daemon reads the same ledger: no counter is lower than before
    with running(cfg, clock=clock) as daemon:
        again = scrape(daemon)
    counters = {key: v for key, v in second.items() if key[0].endswith("_usd_total")}
    assert len(counters) == 10  # five counters, two series each
    for key, before in counters.items():
        assert again[key] >= before - 1e-9, key
