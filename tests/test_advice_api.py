"""GET /jobs/{name}/advice on a real loopback server, and `gpuopt advise` through it: rows
written through the store's APIs (a job, its attempts, their GPU samples, the offers), the
advice checked against a hand computation."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from optimizer.cli import app
from optimizer.daemon.service import Daemon
from optimizer.model import Market
from optimizer.store import Store, token_sha256
from optimizer.store.telemetry import GpuMinute
from tests.helpers import (
    TOKEN,
    FakeSource,
    api,
    make_config,
    make_offer,
    running,
    steady_clock,
    wait_until,
    write_policy,
)

pytestmark = pytest.mark.usefixtures("daemon_env")

H = timedelta(hours=1)
# As written the policy asks 60 GiB x 1.2 = 72 GiB per GPU: only the A100 holds it. It denies
# every eu- region.
POLICY = """\
apiVersion: gpuopt/v1
kind: Policy
name: train
workload: {gpus: 1, gpu_memory_gib: 60}
markets: [spot, on_demand]
placement: {regions: {deny: ["eu-*"]}}
"""
A100 = make_offer(
    instance_type="p4de.24xlarge", gpu_model="A100-80GB", gpu_memory_gib=80.0,
    market=Market.ON_DEMAND, zone=None, usd_per_hour=3.00,
)  # fmt: skip
L40S = make_offer(
    instance_type="g6e.xlarge", gpu_model="L40S", gpu_memory_gib=44.7, usd_per_hour=1.20
)
L40S_EU = make_offer(
    instance_type="g6e.xlarge", gpu_model="L40S", gpu_memory_gib=44.7, usd_per_hour=0.90,
    region="eu-west-1", zone="euw1-az1",
)  # fmt: skip
A10G = make_offer()  # 22.35 GiB at $0.40: too small for 31 x 1.2 = 37.2 GiB


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    write_policy(tmp_path / "policies", "train.yaml", POLICY)
    per_tflop = POLICY.replace("name: train", "name: perflop") + "rank_by: price_per_tflop\n"
    write_policy(tmp_path / "policies", "perflop.yaml", per_tflop)
    source = FakeSource([A100, L40S, L40S_EU, A10G])
    config = make_config(tmp_path)
    with running(config, sources={"local": source}, clock=steady_clock()) as d, api(d) as client:
        wait_until(lambda: client.get("/readyz").status_code == 200, what="readiness")
        wait_until(lambda: len(d.store.prices.latest_offers()) == 4, what="offers stored")
        yield d


def add_job(
    store: Store, name: str, now: datetime, *, ended: bool = True, policy: str = "train"
) -> list[int]:
    """A job on the A100 with two attempts: held [now-10h, now-8h] and [now-4h, now-1h] (or
    still running); returns the attempts' ids."""
    job_id = store.jobs.add_job(name, policy, {"run": "x"}, at=now - 10 * H)
    ids = []
    for number, (start, end) in enumerate(((10, 8), (4, 1)), 1):
        key = f"{name}-{number}"
        record = store.jobs.create_attempt(
            job_id, number, key, A100, token_sha256(key), now - start * H
        )
        if ended or number == 1:
            store.jobs.update_attempt(key, ended_at=now - end * H, state="ended")
        ids.append(record.id)
    if ended:
        store.jobs.transition_job(
            job_id, expected="pending", state="succeeded", reason="exit 0", at=now - H
        )
    return ids


def sample(start: datetime, util: float, memory: float, gpus: int = 1) -> GpuMinute:
    return GpuMinute(
        start=start, samples=6, gpus=gpus, util_mean=util, memory_used_gib_max=memory,
        memory_total_gib=80.0 * gpus,
    )  # fmt: skip


def advice(daemon: Daemon, name: str) -> Any:
    with api(daemon) as client:
        return client.get(f"/jobs/{name}/advice")


