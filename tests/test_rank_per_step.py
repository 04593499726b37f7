"""`rank_by: price_per_step` (policies/per_step.py): each offer ranked by USD per step of the
job's own work, its speed from the job's own measurement on the type, else a measured type's
scaled by the probes' TFLOPS, else by the datasheet's, and every candidate saying which; for no
job (or one that measured nothing), the engine's order per TFLOP."""

from __future__ import annotations

from datetime import timedelta

import pytest

from optimizer.model import Offer
from policies import per_step
from policies.engine import Candidate, evaluate
from policies.measured import Measured, TypeMeasurement
from tests.helpers.engine import T0, offer, policy

# One GPU each, datasheet bf16 dense: A100-80GB 312, H100-80GB 989, L4 121 TFLOPS.
A100 = offer(instance_type="a100.x", gpu_count=1, usd_per_hour=4.0)
H100 = offer(instance_type="h100.x", gpu_model="H100-80GB", gpu_count=1, usd_per_hour=9.0)
L4 = offer(instance_type="l4.x", gpu_model="L4", gpu_count=1, gpu_memory_gib=24, usd_per_hour=1.0)
OFFERS = [A100, H100, L4]
POLICY = policy(rank_by="price_per_step", workload={"gpu_memory_gib": 10})


def probes(**tflops: float) -> Measured:
    return Measured(
        types={
            ("aws", kind.replace("_", ".")): TypeMeasurement(
                {"bf16": value}, None, 5, T0 - timedelta(hours=1)
            )
            for kind, value in tflops.items()
        }
    )


def ranked(speeds: per_step.StepSpeeds, measured: Measured | None = None) -> dict[str, Candidate]:
    ranking = evaluate(POLICY, OFFERS, T0, measured=measured)
    out = per_step.by_price_per_step(ranking.candidates, speeds, ranking.dtype)
    return {c.offer.instance_type: c for c in out}


def order(found: dict[str, Candidate]) -> list[str]:
    return [kind for kind, c in sorted(found.items(), key=lambda kv: kv[1].rank)]


def ref(kind: str, speed: float, offer_: Offer, probe: float | None = None) -> per_step.Reference:
    sheet = per_step.datasheet_node_tflops(offer_.gpu_model, offer_.gpu_count, "bf16")
    return per_step.Reference(kind, speed, probe_tflops=probe, datasheet_tflops=sheet)


def test_the_jobs_own_speed_ranks_by_usd_per_step_against_the_price_order() -> None:
    # The L4 is cheapest per hour and per TFLOP, but this job makes only 500 steps/h on it:
    # $1/500 = $0.002 a step, against $4/4000 = $0.001 on the A100.
    speeds = per_step.StepSpeeds({"a100.x": 4000.0, "l4.x": 500.0}, ref("a100.x", 4000.0, A100))
    found = ranked(speeds)
    a100, l4, h100 = found["a100.x"], found["l4.x"], found["h100.x"]
    assert (a100.speed_source, a100.steps_per_hour, a100.usd_per_step) == (
        "job",
        4000.0,
        pytest.approx(0.001),
    )
    assert a100.score == pytest.approx(0.001)
    assert l4.speed_basis == "the job's own 500 steps/h on l4.x"
    # Never run on an H100: the A100's speed x datasheet 989/312 = 12,679 steps/h.
    assert h100.speed_source == "datasheet"
    assert h100.steps_per_hour == pytest.approx(4000 * 989 / 312)
    assert h100.speed_basis == (
        "4,000 steps/h measured on a100.x x datasheet bf16 TFLOPS 989.0/312.0"
    )
    assert order(found) == ["h100.x", "a100.x", "l4.x"]  # 0.00071, 0.001, 0.002 $/step
    as_dict = a100.to_dict()
    assert (as_dict["speed_source"], as_dict["steps_per_hour"]) == ("job", 4000.0)


def test_probe_figures_scale_the_speed_where_both_types_were_measured() -> None:
    # The probes measured the A100 type at 280 and the H100 type at 700 TFLOPS (bf16): the
    # H100's speed is 4000 x 700/280 = 10,000 steps/h, $9/10,000 = $0.0009 a step.
    speeds = per_step.StepSpeeds({"a100.x": 4000.0}, ref("a100.x", 4000.0, A100, probe=280.0))
    found = ranked(speeds, probes(a100_x=280.0, h100_x=700.0))
    h100, l4 = found["h100.x"], found["l4.x"]
    assert (h100.speed_source, h100.steps_per_hour) == ("probe", pytest.approx(10_000))
    assert h100.speed_basis == "4,000 steps/h measured on a100.x x probe bf16 TFLOPS 700.0/280.0"
    # The L4 was not probed: the datasheet, both sides (121/312).
    assert (l4.speed_source, l4.steps_per_hour) == ("datasheet", pytest.approx(4000 * 121 / 312))
    # $1/1,551 = $0.00064, $9/10,000 = $0.0009, $4/4,000 = $0.001 a step.
    assert order(found) == ["l4.x", "h100.x", "a100.x"]


def test_without_a_measured_speed_the_order_is_per_tflop_and_says_so() -> None:
    engine = [c.offer.instance_type for c in evaluate(POLICY, OFFERS, T0).candidates]
    found = ranked(per_step.NOTHING)
    assert order(found) == engine
    for c in found.values():
        assert c.speed_source is None and c.steps_per_hour is None
        assert c.speed_basis == "no speed measured for the job: by price per bf16 TFLOP-hour"


def test_an_offer_without_any_figure_to_scale_by_ranks_after_the_rest() -> None:
    odd = offer(instance_type="odd.x", gpu_model="unknown:odd", gpu_count=1, usd_per_hour=0.1)
    ranking = evaluate(POLICY, [A100, odd], T0)
    speeds = per_step.StepSpeeds({"a100.x": 4000.0}, ref("a100.x", 4000.0, A100))
    out = per_step.by_price_per_step(ranking.candidates, speeds, ranking.dtype)
    if len(out) == 2:  # an unknown model may be rejected by the rules instead
        assert [c.offer.instance_type for c in out] == ["a100.x", "odd.x"]
        assert out[1].steps_per_hour is None and out[1].speed_source is None
        assert [c.rank for c in out] == [1, 2]


def test_a_speed_measured_only_on_a_type_no_offer_lists_is_said() -> None:
    found = ranked(per_step.StepSpeeds({"gone.x": 900.0}, None))
    for c in found.values():
        assert c.speed_source is None
        assert c.speed_basis == "measured only on gone.x, which no offer lists to scale from"
