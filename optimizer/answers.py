"""The API's answers as models: each route declares one, so `/openapi.json` documents it,
and the CLI and the console read the same shapes (docs/daemon.md, the HTTP API).

In the vocabulary, beside the agent's protocol: importing it costs pydantic and nothing of
FastAPI or the store, so the CLI can parse an answer through its model (it imports this
module inside the commands that render one, never at start).

The routes still build plain dicts; FastAPI checks each against its model and writes the
model's fields in the order given here, which is the order the dicts have always had. Rules,
so that no answer changes by being typed:

- numbers that are not counts are `Number` (int or float, whichever the value is: a float
  field would write 2 as 2.0);
- times are the text `state.utc_text` writes (`...Z`), or null;
- an object the API passes on from elsewhere (a ranking's candidates, a probe result, the
  cost report's groups) is a free-form object here: its own module defines it;
- every model keeps keys it does not list (`extra="allow"`), so a field added to a dict and
  forgotten here still reaches the caller, only undocumented.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from optimizer.common.units import duration_text

Number = int | float
Object = dict[str, Any]


class Answer(BaseModel):
    model_config = ConfigDict(extra="allow")


# -- health -----------------------------------------------------------------------------------


class Health(Answer):
    status: str
    version: str
    started_at: str | None


class Ready(Answer):
    ready: bool
    checks: Object


# -- jobs -------------------------------------------------------------------------------------


class ProgressView(Answer):
    """A job's progress (docs/progress.md): the newest report's step, the run's total and
    when it was reported; the speed in force (steps per hour) and the instance type it was
    measured on; steps per hour per instance type over all its attempts; the ETA at that
    speed (null without a total or a speed, or once the job has ended short of its total)."""

    step: int
    total: int | None
    at: str | None
    fraction_done: Number | None
    steps_per_hour: Number | None
    instance_type: str | None
    by_type: dict[str, Number]
    eta: str | None


class PlacementView(Answer):
    """Where a job runs now (optimizer/jobs/queue.py): its attempt, pool and launch price,
    node count, whether the job runs there yet (false while it launches or probes) and
    since when."""

    attempt: int
    provider: str
    region: str
    zone: str | None
    instance_type: str
    market: str
    usd_per_hour: Number | None
    nodes: int
    running: bool
    since: str | None


class JobView(Answer):
    """A job. The queue's fields (optimizer/jobs/queue.py): `placement` (null: on no
    instance now), `age_s` since it was submitted, `running_s` it ran over all its attempts,
    `spend_usd` so far (its instances' cost, the cost report's `spend_usd`)."""

    id: int
    name: str
    policy: str
    state: str
    reason: str | None
    restarts: int
    created_at: str | None
    updated_at: str | None
    cancel_requested_at: str | None
    removed_at: str | None
    spec: Object
    progress: ProgressView | None = None
    placement: PlacementView | None = None
    age_s: Number | None = None
    running_s: Number | None = None
    spend_usd: Number | None = None
    # The policy the job runs under, as a policy document (its own for inline resources):
    # in a submit's answer and in GET /jobs/{name}; null in lists, and where not loaded.
    effective_policy: Object | None = None


class JobList(Answer):
    jobs: list[JobView]


class CodeUpload(Answer):
    """`PUT /code/{sha256}`: the archive the daemon holds now (`stored`: this upload stored
    it; false when it was held already)."""

    sha256: str
    size: int
    stored: bool


class CostLineView(Answer):
    """One cost line: an attempt's cost in one calendar month (UTC), with its figures
    (`optimizer.costs.report.figures`, docs/costs.md)."""

    month: str
    period_start: str | None
    period_end: str | None
    frozen: bool
    refunded: bool
    spend_usd: Number
    storage_usd: Number
    total_usd: Number
    on_demand_usd: Number | None
    savings_usd: Number | None
    savings_fraction: Number | None
    net_savings_fraction: Number | None
    billed_seconds: Number
    overhead_seconds: Number
    overhead_usd: Number
    baseline_known: bool


class AttemptView(Answer):
    number: int
    gang: int | None
    node_rank: int
    nodes: int
    provider: str
    region: str
    zone: str | None
    instance_type: str
    market: str
    usd_per_hour: Number | None
    instance_id: str | None
    state: str
    end_reason: str | None
    started_at: str | None
    ended_at: str | None
    launched_at: str | None
    terminated_at: str | None
    terminated_by: str | None
    # `job`, or `warm_spare` for a spare that has not taken the job over (docs/jobs.md)
    role: str = "job"
    promoted_at: str | None = None  # when a warm spare took the job over
    registered_at: str | None = None
    probe_status: str | None = None
    cost_lines: list[CostLineView]


class GpuView(Answer):
    current_utilization: Number | None
    current_at: str | None
    average_utilization: Number | None
    current_memory_used_gib: Number | None
    peak_memory_used_gib: Number | None
    memory_total_gib: Number | None
    peak_memory_used_ratio: Number | None
    since: str | None
    samples: int
    attempt_id: int | None
    throttle_reasons: int | None
    xids: list[int]
    simulated: bool


class DeadlineView(Answer):
    """A job's deadline (docs/deadlines.md, "In the daemon"): when (`at`), and where the work
    left is known, the figures its deadline strategy decides on, in seconds: `slack_s` is
    the deadline less the time elapsed, the work left and one restart (none while it runs
    on-demand); `at_risk`: the slack no longer covers one more restart and a decision
    interval, so only on-demand, without a break, still meets it (when the strategy's safety
    net takes over and `job.deadline_at_risk` is raised); `missed`: the deadline passed with
    work left. A finished job is shown as it stood when it finished."""

    at: str
    work_left_s: float | None
    slack_s: float | None
    at_risk: bool
    missed: bool
    elapsed_s: float | None = None
    deadline_s: float | None = None
    overhead_s: float | None = None
    running: str | None = None
    note: str | None = None  # e.g. why only a miss is watched for

    def summary(self) -> str:
        """`2026-12-04 18:00 UTC; work left 3.1 h, slack 5.2 h (at risk)`: the CLI's and the
        console's words."""
        at = self.at
        when = at.replace("T", " ")[:16] + " UTC" if at.endswith(("Z", "+00:00")) else at
        if self.work_left_s is None:
            told = "work left unknown (watched for a miss only)"
        else:
            slack = "-" if self.slack_s is None else duration_text(self.slack_s)
            told = f"work left {duration_text(self.work_left_s)}, slack {slack}"
        flag = " (missed)" if self.missed else " (at risk)" if self.at_risk else ""
        return f"{when}; {told}{flag}"