def test_the_advice_is_the_cheapest_allowed_fit_with_the_saving_at_the_duty_cycle(
    daemon: Daemon,
) -> None:
    now = daemon.clock()
    first, second = add_job(daemon.store, "resnet", now)
    t = now - 9 * H
    daemon.store.telemetry.add(first, [sample(t, 0.30, 20.0), sample(t + H / 60, 0.50, 31.0)])
    daemon.store.telemetry.add(second, [sample(now - 3 * H, 0.43, 25.0)])
    answer = advice(daemon, "resnet")
    assert answer.status_code == 200
    got = answer.json()
    assert got["status"] == "cheaper_fit"
    # peak 31 GiB x 1.2 = 37.2 GiB: the L40S fits; the $0.90 one is in a denied region.
    assert got["gpu_memory_need_gib"] == pytest.approx(37.2)
    assert got["advised"]["offer"]["region"] == "us-east-1"
    assert got["advised"]["offer"]["instance_type"] == "g6e.xlarge"
    # util: (0.30 + 0.50 + 0.43) / 3 = 0.41 (equal spans)
    assert got["usage"]["utilization"] == pytest.approx(0.41)
    # held 2 h + 3 h in the 9 h from the first start to the last end: 5/9 of 730 h
    assert got["duty_cycle"]["running_hours"] == pytest.approx(5)
    assert got["duty_cycle"]["window_hours"] == pytest.approx(9)
    assert got["duty_cycle"]["hours_per_month"] == pytest.approx(5 / 9 * 730)
    assert got["usd_per_hour_saving"] == pytest.approx(1.80)  # 3.00 - 1.20
    assert got["monthly_saving_usd"] == pytest.approx(1.80 * 5 / 9 * 730)  # $730.00
    assert got["reason"].startswith("peak 31 GiB x 1.2 = 37.2 GiB fits an L40S (44.7 GiB)")
    assert "util 41%" in got["reason"] and "$730.00/month at 406 h/month" in got["reason"]
    assert got["current"]["instance_type"] == "p4de.24xlarge"

    out = CliRunner().invoke(
        app, ["advise", "resnet", "--api", daemon.url], env={"GPUOPT_API_TOKEN": TOKEN}
    )
    assert out.exit_code == 0, out.output
    assert out.output.splitlines()[0] == "resnet (policy train): cheaper fit"
    assert "advised: aws g6e.xlarge spot in us-east-1 (1x L40S, 44.7 GiB each) at $1.2/h" in (
        out.output
    )
    assert "saving:  $1.8/h, $730.00/month at 406 h/month" in out.output
    as_json = CliRunner().invoke(
        app, ["advise", "resnet", "--json", "--api", daemon.url], env={"GPUOPT_API_TOKEN": TOKEN}
    )
    assert json.loads(as_json.output)["monthly_saving_usd"] == pytest.approx(730.0)


def test_a_peak_that_only_the_current_gpu_holds_is_no_cheaper_fit(daemon: Daemon) -> None:
    now = daemon.clock()
    first, _ = add_job(daemon.store, "big", now)
    daemon.store.telemetry.add(first, [sample(now - 9 * H, 0.9, 50.0)])
    got = advice(daemon, "big").json()
    # 50 x 1.2 = 60 GiB: only the A100 the job runs on holds it.
    assert got["status"] == "no_cheaper_fit" and got["advised"] is None
    assert got["reason"].startswith("no cheaper fit: peak 50 GiB x 1.2 = 60 GiB; util 90%")


def test_without_telemetry_there_is_no_advice(daemon: Daemon) -> None:
    add_job(daemon.store, "quiet", daemon.clock(), ended=False)
    got = advice(daemon, "quiet").json()
    assert got["status"] == "no_telemetry" and got["advised"] is None
    assert got["reason"] == "no GPU telemetry for job quiet yet: no advice without data"
    out = CliRunner().invoke(
        app, ["advise", "quiet", "--api", daemon.url], env={"GPUOPT_API_TOKEN": TOKEN}
    )
    assert out.exit_code == 0
    assert out.output.splitlines() == [
        "quiet (policy train): no telemetry yet",
        "  no GPU telemetry for job quiet yet: no advice without data",
    ]


def test_per_tflop_the_current_throughput_is_the_probes_measured_figure(daemon: Daemon) -> None:
    now = daemon.clock()
    first, _ = add_job(daemon.store, "bert", now, policy="perflop")
    daemon.store.telemetry.add(first, [sample(now - 9 * H, 0.8, 31.0)])
    # The A100 probed at 200 bf16 TFLOPS (the datasheet says 312).
    result = {
        "schema": "gpuopt.probe", "version": 1, "backend": "cuda", "gpu_model": "A100-80GB",
        "measured_tflops": {"A100-80GB": {"bf16": 200.0}},
        "runs": [{"device": "cuda", "ok": True, "gpu": 0, "gemm": [], "copy_gbps": 1500.0}],
    }  # fmt: skip
    event = {"id": "p1", "kind": "probe_result", "data": {"status": "pass", "result": result}}
    daemon.store.jobs.record_agent_events("bert-1", [event], now - 9 * H)
    got = advice(daemon, "bert").json()
    assert got["status"] == "cheaper_fit" and got["rank_by"] == "price_per_tflop"
    assert got["current"]["node_tflops"] == 200.0
    assert (got["current"]["tflops_source"], got["current"]["tflops_n"]) == ("measured", 1)
    # The L40S's datasheet 362 bf16 TFLOPS: the A100's work costs 200 x 1.20 / 362 $/h there.
    assert got["advised"]["offer"]["instance_type"] == "g6e.xlarge"
    assert got["usd_per_hour_saving"] == pytest.approx(3.00 - 200 * 1.20 / 362)
    assert (
        "bf16 362 TFLOPS per node advised (datasheet) vs 200 now (measured, n=1)" in got["reason"]
    )


def test_unknown_jobs_and_unloaded_policies_are_clear_errors(daemon: Daemon) -> None:
    missing = advice(daemon, "nope")
    assert missing.status_code == 404 and missing.json() == {"detail": "no job named 'nope'"}
    daemon.store.jobs.add_job("orphan", "gone", {"run": "x"})
    orphan = advice(daemon, "orphan")
    assert orphan.status_code == 409
    assert orphan.json()["detail"] == ("job 'orphan' runs under policy 'gone', which is not loaded")
    out = CliRunner().invoke(
        app, ["advise", "nope", "--api", daemon.url], env={"GPUOPT_API_TOKEN": TOKEN}
    )
    assert out.exit_code == 2 and "no job named 'nope'" in out.output
    assert "Traceback" not in out.output
