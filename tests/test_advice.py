"""policies.advice: usage and duty cycle from plain values, and the advice over a real ranking.

Every figure below is worked by hand in the comment beside it.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import pytest

from optimizer.model import Market
from policies.advice import (
    HOURS_PER_MONTH,
    Current,
    DutyCycle,
    Interval,
    Sample,
    Usage,
    advise,
    duty_cycle,
    sized_policy,
    usage,
)
from policies.engine import evaluate
from policies.schema import Policy
from tests.helpers.offers import T0, make_offer

H = timedelta(hours=1)

L40S = make_offer(
    instance_type="g6e.xlarge", gpu_model="L40S", gpu_memory_gib=44.7, usd_per_hour=1.20
)
A10G = make_offer()  # 22.35 GiB at $0.40/h: too small for 37.2 GiB
A100 = make_offer(
    instance_type="p4de.24xlarge",
    gpu_model="A100-80GB",
    gpu_memory_gib=80.0,
    market=Market.ON_DEMAND,
    zone=None,
    usd_per_hour=3.00,
)
OFFERS = (L40S, A10G, A100)
CURRENT = Current(
    "aws", "us-east-1", "p4de.24xlarge", "on_demand", 3.00, "A100-80GB", 1, 80.0, 312.0
)
# 4 h held in a 10 h window: 40% of 730 h = 292 h/month.
DUTY = DutyCycle(4.0, 10.0, 0.4, 0.4 * HOURS_PER_MONTH)
USED = Usage(samples=3, sampled_hours=1.0, peak_gib=31.0, util=0.41, gpus=1)


def policy(**sections: Any) -> Policy:
    return Policy.model_validate(
        {"apiVersion": "gpuopt/v1", "kind": "Policy", "name": "train", **sections}
    )


def run(pol: Policy, used: Usage = USED, current: Current | None = CURRENT, offers=OFFERS, **kw):
    assert used.peak_gib is not None
    ranking = evaluate(sized_policy(pol, used.peak_gib, used.gpus), offers, T0, **kw)
    return advise("resnet", pol, used, DUTY, current, ranking)


# -- usage -------------------------------------------------------------------------------------


def test_usage_weights_utilization_by_span_and_keeps_the_highest_memory() -> None:
    got = usage([Sample(60, 0.4, 20.0, 1), Sample(60, 0.6, 31.0, 1), Sample(3600, 0.4, 25.0, 1)])
    # (0.4*60 + 0.6*60 + 0.4*3600) / 3720 = 1500 / 3720
    assert got.util == pytest.approx(1500 / 3720)
    assert got.peak_gib == 31.0
    assert got.sampled_hours == pytest.approx(3720 / 3600)
    assert (got.samples, got.gpus) == (3, 1)


def test_usage_skips_missing_readings_and_says_none_without_any() -> None:
    got = usage([Sample(60, None, None, 2), Sample(120, 0.9, None, 4)])
    assert got.util == pytest.approx(0.9)  # only the sample with a reading counts
    assert got.peak_gib is None
    assert got.gpus == 4
    assert not got.simulated
    drill = usage([Sample(60, 0.03, 2.0, 1), Sample(60, 0.03, 2.0, 1, simulated=True)])
    assert drill.simulated
    assert advise("x", policy(), drill, DUTY, None, None).notes == (
        "simulated telemetry: some readings were injected by the local cloud",
    )
    host = usage([Sample(60, 0.9, 20.0, 1, host=True)])  # the local cloud's host GPU, read
    assert (host.simulated, host.host, host.util) == (False, True, pytest.approx(0.9))
    assert advise("x", policy(), host, DUTY, None, None).notes[0].startswith("host GPU telemetry")
    assert not usage([Sample(60, 0.9, 20.0, 1, simulated=True, host=True)]).host  # injected
    empty = usage([])
    assert (empty.samples, empty.util, empty.peak_gib, empty.gpus) == (0, None, None, None)


# -- duty cycle --------------------------------------------------------------------------------


def test_duty_cycle_of_a_running_job_counts_to_now() -> None:
    got = duty_cycle(
        [Interval(T0, T0 + 2 * H), Interval(T0 + 3 * H, None)], T0 + 10 * H, ended=False
    )
    # held 2 h + 7 h = 9 h of 10 h
    assert (got.running_hours, got.window_hours) == (pytest.approx(9), pytest.approx(10))
    assert got.hours_per_month == pytest.approx(0.9 * 730)


def test_duty_cycle_of_an_ended_job_stops_at_its_last_end_and_counts_overlaps_once() -> None:
    spans = [
        Interval(T0, T0 + 2 * H),
        Interval(T0 + H, T0 + 3 * H),
        Interval(T0 + 4 * H, T0 + 5 * H),
    ]
    got = duty_cycle(spans, T0 + 100 * H, ended=True)
    # [0, 3] and [4, 5]: 4 h held in a 5 h window
    assert got.running_hours == pytest.approx(4)
    assert got.window_hours == pytest.approx(5)
    assert got.fraction == pytest.approx(0.8)
    assert got.hours_per_month == pytest.approx(584)
    assert duty_cycle([], T0, ended=False).hours_per_month == 0


# -- the advice --------------------------------------------------------------------------------


def test_a_smaller_gpu_that_fits_the_measured_peak_is_advised_with_the_monthly_saving() -> None:
    got = run(policy())
    assert got.status == "cheaper_fit"
    assert got.need_gib == pytest.approx(37.2)  # 31 x 1.2
    assert got.advised is not None and got.advised.offer == L40S
    assert got.usd_per_hour_saving == pytest.approx(1.80)  # 3.00 - 1.20
    assert got.monthly_saving_usd == pytest.approx(1.80 * 292)  # 525.60
    assert got.reason.startswith("peak 31 GiB x 1.2 = 37.2 GiB fits an L40S (44.7 GiB)")
    assert "util 41%" in got.reason and "$525.60/month at 292 h/month" in got.reason
    data = got.to_dict()
    assert data["monthly_saving_usd"] == pytest.approx(525.6)
    assert data["advised"]["offer"]["instance_type"] == "g6e.xlarge"
    assert data["usage"]["peak_gpu_memory_gib"] == 31.0


def test_a_buffer_from_the_policy_decides_the_fit() -> None:
    # 31 x 1.5 = 46.5 GiB no longer fits 44.7: the A100 the job runs on is all that fits.
    got = run(policy(buffer=0.5))
    assert got.status == "no_cheaper_fit"
    assert got.need_gib == pytest.approx(46.5)
    assert got.reason.startswith("no cheaper fit: peak 31 GiB x 1.5 = 46.5 GiB")


def test_never_advises_a_gpu_model_the_policy_forbids() -> None:
    got = run(policy(workload={"gpu_models": ["A100-80GB", "H100-80GB"]}))
    assert got.status == "no_cheaper_fit"
    assert got.advised is None and got.monthly_saving_usd is None


def test_never_advises_a_region_the_policy_forbids() -> None:
    cheap_eu = make_offer(
        **{**_fields(L40S), "region": "eu-south-1", "zone": None, "usd_per_hour": 0.9}
    )
    us = make_offer(**{**_fields(L40S), "usd_per_hour": 1.50})
    got = run(policy(placement={"regions": {"deny": ["eu-*"]}}), offers=(cheap_eu, us, A100))
    assert got.status == "cheaper_fit" and got.advised is not None
    assert got.advised.offer == us  # the $0.90 one is in a denied region
    assert got.usd_per_hour_saving == pytest.approx(1.50)  # 3.00 - 1.50
    # Without the deny rule the cheaper region wins.
    assert run(policy(), offers=(cheap_eu, us, A100)).advised.offer == cheap_eu  # type: ignore[union-attr]


def test_a_model_block_is_replaced_by_the_measured_need() -> None:
    # A 7B adam model sizes at well over 80 GiB per GPU: nothing here would fit the policy
    # as written, but the job measured 31 GiB.
    pol = policy(workload={"model": {"parameters": "7B", "precision": "bf16"}})
    assert pol.memory_need_gib() > 80
    got = run(pol)
    assert got.status == "cheaper_fit" and got.advised is not None
    assert got.advised.offer.gpu_model == "L40S"


def test_measured_throughput_per_tflop_can_keep_the_job_where_it_is() -> None:
    # rank_by price_per_tflop, L40S measured at 100 bf16 TFLOPS: $1.20 / 100 = $0.012 per
    # TFLOP-h against the A100's $3.00 / 312 = $0.0096. The A100 ranks first: no cheaper fit.
    pol = policy(rank_by="price_per_tflop")
    current = dataclasses.replace(CURRENT, tflops_source="measured", tflops_n=3)
    measured = {"A100-80GB": {"bf16": 312.0}, "L40S": {"bf16": 100.0}}
    got = run(pol, current=current, measured=measured)
    assert got.status == "no_cheaper_fit"
    assert got.reason.endswith(
        "bf16 312 TFLOPS per node advised (measured) vs 312 now (measured, n=3)"
    )
    assert "TFLOPS" not in run(policy()).reason  # by price: no throughput to compare
    # At 200 TFLOPS the L40S wins: same work costs 312 x 1.20 / 200 = $1.872/h, saving $1.128.
    got = run(pol, measured={"A100-80GB": {"bf16": 312.0}, "L40S": {"bf16": 200.0}})
    assert got.status == "cheaper_fit"
    assert got.usd_per_hour_saving == pytest.approx(3.00 - 312 * 1.20 / 200)
    assert "; bf16 200 TFLOPS per node advised (measured) vs 312 now;" in got.reason
    assert got.monthly_saving_usd == pytest.approx(1.128 * 292)


def test_no_telemetry_gives_no_advice() -> None:
    none = Usage(0, 0.0, None, None, None)
    got = advise("resnet", policy(), none, DUTY, CURRENT, None)
    assert got.status == "no_telemetry"
    assert got.reason == "no GPU telemetry for job resnet yet: no advice without data"
    assert got.advised is None and got.need_gib is None


def test_nothing_fits_says_no_cheaper_fit() -> None:
    got = run(policy(), used=Usage(1, 0.1, 70.0, 0.5, 1), offers=(L40S, A10G))
    # 70 x 1.2 = 84 GiB: no offer here has that much
    assert got.status == "no_cheaper_fit"
    assert "no offer policy train allows fits peak 70 GiB x 1.2 = 84 GiB" in got.reason


def test_the_current_pool_itself_is_not_a_saving() -> None:
    got = run(policy(), offers=(A100,))
    assert got.status == "no_cheaper_fit"
    assert "is not cheaper than aws p4de.24xlarge on_demand at $3/h" in got.reason


def test_usage_takes_memory_per_gpu_as_an_even_share_of_the_node_sum() -> None:
    got = usage([Sample(60, 0.5, 62.0, 2), Sample(60, 0.5, 40.0, 1)])
    # 62 / 2 = 31 per GPU < 40 on one GPU: the one-GPU sample is the peak
    assert (got.peak_gib, got.node_peak_gib, got.gpus) == (40.0, 40.0, 1)
    got = usage([Sample(60, 0.5, 62.0, 2), Sample(60, 0.5, 30.0, 1)])
    assert (got.peak_gib, got.node_peak_gib, got.gpus) == (31.0, 62.0, 2)


def test_a_two_gpu_job_is_advised_two_gpus_each_fitting_its_share() -> None:
    two_l40s = make_offer(
        instance_type="g6e.12xlarge", gpu_model="L40S", gpu_count=2, gpu_memory_gib=44.7,
        usd_per_hour=2.50,
    )  # fmt: skip
    used = usage([Sample(60, 0.41, 62.0, 2)])
    current = Current("aws", "us-east-1", "p4de.24xlarge", "on_demand", 6.00, "A100-80GB", 2)
    got = run(policy(), used=used, current=current, offers=(L40S, two_l40s, A100))
    # The one-GPU L40S (cheaper) cannot hold 62 GiB: a 2-GPU job is kept on 2 GPUs.
    assert got.advised is not None and got.advised.offer == two_l40s
    assert got.reason.startswith(
        "peak 62 GiB on 2 GPUs = 31 GiB each x 1.2 = 37.2 GiB fits a 2x L40S"
    )
    assert got.usd_per_hour_saving == pytest.approx(3.50)  # 6.00 - 2.50
    assert any("GPU count kept at the job's 2" in n for n in got.notes)
    # 62 x 1.2 = 74.4 GiB in all fits one 80 GiB A100 (ceil(74.4 / 80) = 1 < 2 GPUs).
    a100s = dataclasses.replace(current, gpu_memory_gib=80.0)
    notes = run(policy(), used=used, current=a100s, offers=(L40S, two_l40s, A100)).notes
    assert notes[-1] == (
        "all its memory, 62 GiB x 1.2 = 74.4 GiB, would fit on 1 of its 80 GiB GPUs if the "
        "work is sharded rather than replicated per GPU (data parallel); the samples cannot "
        "tell which"
    )
    # On 40 GiB GPUs it needs ceil(74.4 / 40) = 2: no fewer, no note.
    a100s_40 = dataclasses.replace(current, gpu_memory_gib=40.0)
    notes = run(policy(), used=used, current=a100s_40, offers=(L40S, two_l40s, A100)).notes
    assert len(notes) == 1
    assert run(policy()).notes == ()


def test_a_zero_peak_sizes_no_memory_need() -> None:
    sized = sized_policy(policy(workload={"gpu_memory_gib": 24}), 0.0)
    assert sized.workload.gpu_memory_gib is None and sized.memory_need_gib() == 0


def _fields(offer: Any) -> dict[str, Any]:
    return {f: getattr(offer, f) for f in offer.__slots__}


def test_a_cheaper_fit_across_regions_from_the_checkpoint_says_what_the_move_costs() -> None:
    from policies.egress import StatePlace

    # 50 GB of checkpoint in eu-central-1; the L40S offer is in us-east-1 (make_offer's
    # region): another continent, $0.08/GB egress = $4.00, plus the restore at the default
    # throughput, spread over a 24 h horizon.
    state = StatePlace("aws", "eu-central-1", 50 * 10**9)
    got = run(policy(), state=state)
    assert got.status == "cheaper_fit"
    assert "moving 46.6 GiB from aws eu-central-1: $4.00 egress" in got.reason
    assert got.advised is not None and got.advised.move_usd_per_hour is not None
    assert f"${got.advised.move_usd_per_hour:.4g}/h over the run" in got.reason
    assert got.advised.move_usd_per_hour == pytest.approx(got.advised.move_usd / 24)  # type: ignore[operator]
    # Without state nothing is said of a move.
    assert "moving" not in run(policy()).reason
