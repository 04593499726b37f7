"""Jobs' GPU and recovery metrics on a real /metrics endpoint, from facts in the store: the
latest minute of each live job's newest attempt, interruptions by pool, and the recovery
histogram (notice -> the replacement's job running), the same after a daemon restart."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from optimizer.clock import ManualClock
from optimizer.daemon.metrics import RECOVERY_BUCKETS
from optimizer.daemon.service import Daemon
from optimizer.store import GpuMinute, Store
from optimizer.store.jobs import AttemptRecord
from tests.helpers import api, make_config, make_offer, running

pytestmark = pytest.mark.usefixtures("daemon_env")

T0 = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


def scrape(daemon: Daemon) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with api(daemon, token=None) as client:
        text = client.get("/metrics").text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def attempt(store: Store, job: str, number: int, region: str = "us-east-1") -> AttemptRecord:
    found = store.jobs.get_job(job)
    job_id = found.id if found else store.jobs.add_job(job, "team", {"run": "x"}, at=T0)
    offer = make_offer(provider="aws", region=region, instance_type="p5.48xlarge", observed_at=T0)
    return store.jobs.create_attempt(job_id, number, f"{job}-{number}", offer, "sha", T0)


def report(store: Store, a: AttemptRecord, kind: str, at: datetime) -> None:
    event = {"id": f"{a.key}-{kind}", "kind": kind, "at": at.isoformat(), "data": {}}
    store.jobs.record_agent_events(a.key, [event], at)


def minute(at: datetime, util: float, used: float, simulated: bool = False) -> GpuMinute:
    return GpuMinute(
        start=at,
        samples=6,
        gpus=8,
        util_mean=util,
        memory_used_gib_max=used,
        memory_total_gib=1128.0,
        simulated=simulated,
    )


def test_gpu_and_recovery_metrics_come_from_the_store_and_survive_a_restart(
    tmp_path: Path,
) -> None:
    clock = ManualClock(T0 + timedelta(hours=2))
    cfg = make_config(tmp_path)
    with running(cfg, clock=clock) as daemon:
        store = daemon.store
        # "train": attempt 1 interrupted (notice at +10 min), attempt 2 running 95 s later.
        one = attempt(store, "train", 1)
        report(store, one, "job_started", T0)
        store.telemetry.add(one.id, [minute(T0, 0.9, 900.0)])
        report(store, one, "interruption_notice", T0 + timedelta(minutes=10))
        two = attempt(store, "train", 2)
        report(store, two, "job_started", T0 + timedelta(minutes=10, seconds=95))
        store.telemetry.add(
            two.id,
            [
                minute(T0 + timedelta(minutes=20), 0.5, 100.0),
                minute(T0 + timedelta(minutes=21), 0.4, 282.0),
            ],
        )
        # "eval": interrupted in another region, not running again yet.
        other = attempt(store, "eval", 1, region="us-west-2")
        report(store, other, "interruption_notice", T0 + timedelta(minutes=30))
        # "drill": simulated readings.
        drill = attempt(store, "drill", 1)
        store.telemetry.add(drill.id, [minute(T0, 0.03, 225.6, simulated=True)])
        first = scrape(daemon)

    util = {k[1]: v for k, v in first.items() if k[0] == "gpuopt_job_gpu_utilization"}
    assert util == {
        (("job", "drill"), ("simulated", "true")): pytest.approx(0.03),
        (("job", "train"), ("simulated", "false")): pytest.approx(0.4),  # attempt 2's latest
    }
    ratio = first[("gpuopt_job_gpu_memory_used_ratio", (("job", "train"), ("simulated", "false")))]
    assert ratio == pytest.approx(282.0 / 1128.0)
    pools = {
        dict(k[1])["region"]: v
        for k, v in first.items()
        if k[0] == "gpuopt_job_interruptions_total"
    }
    assert pools == {"us-east-1": 1, "us-west-2": 1}
    buckets = {
        float(dict(k[1])["le"]): v
        for k, v in first.items()
        if k[0] == "gpuopt_job_recovery_seconds_bucket"
    }
    assert sorted(buckets) == [*map(float, RECOVERY_BUCKETS), float("inf")]
    assert {le: n for le, n in buckets.items() if n} == {
        le: 1 for le in buckets if le >= 120
    }  # 95 s: in the 120 s bucket and every one above
    assert first[("gpuopt_job_recovery_seconds_count", ())] == 1
    assert first[("gpuopt_job_recovery_seconds_sum", ())] == pytest.approx(95.0)

    with running(cfg, clock=clock) as daemon:  # a restart reads the same facts
        again = scrape(daemon)
    keys = [k for k in first if k[0].startswith(("gpuopt_job_recovery", "gpuopt_job_interr"))]
    assert keys and all(again[k] == first[k] for k in keys)
