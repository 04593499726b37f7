"""Deadlines in the daemon (optimizer/jobs/deadlines.py): `deadline` and `work` in the spec,
the Situation built from the store, the recovery seam choosing the markets, the running job
moved, and the at-risk and missed events raised once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from optimizer.jobs.acting import Acting
from optimizer.jobs.context import PassMemo
from optimizer.jobs.deadlines import (
    Deadlines,
    Offered,
    deadline_view,
    markets_for,
    offered,
    situation,
)
from optimizer.jobs.machine import AttemptView, JobView, Launch, decide
from optimizer.jobs.migration import Reason
from optimizer.jobs.progress import JobProgress
from optimizer.jobs.recovery import Failover, Failure, RecoverySettings, Relaunch, with_deadline
from optimizer.jobs.spec import JobSpecError, from_stored, job_spec, parse_job_spec, stored_form
from optimizer.jobs.views import PassView
from optimizer.lifecycle import AttemptEnd, AttemptState, JobState
from optimizer.model import EventKind, Market, Pool
from optimizer.store import Store
from policies.deadline import Situation, Use, strategy
from policies.loader import parse_policy
from tests.helpers import make_offer
from tests.helpers.jobs import Drafter

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)
SUBMIT = NOW - timedelta(hours=2)
POLICY = parse_policy(
    "apiVersion: gpuopt/v1\nkind: Policy\nname: p\n"
    "workload: {gpus: 1, gpu_memory_gib: 16}\nmarkets: [spot, on_demand]\n"
    "recovery: {restart_overhead: 15m}\n"
)
SPOT_A = make_offer(zone="use1-az1", usd_per_hour=0.40, observed_at=NOW)
SPOT_B = make_offer(zone="use1-az2", usd_per_hour=0.45, observed_at=NOW)
ON_DEMAND = make_offer(zone=None, market=Market.ON_DEMAND, usd_per_hour=1.0, observed_at=NOW)


def spec_text(extra: str) -> str:
    return f"name: j\npolicy: p\nrun: python train.py\ncheckpoint_dir: /c\n{extra}"


# -- the spec ------------------------------------------------------------------------------------


def test_a_deadline_is_a_duration_after_submit_or_a_time_with_its_zone() -> None:
    spec = parse_job_spec(spec_text("deadline: 48h\nwork: 0.2h\n"))
    assert spec.deadline == 48 * 3600.0 and spec.work is not None
    assert spec.work.hours == pytest.approx(0.2) and spec.work.reference is None
    assert spec.deadline_at(SUBMIT) == SUBMIT + timedelta(hours=48)

    at = parse_job_spec(
        spec_text("deadline: 2026-12-04T18:00:00Z\nwork: {hours: 48, reference: p3.2xlarge}\n")
    )
    assert at.deadline == datetime(2026, 12, 4, 18, tzinfo=UTC)
    assert at.deadline_at(SUBMIT) == datetime(2026, 12, 4, 18, tzinfo=UTC)
    assert at.work is not None and at.work.hours == 48 and at.work.reference == "p3.2xlarge"
    quoted = parse_job_spec(spec_text("deadline: '2026-12-04T20:00:00+02:00'\nwork: 30m\n"))
    assert quoted.deadline_at(SUBMIT) == datetime(2026, 12, 4, 18, tzinfo=UTC)
    assert quoted.work is not None and quoted.work.seconds == 1800


def test_deadline_and_work_survive_the_store_as_written() -> None:
    for text in ("deadline: 30m\nwork: 20m\n", "deadline: 2026-12-04T18:00:00Z\nwork: 48h\n"):
        spec = parse_job_spec(spec_text(text))
        back = from_stored(stored_form(spec), name="j", policy="p")
        assert back.deadline == spec.deadline and back.work == spec.work


def test_a_deadline_without_work_is_accepted_and_only_watched() -> None:
    spec = parse_job_spec(spec_text("deadline: 48h\n"))
    assert spec.deadline == 48 * 3600.0 and spec.work is None


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("deadline: soon\n", "j.yaml:5:11: deadline: 'soon' is neither a duration"),
        ("deadline: 2026-12-04T18:00:00\n", "has no time zone: write Z or an offset"),
        ("deadline: 0h\n", "a deadline after submit must be above 0"),
        ("deadline: 48h\nwork: 0h\n", "j.yaml:6:1: work.hours: must be > 0"),
        ("deadline: 48h\nwork: lots\n", "'lots' is not a duration"),
        ("deadline: 48h\nwork: {hours: 4, reference: 'a b'}\n", "work.reference"),
        ("work: 48h\n", "`work` is read only with a `deadline`"),
    ],
)
def test_bad_deadlines_and_work_are_located_errors(extra: str, expected: str) -> None:
    with pytest.raises(JobSpecError) as caught:
        parse_job_spec(spec_text(extra), path="j.yaml")
    problems = [str(p) for p in caught.value.problems]
    assert any(expected in p for p in problems), problems


# -- the Situation from the store ----------------------------------------------------------------


def add_job(store: Store, extra: str = "deadline: 10h\nwork: 5h\n") -> int:
    body = stored_form(parse_job_spec(spec_text(extra)))
    return store.jobs.add_job("j", "p", body, at=SUBMIT)


def add_attempt(
    store: Store, job: int, n: int, offer: Any, launched: datetime, **fields: Any
) -> None:
    store.jobs.create_attempt(job, n, f"{job}-{n}", offer, "h", launched)
    store.jobs.update_attempt(f"{job}-{n}", instance_id=f"i-{n}", **fields)


def test_the_situation_counts_the_time_run_and_the_measured_restart(store: Store) -> None:
    store.prices.record_offers([SPOT_A, SPOT_B, ON_DEMAND])
    job_id = add_job(store)
    # Spot in az1 from 10:00, its job from 10:05, interrupted at 11:00; then on-demand from
    # 11:10, its job from 11:15, still running at noon.
    add_attempt(
        store,
        job_id,
        1,
        SPOT_A,
        SUBMIT,
        job_started_at=SUBMIT + timedelta(minutes=5),
        ended_at=SUBMIT + timedelta(hours=1),
        end_reason=AttemptEnd.PREEMPTED,
        state=AttemptState.ENDED,
        preempted=True,
    )
    add_attempt(
        store,
        job_id,
        2,
        ON_DEMAND,
        SUBMIT + timedelta(minutes=70),
        job_started_at=SUBMIT + timedelta(minutes=75),
    )
    # az2 had no capacity a moment ago: it is not obtainable now.
    store.jobs.add_cooldown(SPOT_B.pool, NOW + timedelta(minutes=10), "capacity")
    job = store.jobs.get_job("j")
    assert job is not None
    offers = offered(store, job, POLICY, NOW, PassMemo())
    assert offers.spot == (SPOT_A.pool,) and offers.on_demand == (ON_DEMAND.pool,)

    s = situation(job, job_spec(job), store.jobs.attempts(job_id), POLICY, NOW, offers)
    assert s is not None
    assert s.elapsed_s == 2 * 3600 and s.deadline_s == 10 * 3600
    assert s.work_left_s == 5 * 3600 - (55 + 45) * 60  # work less the time its jobs ran
    assert s.overhead_s == 5 * 60  # measured: launch to job start, both times
    assert (s.running, s.zone) == (Use.ON_DEMAND, None)
    assert s.spot_now == frozenset({"use1-az1"})
    assert s.stats["use1-az1"].interruptions == 1
    assert s.stats["use1-az1"].observed_s == 3600
    assert (s.spot_price, s.on_demand_price) == (0.40, 1.0)


def test_other_jobs_runs_on_the_pools_it_could_use_tell_a_new_job_what_they_did(
    store: Store,
) -> None:
    store.prices.record_offers([SPOT_A, SPOT_B, ON_DEMAND])
    other = store.jobs.add_job("other", "p", {"run": "x"}, at=SUBMIT - timedelta(days=3))
    # Another job ran 20 h on az1's spot pool and was interrupted once; 5 h on az2 (cooled
    # now, so not a pool this job could launch in) says nothing about az1.
    add_attempt(
        store,
        other,
        1,
        SPOT_A,
        SUBMIT - timedelta(days=2),
        ended_at=SUBMIT - timedelta(days=2) + timedelta(hours=20),
        end_reason=AttemptEnd.PREEMPTED,
        state=AttemptState.ENDED,
        preempted=True,
    )
    add_attempt(
        store,
        other,
        2,
        SPOT_B,
        SUBMIT - timedelta(hours=30),
        ended_at=SUBMIT - timedelta(hours=25),
        state=AttemptState.ENDED,
    )
    store.jobs.add_cooldown(SPOT_B.pool, NOW + timedelta(minutes=10), "capacity")
    add_job(store)
    job = store.jobs.get_job("j")
    assert job is not None
    offers = offered(store, job, POLICY, NOW, PassMemo())
    fleet = store.jobs.attempts_since(NOW - timedelta(days=14))
    s = situation(job, job_spec(job), [], POLICY, NOW, offers, fleet=fleet)
    assert s is not None and set(s.stats) == {"use1-az1"}
    assert s.stats["use1-az1"].observed_s == 20 * 3600
    assert s.stats["use1-az1"].interruptions == 1
    # the job's own attempts and the same rows among the fleet's are counted once
    mine = store.jobs.attempts(other)
    s = situation(job, job_spec(job), mine, POLICY, NOW, offers, fleet=fleet)
    assert s is not None and s.stats["use1-az1"].observed_s == 20 * 3600


def test_without_measured_restarts_the_policys_overhead_is_used(store: Store) -> None:
    job_id = add_job(store)
    job = store.jobs.get_job("j")
    assert job is not None
    s = situation(job, job_spec(job), store.jobs.attempts(job_id), POLICY, NOW)
    assert s is not None and s.overhead_s == 15 * 60 and s.running is Use.WAIT
    assert s.work_left_s == 5 * 3600 and s.spot_now == frozenset()


def test_progress_with_a_total_tells_the_work_left_ahead_of_the_time_run(store: Store) -> None:
    job_id = add_job(store)
    job = store.jobs.get_job("j")
    assert job is not None
    attempts = store.jobs.attempts(job_id)
    # 7,000 of 10,000 steps at 1,500 steps/h: 2 h left, whatever `work: 5h` less the time run says
    measured = JobProgress(7000, 10000, NOW, 1500.0, "g4dn.xlarge")
    s = situation(job, job_spec(job), attempts, POLICY, NOW, progress=measured)
    assert s is not None and s.work_left_s == pytest.approx(2 * 3600)
    # no speed yet: that share of `work:`
    early = JobProgress(2500, 10000, NOW, None, None)
    s = situation(job, job_spec(job), attempts, POLICY, NOW, progress=early)
    assert s is not None and s.work_left_s == pytest.approx(0.75 * 5 * 3600)
    # no total: the progress says nothing of the work left
    open_ended = JobProgress(2500, None, NOW, 1500.0, "g4dn.xlarge")
    s = situation(job, job_spec(job), attempts, POLICY, NOW, progress=open_ended)
    assert s is not None and s.work_left_s == 5 * 3600


def test_a_job_without_work_has_no_situation_but_a_view(store: Store) -> None:
    add_job(store, "deadline: 1h\n")
    job = store.jobs.get_job("j")
    assert job is not None
    assert situation(job, job_spec(job), [], POLICY, NOW) is None
    view = deadline_view(store, job, POLICY, NOW)
    assert view is not None
    assert view["at"] == (SUBMIT + timedelta(hours=1)).isoformat()
    assert view["work_left_s"] is None and view["missed"] is True  # two hours in, still live
    assert "only watched for a missed deadline" in view["note"]


# -- the recovery seam ---------------------------------------------------------------------------


def short(running: Use = Use.WAIT) -> Situation:
    """Ten hours of deadline, two gone, 7.9 h of work left, a 15-minute restart: 6 min slack
    (less the restart unless on-demand), below one more restart."""
    return Situation(
        elapsed_s=2 * 3600,
        deadline_s=10 * 3600,
        work_left_s=7.9 * 3600 - 15 * 60,
        overhead_s=15 * 60,
        running=running,
        zone=None,
        spot_now=frozenset({"use1-az1"}),
    )


def test_the_seam_relaunches_on_demand_when_the_slack_is_short() -> None:
    decision = strategy().decide(short())
    assert decision.use is Use.ON_DEMAND and decision.at_risk
    seam = with_deadline(Failover(), markets_for(decision, POLICY), decision.reason)
    where = seam.after_failure(Failure.PREEMPTED, SPOT_A.pool, restarts=0, history=(), now=NOW)
    assert isinstance(where, Relaunch)
    assert where.markets == (Market.ON_DEMAND,) and where.avoid == frozenset({SPOT_A.pool})
    assert "deadline: slack" in where.note
    assert seam.while_pending((), NOW).markets == (Market.ON_DEMAND,)

    # The state machine asks the seam: an interrupted spot attempt relaunches on-demand.
    view = JobView(id=1, name="j", state=JobState.RUNNING)
    gone = AttemptView(
        number=1,
        key="1-1",
        pool=Pool(*SPOT_A.pool),
        launched_at=NOW - timedelta(hours=1),
        registered=True,
        probe_status="pass",
        job_started=True,
        instance_gone=True,
        preempted=True,
    )
    d = decide(view, gone, now=NOW, strategy=seam)
    launches = [a for a in d.actions if isinstance(a, Launch)]
    assert launches and launches[0].markets == (Market.ON_DEMAND,)


def test_with_slack_the_seam_keeps_spot_even_in_a_failover_fallback() -> None:
    roomy = Situation(
        elapsed_s=0,
        deadline_s=10 * 3600,
        work_left_s=3600,
        overhead_s=600,
        running=Use.WAIT,
        zone=None,
        spot_now=frozenset(),
    )
    decision = strategy().decide(roomy)
    assert decision.use is Use.WAIT and not decision.at_risk  # no spot now: wait for it
    eager = Failover(RecoverySettings(on_demand_after_interruptions=1))
    seam = with_deadline(eager, markets_for(decision, POLICY), decision.reason)
    history = ((Failure.PREEMPTED, NOW - timedelta(minutes=1)),)
    assert eager.while_pending(history, NOW).markets == (Market.ON_DEMAND,)
    assert seam.while_pending(history, NOW).markets == (Market.SPOT,)
    # A policy without on-demand keeps its own markets: the deadline cannot add one.
    spot_only = POLICY.model_copy(update={"markets": ["spot"]})
    assert markets_for(strategy().decide(short()), spot_only) is None


# -- the pass: moves and events ------------------------------------------------------------------


def context(store: Store, now: datetime) -> Any:
    return SimpleNamespace(
        store=store,
        now=now,
        policies={"p": SimpleNamespace(policy=POLICY)},
        memo=PassMemo(),
        emitter=Drafter(),
        jobs=tuple(store.jobs.jobs_page(limit=100)),
    )


def run_pass(deadlines: Deadlines, store: Store, now: datetime) -> PassView:
    ctx = context(store, now)
    view = PassView.read(ctx)
    deadlines(ctx, view)
    return view


def events(store: Store, kind: EventKind) -> list[Any]:
    return store.events.list_events(kind=kind.value)


def test_at_risk_is_raised_once_and_a_running_spot_job_is_moved_on_demand(store: Store) -> None:
    store.prices.record_offers([SPOT_A, ON_DEMAND])
    # Ten hours of deadline, 7.5 h of work, restarts measured at 15 minutes: on spot since
    # 10:15, so at noon 5.75 h left in 8 h, slack 8 - 5.75 - 0.25 = 2 h: spot is fine.
    job_id = add_job(store, "deadline: 10h\nwork: 7.5h\n")
    add_attempt(store, job_id, 1, SPOT_A, SUBMIT, job_started_at=SUBMIT + timedelta(minutes=15))
    store.jobs.transition_job(
        job_id, expected="pending", state="running", reason="r", restarts=None, events=[], at=SUBMIT
    )
    deadlines = Deadlines(Acting(lambda: "http://127.0.0.1:1"))
    view = run_pass(deadlines, store, NOW)
    watched = view.deadlines[job_id]
    assert watched.decision is not None and watched.decision.use is Use.SPOT
    assert job_id not in view.moves and events(store, EventKind.JOB_DEADLINE_AT_RISK) == []

    # Seen instead: the spot attempt was interrupted at 11:00 and spot came back only late;
    # the next spot job starts at 12:54, leaving 10 - 2.9 - 6.75 - 0.25 = 0.1 h of slack: at
    # risk, and moved to on-demand.
    store.jobs.update_attempt(
        f"{job_id}-1",
        ended_at=SUBMIT + timedelta(hours=1),
        end_reason=AttemptEnd.PREEMPTED,
        state=AttemptState.ENDED,
    )
    later = SUBMIT + timedelta(hours=2, minutes=54)
    add_attempt(store, job_id, 2, SPOT_A, later - timedelta(minutes=15), job_started_at=later)
    for _ in range(2):
        view = run_pass(deadlines, store, later)
    move = view.moves[job_id]
    assert move.reason is Reason.DEADLINE and move.targets == (ON_DEMAND.pool,)
    assert "deadline: slack" in move.message
    assert view.deadlines[job_id].markets == (Market.ON_DEMAND,)
    (risk,) = events(store, EventKind.JOB_DEADLINE_AT_RISK)
    assert risk.job_id == job_id and risk.data is not None
    assert risk.data["decision"] == "on_demand" and risk.data["slack_s"] < 15 * 60
    # Another replica (or a restarted daemon) does not raise it again either.
    run_pass(Deadlines(Acting(lambda: "http://127.0.0.1:1")), store, later)
    assert len(events(store, EventKind.JOB_DEADLINE_AT_RISK)) == 1
    assert events(store, EventKind.JOB_DEADLINE_MISSED) == []


def test_missed_is_raised_once_for_a_live_job_past_its_deadline(store: Store) -> None:
    store.prices.record_offers([SPOT_A, ON_DEMAND])
    job_id = add_job(store, "deadline: 1h\nwork: 2h\n")
    deadlines = Deadlines(Acting(lambda: "http://127.0.0.1:1"))
    for minutes in (0, 1, 2):
        run_pass(deadlines, store, NOW + timedelta(minutes=minutes))
    (missed,) = events(store, EventKind.JOB_DEADLINE_MISSED)
    assert missed.job_id == job_id and missed.severity == "error"
    assert missed.data is not None and missed.data["work_left_s"] == 2 * 3600
    # Infeasible from the start: at risk too, once.
    assert len(events(store, EventKind.JOB_DEADLINE_AT_RISK)) == 1


def test_an_on_demand_job_goes_back_to_spot_when_the_slack_returns(store: Store) -> None:
    store.prices.record_offers([SPOT_A, ON_DEMAND])
    job_id = add_job(store, "deadline: 10h\nwork: 3h\n")
    add_attempt(store, job_id, 1, ON_DEMAND, SUBMIT, job_started_at=SUBMIT)
    store.jobs.transition_job(
        job_id, expected="pending", state="running", reason="r", restarts=None, events=[], at=SUBMIT
    )
    view = run_pass(Deadlines(Acting(lambda: "http://127.0.0.1:1")), store, NOW)
    move = view.moves[job_id]
    assert move.reason is Reason.DEADLINE and move.targets == (SPOT_A.pool,)
    assert view.deadlines[job_id].markets == (Market.SPOT,)


def test_offered_reads_nothing_for_a_market_the_policy_does_not_allow(store: Store) -> None:
    store.prices.record_offers([SPOT_A, ON_DEMAND])
    add_job(store)
    job = store.jobs.get_job("j")
    assert job is not None
    spot_only = POLICY.model_copy(update={"markets": ["spot"]})
    assert offered(store, job, spot_only, NOW) == Offered(spot=(SPOT_A.pool,), spot_usd=0.40)


def test_jobs_show_says_the_deadline_the_slack_and_the_risk() -> None:
    from optimizer.answers import DeadlineView
    from optimizer.cli.jobs import deadline_line

    risky = DeadlineView(
        at="2026-12-04T18:00:00+00:00",
        work_left_s=3.1 * 3600,
        slack_s=600,
        at_risk=True,
        missed=False,
    )
    assert deadline_line(risky) == (
        "deadline: 2026-12-04 18:00 UTC; work left 3.1 h, slack 10 min (at risk)"
    )
    watched = DeadlineView(
        at="2026-12-04T18:00:00+00:00", work_left_s=None, slack_s=None, at_risk=False, missed=True
    )
    assert deadline_line(watched) == (
        "deadline: 2026-12-04 18:00 UTC; work left unknown (watched for a miss only) (missed)"
    )


class Launches:
    """A provider whose launches succeed and are remembered (market, zone)."""

    name = "aws"

    def __init__(self) -> None:
        self.launched: list[tuple[str, str | None]] = []

    def launch(self, offer: Any, spec: Any, key: str) -> Any:
        from providers.base import InstanceRef

        self.launched.append((offer.market.value, offer.zone))
        return InstanceRef("aws", offer.region, offer.zone or "use1-az1", f"i-{key}")


def test_the_reconciler_launches_a_pending_job_on_the_market_its_deadline_chose(
    store: Store,
) -> None:
    from optimizer.daemon.config import ProviderConfig
    from optimizer.daemon.providers import ProviderHandle
    from optimizer.jobs.reconcile import JobReconciler

    store.prices.record_offers([SPOT_A, ON_DEMAND])
    # Two hours in, 7.9 h of work left of a 10 h deadline: only on-demand meets it.
    job_id = add_job(store, "deadline: 10h\nwork: 7.9h\n")
    source = Launches()
    reconciler = JobReconciler(lambda: "http://127.0.0.1:1")
    ctx = context(store, NOW)
    ctx.providers = {"aws": ProviderHandle.given("aws", ProviderConfig(), source)}
    ctx.leading = lambda: True
    view = PassView.read(ctx)
    reconciler.deadlines(ctx, view)
    reconciler.per_job(ctx, view)
    assert source.launched == [("on_demand", None)]  # not the cheaper spot offer
    (attempt,) = store.jobs.attempts(job_id)
    assert attempt.market == "on_demand"
    job = store.jobs.get_job("j")
    assert job is not None and job.state == "provisioning"
