"""optimizer.jobs.advice.job_advice over a real store (SQLite, and PostgreSQL when the suite
has one): a running job's duty cycle counts to `now`, and a pool in cooldown is left out as a
launch leaves it out."""

from __future__ import annotations

from datetime import timedelta

import pytest

from optimizer.jobs.advice import job_advice
from optimizer.model import Market
from optimizer.store import Store
from optimizer.store.telemetry import GpuMinute
from policies.loader import parse_policy
from tests.helpers.offers import T0, make_offer

H = timedelta(hours=1)
POLICY = parse_policy(
    "apiVersion: gpuopt/v1\nkind: Policy\nname: train\nworkload: {gpu_memory_gib: 60}\n"
)
A100 = make_offer(
    instance_type="p4de.24xlarge", gpu_model="A100-80GB", gpu_memory_gib=80.0,
    market=Market.ON_DEMAND, zone=None, usd_per_hour=3.00,
)  # fmt: skip
L40S = make_offer(
    instance_type="g6e.xlarge", gpu_model="L40S", gpu_memory_gib=44.7, usd_per_hour=1.2
)
L40S_OD = make_offer(
    instance_type="g6e.xlarge", gpu_model="L40S", gpu_memory_gib=44.7, usd_per_hour=1.86,
    market=Market.ON_DEMAND, zone=None,
)  # fmt: skip


def running_job(store: Store) -> int:
    """Attempts held [T0, T0+2h] and from T0+4h on, on the A100; 31 GiB peak, 41% util."""
    store.prices.record_offers([A100, L40S, L40S_OD])
    job_id = store.jobs.add_job("resnet", "train", {"run": "x"}, at=T0)
    first = store.jobs.create_attempt(job_id, 1, "resnet-1", A100, "sha-1", T0)
    store.jobs.update_attempt("resnet-1", ended_at=T0 + 2 * H, state="ended")
    store.jobs.create_attempt(job_id, 2, "resnet-2", A100, "sha-2", T0 + 4 * H)
    minute = GpuMinute(
        start=T0 + H, samples=6, gpus=1, util_mean=0.41, memory_used_gib_max=31.0, simulated=True
    )
    store.telemetry.add(first.id, [minute])
    return job_id


def test_a_running_jobs_duty_cycle_counts_to_now_and_the_cheapest_fit_is_advised(
    store: Store,
) -> None:
    running_job(store)
    job = store.jobs.get_job("resnet")
    assert job is not None
    got = job_advice(store, job, POLICY, T0 + 10 * H)
    # held 2 h + 6 h of 10 h: 0.8 x 730 = 584 h/month; $3.00 - $1.20 = $1.80/h
    assert got.duty.hours_per_month == pytest.approx(584)
    assert got.status == "cheaper_fit" and got.advised is not None
    assert got.advised.offer.market == Market.SPOT
    assert got.monthly_saving_usd == pytest.approx(1.80 * 584)
    assert got.usage.simulated and got.to_dict()["usage"]["simulated"] is True
    assert got.notes[0].startswith("simulated telemetry")
    # The A100 is a candidate too: its throughput is its ranking row's (no probe measured it).
    assert got.current is not None
    assert (got.current.node_tflops, got.current.tflops_source) == (312.0, "datasheet")


def test_a_pool_in_cooldown_is_left_out_as_a_launch_leaves_it(store: Store) -> None:
    running_job(store)
    store.jobs.add_cooldown(L40S.pool, T0 + 20 * H, "interrupted")
    job = store.jobs.get_job("resnet")
    assert job is not None
    got = job_advice(store, job, POLICY, T0 + 10 * H)
    assert got.advised is not None and got.advised.offer.market == Market.ON_DEMAND
    assert got.usd_per_hour_saving == pytest.approx(3.00 - 1.86)


def test_real_readings_of_a_local_instance_advise_and_are_marked_the_hosts(store: Store) -> None:
    """A local-cloud instance on a host with a GPU reads that GPU: not simulated, so the
    advice works from it, and it says whose GPU it was."""
    local = make_offer(provider="local", instance_type="g6e.xlarge", gpu_model="L40S")
    store.prices.record_offers([A100, L40S, L40S_OD])
    job_id = store.jobs.add_job("demo", "train", {"run": "x"}, at=T0)
    attempt = store.jobs.create_attempt(job_id, 1, "demo-1", local, "sha-1", T0)
    minute = GpuMinute(start=T0 + H, samples=6, gpus=1, util_mean=0.9, memory_used_gib_max=20.0)
    store.telemetry.add(attempt.id, [minute])
    job = store.jobs.get_job("demo")
    assert job is not None
    got = job_advice(store, job, POLICY, T0 + 2 * H)
    assert got.usage.samples == 1 and got.usage.peak_gib == pytest.approx(20.0)
    assert (got.usage.simulated, got.usage.host) == (False, True)
    assert got.to_dict()["usage"]["host"] is True
    assert any(n.startswith("host GPU telemetry") for n in got.notes)
    assert not any(n.startswith("simulated") for n in got.notes)