class JobDetail(JobView):
    attempts: list[AttemptView]
    gpu: GpuView | None
    deadline: DeadlineView | None = None


class CheckpointView(Answer):
    """One checkpoint a job's attempt uploaded to its bucket (`uri`: its folder there,
    `region`: the bucket's, null when unknown); `deleted`: pruned from the bucket since;
    `restored_by`: the attempts that restored it, by number."""

    name: str
    step: int | None
    size_bytes: int
    uri: str
    region: str | None
    committed_at: str | None
    attempt: int
    final: bool
    deleted: bool
    deleted_at: str | None
    restored_by: list[int]


class CheckpointList(Answer):
    job: str
    checkpoints: list[CheckpointView]


class AdviceView(Answer):
    job: str
    policy: str
    status: str
    reason: str | None
    usage: Object
    duty_cycle: Object
    buffer: Number | None
    gpu_memory_need_gib: Number | None
    rank_by: str | None
    dtype: str | None
    current: Object | None
    advised: Object | None
    usd_per_hour_saving: Number | None
    monthly_saving_usd: Number | None
    notes: list[str]
    evaluated_at: str | None


# -- events and alerts ------------------------------------------------------------------------


class EventView(Answer):
    id: int
    at: str | None
    kind: str
    severity: str
    job_id: int | None
    policy: str | None
    message: str
    data: Object | None


class EventList(Answer):
    events: list[EventView]


class AlertView(Answer):
    id: int
    event_id: int
    channel: str
    dedupe_key: str | None
    state: str
    attempts: int
    next_attempt_at: str | None
    last_error: str | None
    created_at: str | None
    delivered_at: str | None


