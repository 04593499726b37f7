"""Rightsizing advice: what a job measured, and the cheapest offer the same policy allows for it.

Pure: plain values in (a job's GPU samples, its attempts' running intervals, what it runs on
now, and a ranking made under the policy with the measured need), an `Advice` out. The
daemon gathers the inputs (optimizer/jobs/advice.py); docs/advice.md explains the figures.

- Need: the highest memory used per GPU in any sample, x (1 + the policy's buffer), as a
  launch sizes a policy's stated need (`policies.sizing.with_buffer`). A sample holds the
  memory used summed over the attempt's GPUs, so per GPU is that sum / its GPUs: an even
  spread, as data, tensor and sharded parallelism leave it. The samples cannot show a GPU
  left idle, so the advice keeps the policy's GPU count (docs/advice.md).
- Utilization: the mean of the samples' means, weighted by each sample's span, i.e. the
  average over the time the job was sampled (running).
- Duty cycle: the hours the job's instances were held (each attempt from its start to its
  end, or to now) over the hours since its first attempt started (to its last end once the
  job has ended); hours per month = duty cycle x HOURS_PER_MONTH.
- Saving per month: with `rank_by: price`, (current USD/h - advised USD/h) x hours per
  month. With `rank_by: price_per_tflop`, the same work at the advised offer's price per
  TFLOP-hour: hours x (current USD/h - current TFLOPS x advised USD per TFLOP-hour), where
  both throughputs are known; otherwise by price.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, NamedTuple

from policies.engine import Candidate, Ranking
from policies.schema import Policy
from policies.sizing import with_buffer

HOURS_PER_MONTH = 730.0  # 8760 h / 12, the average month (as cloud price sheets use)
# A candidate must beat the current score by more than this fraction to count as cheaper, so
# float noise and the same price elsewhere are "no cheaper fit".
MIN_SAVING_FRACTION = 1e-6

Status = Literal["no_telemetry", "no_cheaper_fit", "cheaper_fit"]


class Sample(NamedTuple):
    """One stored telemetry aggregate: its span in seconds, the mean utilization (0-1), the
    highest memory used over it summed over its GPUs (GiB), and how many GPUs it covered."""

    span_s: float
    util_mean: float | None
    memory_used_gib_max: float | None
    gpus: int
    simulated: bool = False  # injected by the local cloud, not read from a GPU
    host: bool = False  # read from the GPU of the host a local-cloud instance runs on


@dataclass(frozen=True, slots=True)
class Usage:
    """What a job's samples say: peak per-GPU memory, time-weighted utilization."""

    samples: int
    sampled_hours: float
    peak_gib: float | None  # per GPU; None: no sample had a memory reading
    util: float | None  # 0-1; None: no sample had a utilization reading
    gpus: int | None  # the GPUs of the sample with the peak (else the most any covered)
    node_peak_gib: float | None = None  # that sample's memory used, summed over its GPUs
    simulated: bool = False  # some sample was injected by the local cloud
    host: bool = False  # some sample read the host's GPU (the local cloud), not the type's


def usage(samples: Iterable[Sample]) -> Usage:
    """Fold samples into a Usage (module docstring: how each figure is made)."""
    count, seconds, weighted, util_seconds = 0, 0.0, 0.0, 0.0
    peak: float | None = None
    node_peak: float | None = None
    gpus: int | None = None
    peak_gpus: int | None = None
    simulated = host = False
    for sample in samples:
        count += 1
        simulated = simulated or sample.simulated
        host = host or (sample.host and not sample.simulated)
        span = max(float(sample.span_s), 0.0)
        seconds += span
        if sample.util_mean is not None and span > 0:
            weighted += sample.util_mean * span
            util_seconds += span
        n_gpus = max(sample.gpus, 1)
        if sample.memory_used_gib_max is not None:
            per_gpu = sample.memory_used_gib_max / n_gpus
            if peak is None or per_gpu > peak:
                peak, node_peak, peak_gpus = per_gpu, sample.memory_used_gib_max, n_gpus
        gpus = max(gpus or 0, n_gpus)
    util = weighted / util_seconds if util_seconds else None
    return Usage(count, seconds / 3600, peak, util, peak_gpus or gpus, node_peak, simulated, host)


