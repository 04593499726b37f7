"""The warm spare's decisions (optimizer/jobs/spare.py), its spec field, and its pricing in
the ledger, the FOCUS export and the budget. The end-to-end run is in
test_warm_spare_e2e.py. Every figure is computed by hand in the comment beside it."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from optimizer.costs.focus import rows
from optimizer.costs.lines import JOB_ROLE, WARM_SPARE
from optimizer.jobs import budget as job_budget
from optimizer.jobs.machine import AttemptView, Launch
from optimizer.jobs.spare import decide_spare, promotable, spare_order
from optimizer.jobs.spec import JobSpec, JobSpecError, parse_job_spec
from optimizer.lifecycle import AttemptEnd, JobState
from optimizer.model import EventKind, Market, Pool
from optimizer.store import Store
from tests.helpers import make_offer
from tests.helpers.costs import T0, at, attempt, ended

RUNNING = Pool("aws", "us-east-1", "use1-az1", "g5.xlarge", "spot")
ELSEWHERE = Pool("aws", "us-east-1", "use1-az2", "g5.xlarge", "spot")
TIMEOUT = timedelta(minutes=10)
SPARE_POOL = {"zone": "use1-az2", "usd_per_hour": 0.60}


def view(number: int, pool: Pool = ELSEWHERE, **kw: object) -> AttemptView:
    return AttemptView(number=number, key=f"train-{number}", pool=pool, launched_at=T0, **kw)  # type: ignore[arg-type]


# -- where a spare goes ------------------------------------------------------------------------


def test_a_spare_goes_to_another_zone_first_then_the_same_zone_then_the_running_pool() -> None:
    same_pool = make_offer(usd_per_hour=0.30)  # the running pool: cheapest, but last
    same_zone = make_offer(instance_type="g5.2xlarge", usd_per_hour=0.35)
    other_zone = make_offer(zone="use1-az2", usd_per_hour=0.50)
    other_region = make_offer(region="us-west-2", zone="usw2-az1", usd_per_hour=0.45)
    ranked = [same_pool, same_zone, other_region, other_zone]  # the ranking's order
    assert spare_order(ranked, RUNNING) == [other_region, other_zone, same_zone, same_pool]
    assert spare_order(ranked, None) == ranked  # nothing to stand apart from


# -- when a spare is kept, replaced, released --------------------------------------------------


def decide(**kw: object) -> object:
    args: dict[str, object] = {
        "wanted": True,
        "state": JobState.RUNNING,
        "current": view(1, RUNNING, registered=True, job_started=True),
        "spare": view(2, registered=True, probe_status="pass"),
        "now": T0 + timedelta(minutes=5),
        "register_timeout": TIMEOUT,
    }
    return decide_spare(**{**args, **kw})  # type: ignore[arg-type]


def test_a_healthy_spare_beside_a_running_attempt_is_kept() -> None:
    d = decide()
    assert (d.end, d.launch) == (None, False)  # type: ignore[attr-defined]


def test_a_job_with_an_attempt_and_no_spare_gets_one_and_a_job_without_one_does_not() -> None:
    assert decide(spare=None).launch  # type: ignore[attr-defined]
    assert not decide(spare=None, current=None, state=JobState.PENDING).launch  # type: ignore[attr-defined]
    assert not decide(spare=None, wanted=False).launch  # type: ignore[attr-defined]


def test_a_spare_is_launched_only_once_the_running_attempt_has_come_through_its_start() -> None:
    booting = view(1, RUNNING, registered=True)  # its probe still running
    assert not decide(spare=None, current=booting).launch  # type: ignore[attr-defined]
    failed = view(1, RUNNING, registered=True, probe_status="fail")
    assert not decide(spare=None, current=failed).launch  # type: ignore[attr-defined]
    for ready in (
        view(1, RUNNING, registered=True, probe_status="pass"),
        view(1, RUNNING, registered=True, probe_status="warn"),
        view(1, RUNNING, registered=True, job_started=True),  # probes: none
    ):
        assert decide(spare=None, current=ready).launch  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("spare", "why"),
    [
        (view(2, registered=True, interruption_notice_at=T0), AttemptEnd.PREEMPTED),
        (view(2, registered=True, preempted=True), AttemptEnd.PREEMPTED),
        (view(2, registered=True, probe_status="fail"), AttemptEnd.PROBE_FAILED),
        (view(2, registered=True, instance_gone=True), AttemptEnd.LOST),
        (view(2), AttemptEnd.NOT_REGISTERED),  # launched at T0, silent past the 10 minutes
    ],
)
def test_a_spare_that_fails_as_an_attempt_would_is_ended_and_replaced(
    spare: AttemptView, why: AttemptEnd
) -> None:
    d = decide(spare=spare, now=T0 + TIMEOUT + timedelta(seconds=1))
    assert (d.end, d.launch) == (why, True)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "state", [JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.STOPPED]
)
def test_a_job_that_ended_releases_its_spare_and_launches_none(state: JobState) -> None:
    d = decide(state=state, current=None)
    assert (d.end, d.launch) == (AttemptEnd.SPARE_RELEASED, False)  # type: ignore[attr-defined]


def test_a_spare_takes_over_only_where_the_launch_would_allow_its_pool() -> None:
    ready = view(2, registered=True, probe_status="pass")
    assert promotable(ready, "spot", Launch(avoid=frozenset({RUNNING})))
    assert not promotable(ready, "spot", Launch(avoid=frozenset({ELSEWHERE})))
    # a deadline's relaunch on on-demand only: a spot spare cannot stand in
    assert not promotable(ready, "spot", Launch(markets=(Market.ON_DEMAND,)))
    assert promotable(ready, "spot", Launch(markets=(Market.SPOT, Market.ON_DEMAND)))
    # a move's targets
    assert promotable(ready, "spot", Launch(only=frozenset({ELSEWHERE})))
    assert not promotable(ready, "spot", Launch(only=frozenset({RUNNING})))
    sick = view(2, registered=True, interruption_notice_at=T0)
    assert not promotable(sick, "spot", Launch())


# -- the spec field ----------------------------------------------------------------------------

SPEC = {"name": "train", "policy": "team", "run": "python train.py", "checkpoint_dir": "/c"}


def test_warm_spare_is_off_by_default_and_refused_for_a_job_of_several_nodes() -> None:
    assert JobSpec.model_validate(SPEC).warm_spare is False
    assert JobSpec.model_validate({**SPEC, "warm_spare": True}).warm_spare is True
    text = "".join(f"{k}: {v}\n" for k, v in SPEC.items()) + "nodes: 2\nwarm_spare: true\n"
    with pytest.raises(JobSpecError) as caught:
        parse_job_spec(text, path="j.yaml")
    assert [str(p) for p in caught.value.problems] == [
        "j.yaml:6:13: warm_spare: a warm spare is one instance: a job of 2 nodes cannot have one"
    ]


# -- the ledger --------------------------------------------------------------------------------


def test_a_spares_time_is_its_own_line_and_a_promoted_spare_is_the_jobs(store: Store) -> None:
    from optimizer.jobs.ledger import Ledger

    # launched at their pools' prices, with no later point: $0.40/h (use1-az1), $0.60/h (az2)
    attempt(store, "train", 1, job_started=at(10), job_exited=at(80), **ended(90))
    # the spare: launched at minute 5, idle until it ended at minute 65
    attempt(store, "train", 2, launched=at(5), spare=True, **SPARE_POOL, **ended(65))
    # a spare launched at 0 that took the job over at 30 and ran it from 31 to the end (90)
    attempt(
        store,
        "other",
        1,
        spare=True,
        **SPARE_POOL,
        promoted_at=at(30),
        job_started=at(31),
        **ended(90),
    )
    ledger = Ledger(store)
    later = T0 + timedelta(days=2)
    job, spare = ledger.lines(job="train", now=later)
    assert (job.role, spare.role) == (JOB_ROLE, WARM_SPARE)
    # 60 min at $0.60/h, every second of it idle (overhead)
    assert spare.cost.billed_seconds == 60 * 60
    assert spare.cost.spend_usd == pytest.approx(0.60)
    assert spare.cost.overhead_usd == pytest.approx(0.60)
    (took,) = ledger.lines(job="other", now=later)
    assert took.role == JOB_ROLE
    # 90 min at $0.60/h = $0.90; its 31 min before the job started are overhead: $0.31
    assert took.cost.spend_usd == pytest.approx(0.90)
    assert took.cost.overhead_usd == pytest.approx(0.31)
    # frozen, the lines keep their roles
    assert ledger.freeze(later) == 3
    frozen = ledger.lines(now=later)
    assert all(line.frozen for line in frozen)
    assert [line.role for line in frozen if line.job == "train"] == [JOB_ROLE, WARM_SPARE]
    # the FOCUS export names the spare's row
    spare_row, *_ = (r for r in rows([spare]) if r["ServiceCategory"] == "Compute")
    assert json.loads(spare_row["Tags"])["gpuopt/role"] == WARM_SPARE
    assert "(warm spare)" in spare_row["ChargeDescription"]
    assert "(warm spare)" in spare_row["ResourceName"]
    job_row = next(r for r in rows([job]) if r["ServiceCategory"] == "Compute")
    assert "gpuopt/role" not in json.loads(job_row["Tags"])


def test_the_budget_counts_a_live_spare_even_while_its_job_is_relaunched(store: Store) -> None:
    attempt(store, "train", 1, launched=at(0))
    attempt(store, "train", 2, launched=at(0), zone="use1-az2", spare=True)
    now = at(60)
    offers = [make_offer(observed_at=now), make_offer(zone="use1-az2", observed_at=now)]
    running = store.jobs.get_job("train")
    assert running is not None
    spend = job_budget.committed(store, "team", now, offers)
    assert spend.live_attempts == 2  # the attempt and its spare: two instances
    # 60 min at $0.40/h each
    assert spend.spent_usd == pytest.approx(0.80)
    replaced = job_budget.committed(store, "team", now, offers, replacing=running.id)
    assert replaced.live_attempts == 1  # the spare stays; only the attempt is replaced


# -- the fence and what `gpuopt jobs show` prints ----------------------------------------------


def test_an_idle_spare_never_starts_the_job_and_a_promoted_one_waits_for_the_old_job(
    store: Store,
) -> None:
    from optimizer.jobs.fence import fence_for
    from tests.helpers.jobs import Drafter

    job = store.jobs.add_job("train", "team", {"run": "x", "checkpoint_dir": "/c"}, at=T0)
    offer = make_offer()
    store.jobs.create_attempt(job, 1, "train-1", offer, "a", T0)
    store.jobs.update_attempt("train-1", registered_at=T0, job_started_at=at(1))
    store.jobs.create_attempt(job, 2, "train-2", make_offer(zone="use1-az2"), "b", T0, spare=True)
    store.jobs.update_attempt("train-2", registered_at=at(1), probe_status="pass")
    spare = store.jobs.attempt("train-2")
    assert spare is not None
    # nothing holds it but being the spare: the running attempt's job is no reason for it
    assert fence_for(store, Drafter(), spare, now=at(60)) == "attempt 2 is the job's warm spare"
    # taken over (renumbered after the notice): held until attempt 1's job has exited
    store.jobs.update_attempt("train-1", notice_at=at(60), state="ended", ended_at=at(60))
    store.jobs.update_attempt("train-2", number=3, promoted_at=at(60))
    took = store.jobs.attempt("train-2")
    assert took is not None
    assert fence_for(store, Drafter(), took, now=at(61)) == "attempt 1's job has not exited yet"
    store.jobs.update_attempt("train-1", exit_code=0)
    assert fence_for(store, Drafter(), took, now=at(62)) is None


def test_jobs_show_prints_the_spare_with_its_probe() -> None:
    from optimizer.answers import AttemptView as Shown
    from optimizer.cli.jobs import spare_line

    fields: dict[str, object] = {
        "number": 3,
        "gang": None,
        "node_rank": 0,
        "nodes": 1,
        "provider": "local",
        "region": "eu-west",
        "zone": "eu-west-b",
        "instance_type": "gpu.a10",
        "market": "spot",
        "usd_per_hour": 0.41,
        "instance_id": "i-3",
        "state": "launched",
        "end_reason": None,
        "started_at": None,
        "ended_at": None,
        "launched_at": None,
        "terminated_at": None,
        "terminated_by": None,
        "role": "warm_spare",
        "registered_at": "2026-03-10T12:01:00Z",
        "probe_status": "pass",
        "cost_lines": [],
    }
    shown = Shown.model_validate(fields)
    assert spare_line(shown) == (
        "warm spare: attempt 3 on local eu-west/eu-west-b gpu.a10 spot at $0.4100/h, probed (pass)"
    )
    booting = Shown.model_validate({**fields, "registered_at": None, "probe_status": None})
    assert spare_line(booting).endswith(", booting")


# -- the takeover, in the store ----------------------------------------------------------------


def test_a_spare_on_a_moves_target_takes_over_as_the_newest_attempt(store: Store) -> None:
    from optimizer.jobs.acting import Acting
    from optimizer.jobs.context import ReconcileContext
    from optimizer.jobs.spares import promote
    from tests.helpers.jobs import Drafter

    attempt(store, "train", 1, job_started=at(1))
    attempt(store, "train", 2, spare=True, **SPARE_POOL)
    attempt(store, "train", 3, job_started=at(20))  # a move's attempt, after the spare's launch
    store.jobs.update_attempt("train-1", state="ended", ended_at=at(20), end_reason="migrated")
    job = store.jobs.get_job("train")
    assert job is not None
    now = at(30)
    ctx = ReconcileContext(now, (job,), {}, store, {}, Drafter(), lambda: now)
    acting = Acting(lambda: "http://127.0.0.1:1")
    rows = store.jobs.attempts(job.id)
    # a move to the running attempt's own zone: the spare (az2) is not among its targets
    assert promote(acting, ctx, job, Launch(only=frozenset({RUNNING})), rows) is None
    assert store.jobs.attempt("train-2").idle_spare  # type: ignore[union-attr]
    walked = promote(acting, ctx, job, Launch(only=frozenset({ELSEWHERE})), rows)
    assert walked is not None and walked.launched
    assert "no launch" in walked.why
    took = store.jobs.attempt("train-2")
    assert took is not None
    assert (took.number, took.promoted_at, took.idle_spare) == (4, now, False)
    assert [a.key for a in store.jobs.attempts(job.id)][-1] == "train-2"  # the newest
    [event] = acting.take()
    assert event.kind == EventKind.JOB_SPARE_CHANGED and event.data is not None
    assert (event.data["action"], event.data["attempt"]) == ("promoted", 4)