class AlertList(Answer):
    counts: dict[str, int]
    alerts: list[AlertView]


# -- offers and prices ------------------------------------------------------------------------


class OfferList(Answer):
    """Without a policy: the latest offers, cheapest first (`Offer.to_dict`)."""

    count: int
    offers: list[Object]


class RankingView(Answer):
    """With a policy: the ranking a launch would walk (`Candidate.to_dict`,
    `Rejection.to_dict`)."""

    policy: str
    evaluated_at: str | None
    at: str | None
    window: str | None
    dtype: str | None
    candidate_count: int
    candidates: list[Object]
    rejection_count: int
    rejected_by_rule: dict[str, int]
    rejections: list[Object]
    cooling_down: int
    policy_status: str
    policy_sha256: str


class PlanView(Answer):
    """`POST /jobs/plan`: what submitting a spec would do (optimizer/api/plan.py)."""

    job: str
    policy: str
    base_policy: str
    inline: bool
    effective_policy: Object
    evaluated_at: str | None
    nodes: int
    work_hours: Number | None
    restarts_from_beginning: bool
    candidate_count: int
    candidates: list[Object]
    rejection_count: int
    rejected_by_rule: dict[str, int]
    cooling_down: int
    notes: list[str]


class PricePointView(Answer):
    at: str | None
    tier: str
    usd_per_hour: Number
    min_usd: Number | None
    max_usd: Number | None
    points: int | None


class PriceHistory(Answer):
    provider: str
    region: str
    zone: str | None
    instance_type: str
    market: str
    since: str | None
    until: str | None
    count: int
    points: list[PricePointView]
    next_since: str | None


# -- policies ---------------------------------------------------------------------------------


class PolicySummary(Answer):
    name: str
    path: str | None
    sha256: str
    loaded_at: str
    status: str
    problems: list[str]
    description: str | None


class RejectedFileView(Answer):
    path: str
    sha256: str
    problems: list[str]
    kept: str | None


class PolicyList(Answer):
    policies: list[PolicySummary]
    rejected_files: list[RejectedFileView]


class PolicyVersionView(Answer):
    id: int
    path: str | None
    sha256: str | None
    outcome: str
    at: str | None
    problems: list[str] | None


class PolicyDetail(PolicySummary):
    spec: Object
    versions: list[PolicyVersionView]


# -- the rest ---------------------------------------------------------------------------------


class ProbeList(Answer):
    """Probe results newest first (`ProbeRecord.to_dict`)."""

    probes: list[Object]


class ReplicaView(Answer):
    id: str
    role: str
    host: str
    pid: int
    version: str
    api_url: str | None
    started_at: str | None
    leader_since: str | None
    heartbeat_at: str | None
    alive: bool


class ReplicaList(Answer):
    leader: str | None
    answered_by: Any
    replicas: list[ReplicaView]


class CostGroup(Answer):
    """One group of `GET /costs` (`optimizer.costs.report.report`): its figures, how many
    attempts, and where asked `markets` (the same figures per market) and `attempts` (with
    `by=job`), which only such answers carry."""

    group: str
    spend_usd: Number
    storage_usd: Number
    total_usd: Number
    on_demand_usd: Number | None
    savings_usd: Number | None
    savings_fraction: Number | None
    net_savings_fraction: Number | None
    billed_seconds: Number
    overhead_seconds: Number
    overhead_usd: Number
    baseline_known: bool
    attempt_count: int


class CostNotice(Answer):
    event_id: int | None
    channels: list[str]
    message: str
    data: Object


# -- owned machines ---------------------------------------------------------------------------


class MachineList(Answer):
    """The owned machines (providers/ssh `MachineView.to_dict`)."""

    machines: list[Object]


class MachineDrained(Answer):
    """A drain begun: the machine, when it goes, and the instances told."""

    machine: Object
    power_off_at: str
    told: list[str]


class Machine(Answer):
    """One owned machine (`MachineView.to_dict`)."""

    name: str
    state: str
    gpus: int
    gpus_free: int


class MachineRemoved(Answer):
    removed: str