class Interval(NamedTuple):
    """One attempt's instance: held from `start` until `end` (None: still held)."""

    start: datetime
    end: datetime | None


@dataclass(frozen=True, slots=True)
class DutyCycle:
    running_hours: float
    window_hours: float
    fraction: float  # running / window, 0-1
    hours_per_month: float  # fraction x HOURS_PER_MONTH


def duty_cycle(intervals: Iterable[Interval], now: datetime, *, ended: bool) -> DutyCycle:
    """Hours held over hours since the first start (to the last end when `ended`, else to
    `now`). Overlapping intervals (a replacement launched before the old one ended) count once."""
    spans = sorted((i.start, i.end or now) for i in intervals)
    if not spans:
        return DutyCycle(0.0, 0.0, 0.0, 0.0)
    running = 0.0
    cur_start, cur_end = spans[0]
    for start, end in spans[1:]:
        if start <= cur_end:
            cur_end = max(cur_end, end)
            continue
        running += (cur_end - cur_start).total_seconds()
        cur_start, cur_end = start, end
    running += (cur_end - cur_start).total_seconds()
    last = max(end for _, end in spans) if ended else now
    window = max((last - spans[0][0]).total_seconds(), running)
    fraction = running / window if window > 0 else 0.0
    return DutyCycle(running / 3600, window / 3600, fraction, fraction * HOURS_PER_MONTH)


@dataclass(frozen=True, slots=True)
class Current:
    """What the job runs on (its latest attempt): the price it pays, and the shape's figures
    where the latest offers still list the instance type (None otherwise)."""

    provider: str
    region: str
    instance_type: str
    market: str
    usd_per_hour: float
    gpu_model: str | None = None
    gpu_count: int | None = None
    gpu_memory_gib: float | None = None
    node_tflops: float | None = None  # for the ranking's dtype, measured where known
    # where node_tflops came from: measured (probes, `tflops_n` results) or datasheet
    tflops_source: str | None = None
    tflops_n: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "region": self.region,
            "instance_type": self.instance_type,
            "market": self.market,
            "usd_per_hour": self.usd_per_hour,
            "gpu_model": self.gpu_model,
            "gpu_count": self.gpu_count,
            "gpu_memory_gib": self.gpu_memory_gib,
            "node_tflops": self.node_tflops,
            "tflops_source": self.tflops_source,
            "tflops_n": self.tflops_n,
        }


def sized_policy(policy: Policy, peak_gib: float, gpus: int | None = None) -> Policy:
    """The policy with its memory need replaced by the measured per-GPU peak (before the
    buffer) on at least `gpus` GPUs (the job's; the policy's minimum where that is more): the
    model block and stated figure go, everything else (GPU models, regions, markets,
    throughput, caps) stays."""
    count = max(policy.workload.gpus, gpus or 1)
    workload = policy.workload.model_copy(
        update={
            "gpu_memory_gib": peak_gib if peak_gib > 0 else None,
            "model": None,
            "gpus": count,
        }
    )
    return policy.model_copy(update={"workload": workload})


@dataclass(frozen=True, slots=True)
class Advice:
    job: str
    policy: str
    status: Status
    reason: str
    usage: Usage
    duty: DutyCycle
    buffer: float
    need_gib: float | None  # per GPU, after the buffer
    current: Current | None
    advised: Candidate | None = None
    rank_by: str = "price"
    dtype: str = "bf16"
    usd_per_hour_saving: float | None = None
    monthly_saving_usd: float | None = None
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        u, d = self.usage, self.duty
        return {
            "job": self.job,
            "policy": self.policy,
            "status": self.status,
            "reason": self.reason,
            "usage": {
                "samples": u.samples,
                "sampled_hours": u.sampled_hours,
                "peak_gpu_memory_gib": u.peak_gib,
                "peak_node_memory_gib": u.node_peak_gib,
                "utilization": u.util,
                "gpus": u.gpus,
                "simulated": u.simulated,
                "host": u.host,
            },
            "duty_cycle": {
                "running_hours": d.running_hours,
                "window_hours": d.window_hours,
                "fraction": d.fraction,
                "hours_per_month": d.hours_per_month,
            },
            "buffer": self.buffer,
            "gpu_memory_need_gib": self.need_gib,
            "rank_by": self.rank_by,
            "dtype": self.dtype,
            "current": None if self.current is None else self.current.to_dict(),
            "advised": None if self.advised is None else self.advised.to_dict(),
            "usd_per_hour_saving": self.usd_per_hour_saving,
            "monthly_saving_usd": self.monthly_saving_usd,
            "notes": list(self.notes),
        }


