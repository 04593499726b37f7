"""A job's rightsizing advice from what the store holds: its GPU samples, its attempts and the
latest offers ranked as a launch ranks them (optimizer.jobs.ranking), with the job's memory
need replaced by what it measured. The figures and the wording are `policies.advice`'s."""

from __future__ import annotations

from datetime import datetime

from optimizer import hardware
from optimizer.jobs.offer_table import latest_table
from optimizer.jobs.ranking import job_state, launch_ranking
from optimizer.lifecycle import TERMINAL_JOB_STATES
from optimizer.store import AttemptRecord, JobRecord, Store
from policies import advice
from policies.engine import Ranking
from policies.schedule import effective
from policies.schema import Policy
from providers import registry

# Samples read per job at most: a year of hourly rows, or a week of minutes, per attempt.
MAX_SAMPLES = 100_000


def job_advice(store: Store, job: JobRecord, policy: Policy, now: datetime) -> advice.Advice:
    """The advice for `job` under `policy` (the one it runs under, as written) at `now`: the
    ranking and the wording are those of the policy in force then (its schedule window's
    markets, bid, placement and rank_by)."""
    assert job.id is not None
    policy = effective(policy, now)
    rows = store.telemetry.samples(job_id=job.id, limit=MAX_SAMPLES)
    attempts = store.jobs.attempts(job.id)
    # An attempt on the daemon's own host (the local cloud) read the host's GPU: real
    # readings, marked as the host's (docs/probes.md, Where the figures come from).
    on_host = {a.id for a in attempts if registry.on_host(a.provider)}
    used = advice.usage(
        advice.Sample(
            r.span_s,
            r.util_mean,
            r.memory_used_gib_max,
            r.gpus,
            r.simulated,
            host=r.attempt_id in on_host,
        )
        for r in rows
    )
    duty = advice.duty_cycle(
        [_held(a) for a in attempts], now, ended=job.state in TERMINAL_JOB_STATES
    )
    ranking: Ranking | None = None
    if used.peak_gib is not None:
        sized = advice.sized_policy(policy, used.peak_gib, used.gpus)
        state = job_state(store, job, now)
        ranking = launch_ranking(
            store, job.policy, sized, now, replacing=job.id, state=state
        ).ranking
    latest = max(attempts, key=lambda a: a.number, default=None)
    current = None if latest is None else _current(store, latest, ranking)
    return advice.advise(job.given_name, policy, used, duty, current, ranking)


def _held(attempt: AttemptRecord) -> advice.Interval:
    """When the attempt's instance was held: the provider's launch and termination where
    known, else gpuopt's own start and end of the attempt."""
    return advice.Interval(
        attempt.launched_at or attempt.started_at, attempt.terminated_at or attempt.ended_at
    )


def _current(store: Store, attempt: AttemptRecord, ranking: Ranking | None) -> advice.Current:
    """What the latest attempt runs on, with the shape's figures where the latest offers still
    list its instance type. Its throughput: its own row in the ranking (which reads the
    probes' figures, optimizer.jobs.measured), else the probes' median for its (provider,
    instance type) where they measured the ranking's dtype, else the hardware table's
    datasheet figure."""
    dtype = ranking.dtype if ranking is not None else "bf16"
    key = (attempt.provider, attempt.instance_type)
    same = [
        c
        for c in (ranking.candidates if ranking is not None else ())
        if (c.offer.provider, c.offer.instance_type) == key
    ]
    offer = same[0].offer if same else None
    if offer is None:
        offer = next(
            (o for o in latest_table(store).offers if (o.provider, o.instance_type) == key),
            None,
        )
    tflops: float | None = None
    source: str | None = None
    n: int | None = None
    probed = store.probes.figures().get(key)
    if same and same[0].node_tflops:
        row = same[0]
        tflops, source, n = row.node_tflops, row.throughput or "datasheet", row.measured_n
    elif offer is not None and probed is not None and probed.tflops.get(dtype):
        tflops, source, n = offer.gpu_count * probed.tflops[dtype], "measured", probed.n
    elif offer is not None:
        per_gpu = hardware.get(offer.gpu_model).tflops_for(dtype)
        if per_gpu:
            tflops, source = offer.gpu_count * per_gpu, "datasheet"
    return advice.Current(
        provider=attempt.provider,
        region=attempt.region,
        instance_type=attempt.instance_type,
        market=attempt.market,
        usd_per_hour=attempt.usd_per_hour,
        gpu_model=None if offer is None else offer.gpu_model,
        gpu_count=None if offer is None else offer.gpu_count,
        gpu_memory_gib=None if offer is None else offer.gpu_memory_gib,
        node_tflops=tflops,
        tflops_source=source,
        tflops_n=n,
    )
