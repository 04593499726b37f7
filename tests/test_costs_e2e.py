"""The cost ledger end to end on the local cloud: a real daemon, real agents, a job the cloud
interrupts twice; `gpuopt costs --by job --json` (a real process, through the API) against a
hand computation from the local cloud's own launch and termination records and the stored
price history.

The hand computation below is written out from docs/costs.md, not through optimizer.costs:
billed time from the cloud's launch to its termination with AWS's 60 s minimum (the local
cloud bills as AWS); a spot instance the cloud interrupted within its first hour bills
nothing; else the step integral of the pool's prices observed from the launch on, the launch
price before the first; the baseline is the region's on-demand series over the same seconds.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pytest_httpserver import HTTPServer

from optimizer.clock import SteadyClock
from optimizer.daemon.service import Daemon
from optimizer.model import Market
from providers.local import LocalCloud
from providers.local.state import InstanceRecord
from tests.helpers import TOKEN, api, run_gpuopt, wait_until
from tests.helpers.jobs import (
    MID_MONTH,
    e2e_cloud,
    e2e_daemon,
    job_body,
    latest_step,
    running_instance,
    running_instance_id,
    state_of,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("daemon_env")]

Points = Sequence[tuple[datetime, float]]


def when(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def step_usd(points: Points, first: float, start: datetime, end: datetime) -> float:
    """USD over [start, end) at the last price at or before each instant, `first` before any."""
    price, cursor, usd = first, start, 0.0
    for at, p in points:
        if at <= start:
            price = p
        elif at < end:
            usd += price * (at - cursor).total_seconds() / 3600
            cursor, price = at, p
    return usd + price * (end - cursor).total_seconds() / 3600


def by_hand(daemon: Daemon, record: InstanceRecord) -> dict[str, float]:
    """One attempt's billed seconds, spend and baseline from the cloud's record and the
    store's price history."""
    assert record.terminated_at is not None
    launched, terminated = when(record.launched_at), when(record.terminated_at)
    end = max(terminated, launched + timedelta(seconds=60))
    prices = daemon.store.prices
    own = prices.price_history("local", record.region, record.zone, record.instance_type, "spot")
    own = [(at, p) for at, p in own if at >= launched]  # observed from the launch on
    free = record.end_reason == "preempted" and terminated - launched < timedelta(hours=1)
    spend = 0.0 if free else step_usd(own, record.usd_per_hour, launched, end)
    # the local cloud lists on-demand per region: its zone-less series
    on_demand = prices.price_history(
        "local", record.region, None, record.instance_type, "on_demand"
    )
    assert on_demand, "the first poll recorded the on-demand list price"
    baseline = step_usd(on_demand, on_demand[0][1], launched, end)
    return {
        "billed_seconds": 0.0 if free else (end - launched).total_seconds(),
        "spend_usd": spend,
        "on_demand_usd": baseline,
    }


def observe_a_price_change(daemon: Daemon, cloud: LocalCloud, instance: str) -> None:
    """A new observation of the running instance's pool, 40% above its launch price, as a
    poll records one (the local cloud's own walk moves every 10 minutes, longer than this
    test runs): the attempt's spend must follow it from then on."""
    record = next(r for r in cloud.instances() if r.id == instance)
    listed = next(
        o
        for o in daemon.store.prices.latest_offers(provider="local", market=Market.SPOT)
        if o.pool == record.pool
    )
    now = daemon.clock()
    daemon.store.prices.record_offers(
        [replace(listed, usd_per_hour=record.usd_per_hour * 1.4, observed_at=now)]
    )


def test_a_job_interrupted_twice_costs_what_the_clouds_records_and_the_prices_say(
    tmp_path: Path, httpserver: HTTPServer
) -> None:
    clock = SteadyClock(MID_MONTH)
    with (
        e2e_cloud(tmp_path, clock) as cloud,
        e2e_daemon(tmp_path, cloud, httpserver, clock) as daemon,
    ):
        ckpt = tmp_path / "ckpt"
        with api(daemon) as client:
            assert client.post("/jobs", json=job_body("train", ckpt, steps=300)).status_code == 201
        reached = 0
        for attempt in (1, 2):
            instance = wait_until(
                lambda a=attempt: running_instance(cloud, "train", a), 30, f"attempt {attempt}"
            )
            observe_a_price_change(daemon, cloud, instance)
            wanted = reached + 20
            wait_until(lambda n=wanted: latest_step(ckpt) >= n, 60, f"a checkpoint at {wanted}")
            cloud.interrupt(instance)
            wait_until(lambda i=instance: not running_instance_id(cloud, i), 30, "the power-off")
            reached = latest_step(ckpt)
        last = wait_until(lambda: running_instance(cloud, "train", 3), 30, "attempt 3")
        observe_a_price_change(daemon, cloud, last)
        wait_until(lambda: state_of(daemon, "train")["state"] == "succeeded", 60, "the finish")
        # every attempt's termination known to the daemon, and its lines frozen
        wait_until(
            lambda: len({line.attempt_id for line in daemon.store.costs.frozen_lines()}) == 3,
            30,
            "three attempts frozen",
        )

        shown = run_gpuopt(
            tmp_path / "cli",
            "costs",
            "--by",
            "job",
            "--json",
            "--api",
            daemon.url,
            env={"GPUOPT_API_TOKEN": TOKEN},
        )
        assert shown.returncode == 0, shown.stderr
        (train,) = json.loads(shown.stdout)
        records = {r.id: r for r in cloud.instances() if r.job == "train"}
        assert train["group"] == "train" and len(train["attempts"]) == 3
        interrupted = 0
        for attempt in train["attempts"]:
            record = records[attempt["instance_id"]]
            expected = by_hand(daemon, record)
            for figure, value in expected.items():
                assert attempt[figure] == pytest.approx(value, abs=0.005), (figure, attempt, record)
                assert attempt[figure] == pytest.approx(value, rel=1e-6, abs=1e-9), figure
            launched = when(record.launched_at).isoformat().replace("+00:00", "Z")
            assert attempt["launched"] == launched
            if attempt["market"] == "spot":
                assert attempt["savings_usd"] > 0, attempt
            interrupted += record.end_reason == "preempted"
        assert interrupted == 2
        assert train["spend_usd"] == pytest.approx(sum(a["spend_usd"] for a in train["attempts"]))
        assert train["savings_usd"] > 0