def advise(
    job: str,
    policy: Policy,
    usage: Usage,
    duty: DutyCycle,
    current: Current | None,
    ranking: Ranking | None,
) -> Advice:
    """The advice for `job`. `ranking` must rank the latest offers under
    `sized_policy(policy, usage.peak_gib, usage.gpus)` (None only when there is no
    telemetry)."""
    base = {
        "job": job,
        "policy": policy.name,
        "usage": usage,
        "duty": duty,
        "buffer": policy.buffer,
        "current": current,
        "rank_by": policy.rank_by,
        "notes": _notes(usage, current, policy.buffer),
    }
    if usage.peak_gib is None or ranking is None:
        why = f"no GPU telemetry for job {job} yet: no advice without data"
        return Advice(status="no_telemetry", reason=why, need_gib=None, **base)  # type: ignore[arg-type]
    need = with_buffer(usage.peak_gib, policy.buffer)
    base["dtype"] = ranking.dtype
    peak = f"peak {_gib(usage.peak_gib)} GiB"
    if usage.gpus and usage.gpus > 1 and usage.node_peak_gib is not None:
        node, each = _gib(usage.node_peak_gib), _gib(usage.peak_gib)
        peak = f"peak {node} GiB on {usage.gpus} GPUs = {each} GiB each"
    measured = (
        f"{peak} x {1 + policy.buffer:g} = {_gib(need)} GiB"
        if policy.buffer
        else f"{peak} (no buffer)"
    )
    util = "" if usage.util is None else f"; util {usage.util * 100:.0f}%"
    best = ranking.best
    if best is None:
        why = f"no cheaper fit: no offer policy {policy.name} allows fits {measured}{util}"
        return Advice(status="no_cheaper_fit", reason=why, need_gib=need, **base)  # type: ignore[arg-type]
    if current is None:
        why = f"{measured} fits {_shape(best)}{util}; the job has run nowhere yet to compare"
        return Advice(status="no_cheaper_fit", reason=why, need_gib=need, advised=best, **base)  # type: ignore[arg-type]
    per_hour, hours = _saving_per_hour(policy, current, best), duty.hours_per_month
    floor = MIN_SAVING_FRACTION * current.usd_per_hour
    if per_hour <= floor:
        here = f"{current.provider} {current.instance_type} {current.market}"
        why = (
            f"no cheaper fit: {measured}{util}; the cheapest fit under policy {policy.name}, "
            f"{_shape(best)}, is not cheaper than {here} at ${current.usd_per_hour:.4g}/h"
            f"{_throughput(policy, ranking.dtype, current, best)}"
        )
        return Advice(status="no_cheaper_fit", reason=why, need_gib=need, **base)  # type: ignore[arg-type]
    monthly = per_hour * hours
    why = (
        f"{measured} fits {_shape(best)}{util}{_throughput(policy, ranking.dtype, current, best)}; "
        f"${per_hour:.4g}/h less than {current.provider} {current.instance_type} "
        f"{current.market}, ${monthly:,.2f}/month at {hours:.0f} h/month "
        f"({duty.fraction * 100:.0f}% duty cycle)"
    )
    if best.move:  # the job's checkpoint would have to follow it there (data gravity)
        why += f"; {best.move}, ${best.move_usd_per_hour or 0:.4g}/h over the run"
    return Advice(
        status="cheaper_fit",
        reason=why,
        need_gib=need,
        advised=best,
        usd_per_hour_saving=per_hour,
        monthly_saving_usd=monthly,
        **base,  # type: ignore[arg-type]
    )


