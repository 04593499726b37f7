"""`rank_by: price_per_step`: offers ranked by USD per step of the job's own work
(docs/policies.md, docs/progress.md).

The steps per hour a job would make on an offer's instance type come from, in this order:

1. `job`: what the job itself measured on that type in its earlier attempts;
2. `probe`: a type the job measured (the reference), scaled by the probes' TFLOPS: the
   offer's measured node TFLOPS over the reference type's;
3. `datasheet`: the same scaling by the hardware table's TFLOPS, where the probes measured
   either side not.

Scaling assumes the job's speed follows the ranking dtype's throughput; the job's own figure
always wins where it exists. A job that has measured no speed (or a ranking for no job) keeps
the engine's order under this rank_by, which is by price per TFLOP-hour (probe figures where
measured, else the datasheet): the same order the scaling would give. An offer for which no
speed can be worked out ranks after every one that has one; offers whose probes keep failing
stay last.

Pure: the caller (optimizer/jobs/ranking.py) gathers the job's speeds and the reference's
figures.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from optimizer import hardware
from optimizer.hardware import UnknownDtypeError
from policies.measured import MEASURED
from policies.ranking import Candidate

JOB, PROBE, DATASHEET = "job", "probe", "datasheet"


@dataclass(frozen=True, slots=True)
class Reference:
    """A type the job measured, that other types' speeds are scaled from: its steps per hour
    and its node TFLOPS for the ranking dtype, as the probes measured them (None: not
    measured) and per the datasheet (None: unknown)."""

    instance_type: str
    steps_per_hour: float
    probe_tflops: float | None = None
    datasheet_tflops: float | None = None


@dataclass(frozen=True, slots=True)
class StepSpeeds:
    """What the ranking knows of the job's speed: steps per hour per instance type it ran on,
    and the reference the others are scaled from (None: nothing measured)."""

    by_type: Mapping[str, float] = field(default_factory=dict)
    reference: Reference | None = None


NOTHING = StepSpeeds()


def datasheet_node_tflops(gpu_model: str, gpu_count: int, dtype: str) -> float | None:
    """The hardware table's TFLOPS for the whole node, None where unknown."""
    try:
        per_gpu = hardware.get(gpu_model).tflops_for(dtype)
    except UnknownDtypeError:
        return None
    return per_gpu * gpu_count if per_gpu else None


def speed_of(c: Candidate, speeds: StepSpeeds, dtype: str) -> tuple[float | None, str | None, str]:
    """(steps per hour, its source, the basis in words) for one candidate."""
    kind = c.offer.instance_type
    own = speeds.by_type.get(kind)
    if own is not None and own > 0:
        return own, JOB, f"the job's own {own:,.0f} steps/h on {kind}"
    ref = speeds.reference
    if ref is None and speeds.by_type:
        measured = ", ".join(sorted(speeds.by_type))
        return None, None, f"measured only on {measured}, which no offer lists to scale from"
    if ref is None:
        return None, None, f"no speed measured for the job: by price per {dtype} TFLOP-hour"
    if c.throughput == MEASURED and c.node_tflops and ref.probe_tflops:
        value = ref.steps_per_hour * c.node_tflops / ref.probe_tflops
        return value, PROBE, _scaled(ref, "probe", c.node_tflops, ref.probe_tflops, dtype)
    mine = datasheet_node_tflops(c.offer.gpu_model, c.offer.gpu_count, dtype)
    if mine and ref.datasheet_tflops:
        value = ref.steps_per_hour * mine / ref.datasheet_tflops
        return value, DATASHEET, _scaled(ref, "datasheet", mine, ref.datasheet_tflops, dtype)
    return None, None, f"no {dtype} TFLOPS to scale {ref.instance_type}'s speed by"


def _scaled(ref: Reference, source: str, mine: float, theirs: float, dtype: str) -> str:
    return (
        f"{ref.steps_per_hour:,.0f} steps/h measured on {ref.instance_type} x {source} "
        f"{dtype} TFLOPS {mine:,.1f}/{theirs:,.1f}"
    )


def _score(c: Candidate, per_hour: float) -> float:
    """A candidate without a speed keeps the engine's score (per TFLOP-hour), or where it had
    no figure either (ranked last) its price per hour: a score is always a finite number."""
    return c.score if math.isfinite(c.score) else per_hour


def by_price_per_step(
    candidates: Iterable[Candidate], speeds: StepSpeeds, dtype: str
) -> list[Candidate]:
    """The candidates with their steps per hour, USD per step and where the speed came from,
    ranked by USD per step (module docstring); ranks renumbered from 1."""
    annotated: list[tuple[tuple[bool, bool, float, int], Candidate]] = []
    for position, c in enumerate(candidates):
        per_hour = c.offer.usd_per_hour + (c.move_usd_per_hour or 0.0)
        steps, source, basis = speed_of(c, speeds, dtype)
        cost = per_hour / steps if steps else None
        record = c._replace(
            steps_per_hour=steps,
            usd_per_step=cost,
            speed_source=source,
            speed_basis=basis,
            score=cost if cost is not None else _score(c, per_hour),
        )
        key = (c.probe_failures is not None, cost is None, cost or 0.0, position)
        annotated.append((key, record))
    annotated.sort(key=lambda pair: pair[0])
    return [c._replace(rank=i) for i, (_, c) in enumerate(annotated, start=1)]


__all__ = [
    "DATASHEET",
    "JOB",
    "NOTHING",
    "PROBE",
    "Reference",
    "StepSpeeds",
    "by_price_per_step",
    "datasheet_node_tflops",
    "speed_of",
]
