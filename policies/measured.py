"""What the probes measured, as the ranking engine takes it (`evaluate(measured=…)`).

Figures are per (provider, instance type): the same GPU model can run slower on one provider's
type than on another's (a power cap, PCIe instead of SXM, a noisy host), and a probe measures
the type it ran on. `Measured.models` keeps the older shape, per-GPU TFLOPS keyed by GPU model
(what a probe's `measured_tflops` holds), for callers that have no type: a per-type figure wins
over a per-model one, which wins over the hardware table.

`demoted` names the types whose probes keep failing on a provider, with the reason; the engine
ranks their offers after every other candidate (docs/policies.md, "Probe failures").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

TypeKey = tuple[str, str]  # (provider, instance type)

MEASURED = "measured"
DATASHEET = "datasheet"


@dataclass(frozen=True, slots=True)
class TypeMeasurement:
    """A (provider, instance type)'s robust figures: medians over its last `n` usable probe
    results, the newest taken at `newest_at`. Per GPU: `tflops` by dtype, `copy_gbps` the
    device copy bandwidth (bytes read plus written, comparable with the datasheet's memory
    bandwidth, docs/probes.md)."""

    tflops: Mapping[str, float]
    copy_gbps: float | None
    n: int
    newest_at: datetime


@dataclass(frozen=True, slots=True)
class Measured:
    """Everything the probes tell one evaluation (module docstring)."""

    types: Mapping[TypeKey, TypeMeasurement] = field(default_factory=dict)
    models: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    demoted: Mapping[TypeKey, str] = field(default_factory=dict)


NOTHING = Measured()


def as_measured(value: Measured | Mapping[str, Mapping[str, float]] | None) -> Measured:
    """`evaluate`'s `measured` argument as a Measured: a plain mapping is per-GPU TFLOPS keyed
    by GPU model and dtype."""
    if value is None:
        return NOTHING
    if isinstance(value, Measured):
        return value
    return Measured(models=value)
