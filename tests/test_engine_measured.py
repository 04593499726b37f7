"""The ranking with what the probes measured: per-(provider, type) figures replace the datasheet's
(and can reverse its order), candidates say where their figures came from, `price_per_tbps` ranks
by memory bandwidth, and types whose probes keep failing are ranked after the rest."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from optimizer.model import Offer
from policies.engine import Candidate, EvaluationError, evaluate
from policies.measured import Measured, TypeMeasurement
from tests.helpers.engine import T0, offer, policy

# 8 x A100-80GB (table: 312 TFLOPS bf16, 2039 GB/s each) at $20/h, and 8 x H100-80GB (989,
# 3350) at $40/h, both on one provider: by the datasheet the H100 node is cheaper per TFLOP
# ($40 / 7912 = 0.00506 against $20 / 2496 = 0.00801).
a100 = offer(instance_type="p4de.24xlarge", usd_per_hour=20.0)
h100 = offer(instance_type="p5.48xlarge", gpu_model="H100-80GB", usd_per_hour=40.0)


def measured(tflops: dict[str, float], *, copy: float | None = None, n: int = 5, age_h: float = 2):
    return TypeMeasurement(tflops, copy, n, T0 - timedelta(hours=age_h))


def ranked(pol: Any, offers: list[Offer], **kwargs: Any) -> list[str]:
    return [c.offer.instance_type for c in evaluate(pol, offers, T0, **kwargs).candidates]


def test_measured_figures_reverse_the_datasheet_order() -> None:
    pol = policy(rank_by="price_per_tflop")
    assert ranked(pol, [a100, h100]) == ["p5.48xlarge", "p4de.24xlarge"]
    # The provider's H100 type measures 300 TFLOPS per GPU (a capped power limit, say):
    # $40 / 2400 = 0.0167; its A100 type measures 290: $20 / 2320 = 0.00862.
    found = Measured(
        types={
            ("aws", "p5.48xlarge"): measured({"bf16": 300.0}, n=4, age_h=3),
            ("aws", "p4de.24xlarge"): measured({"bf16": 290.0}, n=5, age_h=1),
        }
    )
    ranking = evaluate(pol, [a100, h100], T0, measured=found)
    assert [c.offer.instance_type for c in ranking.candidates] == ["p4de.24xlarge", "p5.48xlarge"]
    first, second = ranking.candidates
    assert (first.node_tflops, first.score) == (2320.0, pytest.approx(20 / 2320))
    assert (second.node_tflops, second.usd_per_tflop_hour) == (2400.0, pytest.approx(40 / 2400))
    assert (first.throughput, first.measured_n, first.measured_age_s) == ("measured", 5, 3600.0)
    assert (second.throughput, second.measured_n, second.measured_age_s) == ("measured", 4, 10800.0)


def test_a_measurement_belongs_to_its_provider_and_type_only() -> None:
    pol = policy(rank_by="price_per_tflop")
    gcp_h100 = offer(
        provider="gcp", instance_type="p5.48xlarge", gpu_model="H100-80GB", usd_per_hour=40.0
    )
    found = Measured(types={("aws", "p5.48xlarge"): measured({"bf16": 300.0})})
    by_type = {
        (c.offer.provider, c.offer.instance_type): c
        for c in evaluate(pol, [a100, h100, gcp_h100], T0, measured=found).candidates
    }
    assert by_type[("aws", "p5.48xlarge")].node_tflops == 2400.0
    datasheet = by_type[("gcp", "p5.48xlarge")]
    assert (datasheet.node_tflops, datasheet.throughput) == (7912.0, "datasheet")
    assert (datasheet.measured_n, datasheet.measured_age_s) == (None, None)
    assert by_type[("aws", "p4de.24xlarge")].throughput == "datasheet"


def test_a_type_figure_wins_over_a_model_figure_and_both_over_the_table() -> None:
    pol = policy(workload={"min_tflops": {"bf16": 2000}}, rank_by="price_per_tflop")
    by_model = {"H100-80GB": {"bf16": 500.0}}
    found = Measured(types={("aws", "p5.48xlarge"): measured({"bf16": 200.0})}, models=by_model)
    # 8 x 200 = 1600 < 2000 x 1.2 = 2400: the type's own figure decides.
    [rejection] = evaluate(pol, [h100], T0, measured=found).rejections
    assert rejection.rule == "throughput"
    assert rejection.reason.startswith("bf16: 8 x 200 TFLOPS (measured) = 1600 TFLOPS < 2400")
    [candidate] = evaluate(pol, [h100], T0, measured=Measured(models=by_model)).candidates
    assert (candidate.node_tflops, candidate.throughput, candidate.measured_n) == (
        4000.0,
        "measured",
        None,
    )


def test_price_per_tbps_ranks_by_memory_bandwidth_measured_where_known() -> None:
    pol = policy(rank_by="price_per_tbps")
    # Datasheet: A100 8 x 2.039 = 16.3 TB/s at $20 ($1.23 per TB/s-hour), H100 8 x 3.35 =
    # 26.8 TB/s at $40 ($1.49): the A100 node first.
    ranking = evaluate(pol, [h100, a100], T0)
    assert [c.offer.instance_type for c in ranking.candidates] == ["p4de.24xlarge", "p5.48xlarge"]
    first = ranking.candidates[0]
    assert first.node_tbps == pytest.approx(8 * 2.039)
    assert first.score == first.usd_per_tbps_hour == pytest.approx(20 / (8 * 2.039))
    assert first.bandwidth == "datasheet"
    # The A100 type copies at 1000 GB/s per GPU: 8 TB/s, $2.50 per TB/s-hour; now H100 first.
    found = Measured(types={("aws", "p4de.24xlarge"): measured({}, copy=1000.0)})
    ranking = evaluate(pol, [h100, a100], T0, measured=found)
    assert [c.offer.instance_type for c in ranking.candidates] == ["p5.48xlarge", "p4de.24xlarge"]
    slow = ranking.candidates[1]
    assert (slow.node_tbps, slow.bandwidth, slow.throughput) == (8.0, "measured", "datasheet")
    assert (slow.score, slow.measured_n) == (2.5, 5)


def test_price_per_tbps_rejects_a_gpu_with_no_bandwidth_figure() -> None:
    pro = offer(instance_type="g7e.2xlarge", gpu_model="RTX-PRO-6000", gpu_count=1)
    rejection = evaluate(policy(rank_by="price_per_tbps"), [pro], T0).rejections[0]
    assert rejection.rule == "throughput"
    assert (
        rejection.reason == "RTX-PRO-6000 has no memory bandwidth figure to rank by price per TB/s"
    )
    # A measured copy figure gives it one.
    found = Measured(types={("aws", "g7e.2xlarge"): measured({}, copy=1500.0)})
    [candidate] = evaluate(policy(rank_by="price_per_tbps"), [pro], T0, measured=found).candidates
    assert candidate.node_tbps == 1.5


def test_a_demoted_type_ranks_after_every_healthy_one_and_says_why() -> None:
    cheap = offer(instance_type="g5.48xlarge", gpu_model="A10G", usd_per_hour=5.0)
    why = "3 of the last 5 probes failed"
    found = Measured(demoted={("aws", "g5.48xlarge"): why})
    ranking = evaluate(policy(), [h100, cheap, a100], T0, measured=found)
    assert [c.offer.instance_type for c in ranking.candidates] == [
        "p4de.24xlarge",
        "p5.48xlarge",
        "g5.48xlarge",
    ]
    assert [c.rank for c in ranking.candidates] == [1, 2, 3]
    assert [c.probe_failures for c in ranking.candidates] == [None, None, why]
    # Alone, it is still a candidate: demoted, not rejected.
    assert ranked(policy(), [cheap], measured=found) == ["g5.48xlarge"]


def test_a_candidate_round_trips_through_its_json() -> None:
    found = Measured(types={("aws", "p5.48xlarge"): measured({"bf16": 300.0}, copy=3000.0)})
    [candidate] = evaluate(policy(), [h100], T0, measured=found).candidates
    out = candidate.to_dict()
    assert {k: out[k] for k in ("throughput", "measured_n", "measured_age_s", "bandwidth")} == {
        "throughput": "measured",
        "measured_n": 5,
        "measured_age_s": 7200.0,
        "bandwidth": "measured",
    }
    assert Candidate(**{**out, "offer": Offer.from_dict(out["offer"])}) == candidate


def test_bad_measured_figures_are_refused() -> None:
    for bad in ({"bf17": 1.0}, {"bf16": -1.0}, {"bf16": float("nan")}):
        with pytest.raises(EvaluationError, match=r"aws p5\.48xlarge"):
            evaluate(
                policy(),
                [h100],
                T0,
                measured=Measured(types={("aws", "p5.48xlarge"): measured(bad)}),
            )
    with pytest.raises(EvaluationError, match="copy_gbps"):
        types = {("aws", "p5.48xlarge"): measured({}, copy=-3.0)}
        evaluate(policy(), [h100], T0, measured=Measured(types=types))