def _saving_per_hour(policy: Policy, current: Current, best: Candidate) -> float:
    """USD saved per hour the job runs now (module docstring: per TFLOP for price_per_tflop)."""
    price = best.offer.usd_per_hour
    if policy.rank_by == "price_per_tflop" and current.node_tflops and best.node_tflops:
        return current.usd_per_hour - current.node_tflops * price / best.node_tflops
    return current.usd_per_hour - price


def _throughput(policy: Policy, dtype: str, current: Current, best: Candidate) -> str:
    """With rank_by price_per_tflop, the two node throughputs compared ("" otherwise)."""
    if policy.rank_by != "price_per_tflop" or not (current.node_tflops and best.node_tflops):
        return ""
    now = _source(current.tflops_source, current.tflops_n)
    advised = _source(best.throughput, best.measured_n)
    return (
        f"; {dtype} {best.node_tflops:.0f} TFLOPS per node advised{advised} vs "
        f"{current.node_tflops:.0f} now{now}"
    )


def _source(source: str | None, n: int | None) -> str:
    """` (measured, n=3)`, ` (datasheet)`, or "" when the source is not known."""
    if source is None:
        return ""
    return f" ({source}, n={n})" if n is not None else f" ({source})"


def _notes(usage: Usage, current: Current | None, buffer: float) -> tuple[str, ...]:
    notes = []
    if usage.simulated:
        notes.append("simulated telemetry: some readings were injected by the local cloud")
    if usage.host:
        notes.append(
            "host GPU telemetry: the local cloud's instances read the GPU of the daemon's "
            "host, not one of the type they name"
        )
    if usage.gpus is not None and usage.gpus > 1:
        notes.append(
            f"GPU count kept at the job's {usage.gpus}: the samples hold memory summed "
            "over the GPUs, not each GPU's, so per GPU is an even share and a GPU left idle "
            "does not show"
        )
        fewer = _fewer_gpus(usage, current, buffer)
        if fewer is not None:
            notes.append(fewer)
    return tuple(notes)


def _fewer_gpus(usage: Usage, current: Current | None, buffer: float) -> str | None:
    """Whether all of the job's memory, with the buffer, would fit on fewer of its current
    GPUs: true for sharded state (FSDP, ZeRO-3, tensor parallel), not for data-parallel
    replicas, which need the same memory on each GPU; the samples cannot tell which."""
    node, gpus = usage.node_peak_gib, usage.gpus
    if node is None or gpus is None or current is None or not current.gpu_memory_gib:
        return None
    need = with_buffer(node, buffer)
    fit = max(1, math.ceil(need / current.gpu_memory_gib))
    if fit >= gpus:
        return None
    return (
        f"all its memory, {_gib(node)} GiB x {1 + buffer:g} = {_gib(need)} GiB, would fit on "
        f"{fit} of its {_gib(current.gpu_memory_gib)} GiB GPUs if the work is sharded rather "
        "than replicated per GPU (data parallel); the samples cannot tell which"
    )


def _gib(value: float) -> str:
    """GiB to one decimal, without a trailing .0: 31, 37.2."""
    return f"{value:.1f}".removesuffix(".0")


def _shape(candidate: Candidate) -> str:
    o = candidate.offer
    count = f"{o.gpu_count}x " if o.gpu_count > 1 else ""
    memory = f"{o.gpu_memory_gib:g}" if math.isfinite(o.gpu_memory_gib) else "?"
    return (
        f"{_article(count or o.gpu_model)} {count}{o.gpu_model} ({memory} GiB) "
        f"{o.provider} {o.instance_type} {o.market} in {o.region} at ${o.usd_per_hour:.4g}/h"
    )


def _article(word: str) -> str:
    return "an" if word[:1].upper() in "AEFHILMNORSX8" else "a"
