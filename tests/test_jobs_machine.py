"""The job state machine, decision by decision (pure: no store, no clock, no processes)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from optimizer.clock import ManualClock
from optimizer.jobs.gang import fold
from optimizer.jobs.handover import (
    FENCE_CLOCK_MARGIN,
    LeaveToCloud,
    fence,
    handover,
    leftover,
    lifted_on_clock,
    reclaim,
)
from optimizer.jobs.machine import (
    Alert,
    AttemptView,
    Cooldown,
    Decision,
    JobView,
    Launch,
    Stop,
    Terminate,
    decide,
    finished_on,
)
from optimizer.jobs.recovery import Failover, Failure, RecoverySettings
from optimizer.lifecycle import TERMINAL_JOB_STATES as TERMINAL
from optimizer.lifecycle import JobState
from optimizer.model import EventKind, Market
from optimizer.protocol import power_off_time
from tests.helpers.machine_views import NOW, POOL, attempt

SETTINGS = RecoverySettings(
    max_restarts=3, pool_cooldown=timedelta(minutes=10), on_demand_after_interruptions=2
)
REC = Failover(SETTINGS)


def preempted(*at: datetime) -> tuple[tuple[Failure, datetime], ...]:
    return tuple((Failure.PREEMPTED, t) for t in at)


def job(**changes: Any) -> JobView:
    return replace(JobView(id=7, name="train", state=JobState.RUNNING, probes="quick"), **changes)


def kinds(decision: Decision) -> list[str]:
    return [type(a).__name__ for a in decision.actions]


def test_a_new_job_asks_for_a_launch() -> None:
    d = decide(job(state=JobState.PENDING), None, now=NOW, strategy=REC)
    assert d.state is JobState.PENDING and d.actions == (Launch(),)


@pytest.mark.parametrize(
    ("observed", "state"),
    [
        ({"registered": False, "probe_status": None, "job_started": False}, "provisioning"),
        ({"registered": True, "probe_status": None, "job_started": False}, "probing"),
        ({"registered": True, "probe_status": "pass", "job_started": False}, "probing"),
        ({"registered": True, "probe_status": "warn", "job_started": True}, "running"),
    ],
)
def test_progress_follows_the_agent(observed: dict[str, Any], state: str) -> None:
    d = decide(job(state=JobState.PROVISIONING), attempt(**observed), now=NOW, strategy=REC)
    assert d.state == state and d.actions == ()


def test_no_probe_jobs_skip_probing() -> None:
    waiting = attempt(probe_status=None, job_started=False)
    assert decide(job(probes="none"), waiting, now=NOW, strategy=REC).state == "provisioning"


def test_exit_zero_succeeds_and_frees_the_instance() -> None:
    d = decide(job(), attempt(exit_code=0), now=NOW, strategy=REC)
    assert d.state is JobState.SUCCEEDED and d.end_attempt == "succeeded"
    assert Terminate("7-1", "job finished") in d.actions


def test_nonzero_exit_fails_the_job_without_relaunch() -> None:
    d = decide(job(), attempt(exit_code=2), now=NOW, strategy=REC)
    assert d.state is JobState.FAILED and not d.launches
    assert any(isinstance(a, Alert) and a.severity == "error" for a in d.actions)


@pytest.mark.parametrize(
    ("phase", "error", "said"),
    [
        ("setup", "ERROR: No module named 'x'", "setup exited 1: ERROR: No module named 'x'"),
        (
            "run",
            "RuntimeError: CUDA out of memory",
            "job exited 1: RuntimeError: CUDA out of memory",
        ),
        (None, None, "job exited 1"),
        ("setup", None, "setup exited 1"),
        ("code", "sha256 mismatch", "code failed: sha256 mismatch"),
    ],
)
def test_a_failure_says_which_phase_failed_and_its_last_stderr_line(
    phase: str | None, error: str | None, said: str
) -> None:
    d = decide(
        job(), attempt(exit_code=1, exit_phase=phase, exit_error=error), now=NOW, strategy=REC
    )
    assert d.state is JobState.FAILED and d.reason == said
    alerts = [a for a in d.actions if isinstance(a, Alert)]
    assert [a.message for a in alerts] == [f"job {job().name}: {said}"]


def test_a_gang_fails_with_the_failing_nodes_phase_and_error() -> None:
    ok = attempt(exit_code=0)
    bad = replace(attempt(exit_code=1, exit_phase="setup", exit_error="boom"), key="7-1-1")
    folded = fold([ok, bad])
    assert (folded.exit_code, folded.exit_phase, folded.exit_error) == (1, "setup", "boom")


def test_interruption_notice_cools_the_pool_and_relaunches_elsewhere_hot() -> None:
    d = decide(job(), attempt(interruption_notice_at=NOW), now=NOW, strategy=REC)
    assert d.state is JobState.PROVISIONING
    assert d.restarts == 1 and d.end_attempt == "preempted"
    # the old job keeps running while the replacement boots (`handover` stops it)
    assert kinds(d) == ["Cooldown", "Launch", "Alert"]
    reason = "spot capacity reclaimed on aws eu-west-1/euw1-az1 p4d.24xlarge spot"
    assert d.actions[0] == Cooldown(POOL, NOW + timedelta(minutes=10), reason)
    assert d.actions[1] == Launch(avoid=frozenset({POOL}), markets=None)


def test_the_old_job_is_stopped_when_its_replacement_is_ready_or_the_power_off_is_near() -> None:
    old = attempt(interruption_notice_at=NOW, power_off_at=NOW + timedelta(minutes=2))
    booting = attempt(number=2, key="7-2", registered=False, probe_status=None, job_started=False)
    probing = replace(booting, registered=True)
    ready = replace(probing, probe_status="pass")
    allowance = timedelta(seconds=20)

    def stop(new: AttemptView | None, at: datetime, probes: str = "quick") -> Stop | None:
        return handover(old, new, now=at, probes=probes, allowance=allowance)

    assert stop(booting, NOW) is None and stop(probing, NOW) is None and stop(None, NOW) is None
    assert stop(ready, NOW) == Stop("7-1", "interrupted; attempt 2 is ready to take over")
    assert stop(probing, NOW, probes="none") is not None  # no probe: ready once registered
    near = Stop("7-1", "interrupted; the power-off is near")
    assert stop(booting, NOW + timedelta(seconds=99)) is None
    assert stop(booting, NOW + timedelta(seconds=100)) == near  # 2 min less the allowance
    # stopped already, gone, exited: nothing more; a job that never started: at once
    assert handover(replace(old, stop_sent=True), ready, now=NOW, probes="quick") is None
    assert handover(replace(old, instance_gone=True), ready, now=NOW, probes="quick") is None
    assert handover(replace(old, exit_code=143), ready, now=NOW, probes="quick") is None
    unstarted = replace(old, job_started=False)
    assert handover(unstarted, None, now=NOW, probes="quick") is not None


def test_an_exit_after_the_notice_is_still_an_interruption() -> None:
    # the job exits 143 on the SIGTERM the stop sends: that is not a job failure
    observed = attempt(interruption_notice_at=NOW, exit_code=143, stop_sent=True)
    d = decide(job(), observed, now=NOW, strategy=REC)
    assert d.state is JobState.PROVISIONING and d.launches
    assert not any(isinstance(a, Stop) for a in d.actions)


def test_preemption_seen_only_by_describe_relaunches_too() -> None:
    d = decide(job(), attempt(instance_gone=True, preempted=True), now=NOW, strategy=REC)
    assert d.state is JobState.PROVISIONING and d.launches
    assert not any(isinstance(a, Stop | Terminate) for a in d.actions)  # nothing left to stop


def test_failed_probe_terminates_and_relaunches_on_another_pool() -> None:
    sick = attempt(probe_status="fail", job_started=False)
    d = decide(job(state=JobState.PROBING), sick, now=NOW, strategy=REC)
    assert d.state is JobState.PROVISIONING and d.end_attempt == "probe_failed"
    assert isinstance(d.actions[0], Terminate)
    assert Launch(avoid=frozenset({POOL})) in d.actions


def test_an_agent_that_never_checks_in_is_replaced() -> None:
    silent = attempt(
        registered=False,
        probe_status=None,
        job_started=False,
        launched_at=NOW - timedelta(minutes=11),
    )
    d = decide(job(state=JobState.PROVISIONING), silent, now=NOW, strategy=REC)
    assert d.end_attempt == "not_registered" and d.launches
    young = replace(silent, launched_at=NOW - timedelta(minutes=9))
    assert not decide(job(state=JobState.PROVISIONING), young, now=NOW, strategy=REC).launches


def test_restart_limit_fails_the_job() -> None:
    d = decide(job(restarts=3), attempt(interruption_notice_at=NOW), now=NOW, strategy=REC)
    assert d.state is JobState.FAILED and not d.launches and d.restarts == 4
    assert "restart limit 3" in d.reason


def test_repeated_interruptions_fall_back_to_on_demand() -> None:
    def launch_of(decision: Decision) -> Launch:
        return next(a for a in decision.actions if isinstance(a, Launch))

    earlier = (NOW - timedelta(minutes=20),)
    notice = attempt(interruption_notice_at=NOW)
    d = decide(job(failures=preempted(*earlier), restarts=1), notice, now=NOW, strategy=REC)
    assert launch_of(d).markets == (Market.ON_DEMAND,) and "on-demand" in d.reason
    old = (NOW - timedelta(hours=2),)
    d = decide(job(failures=preempted(*old), restarts=1), notice, now=NOW, strategy=REC)
    assert launch_of(d).markets is None
    no_on_demand = Failover(replace(SETTINGS, on_demand_allowed=False))
    d = decide(job(failures=preempted(*earlier)), notice, now=NOW, strategy=no_on_demand)
    assert launch_of(d).markets is None


def test_a_job_left_pending_by_the_fallback_still_launches_on_demand() -> None:
    # the on-demand relaunch found no offer, so the job waits with no open attempt
    twice = (NOW - timedelta(minutes=20), NOW - timedelta(minutes=1))
    d = decide(job(state=JobState.PENDING, failures=preempted(*twice)), None, now=NOW, strategy=REC)
    assert d.actions == (Launch(markets=(Market.ON_DEMAND,)),) and "on-demand" in d.reason
    once = twice[1:]
    d = decide(job(state=JobState.PENDING, failures=preempted(*once)), None, now=NOW, strategy=REC)
    assert d.actions == (Launch(),)
    later = NOW + timedelta(hours=1, minutes=1)  # both interruptions are out of the window
    d = decide(
        job(state=JobState.PENDING, failures=preempted(*twice)), None, now=later, strategy=REC
    )
    assert d.actions == (Launch(),)


def test_cancel_terminates_and_ends() -> None:
    d = decide(job(cancel_requested=True), attempt(), now=NOW, strategy=REC)
    assert d.state is JobState.CANCELLED and Terminate("7-1", "job cancelled") in d.actions
    d = decide(job(state=JobState.PENDING, cancel_requested=True), None, now=NOW, strategy=REC)
    assert d.state is JobState.CANCELLED and kinds(d) == ["Alert"]


def test_leftover_instances_are_terminated_after_the_job_exits_or_the_grace() -> None:
    ended = attempt(interruption_notice_at=NOW, stop_sent=True)
    grace = timedelta(seconds=30)
    assert leftover(ended, stop_sent_at=NOW, now=NOW + timedelta(seconds=5), grace=grace) is None
    assert leftover(ended, stop_sent_at=NOW, now=NOW + grace, grace=grace) is not None
    exited = replace(ended, exit_code=143)
    assert leftover(exited, stop_sent_at=NOW, now=NOW, grace=grace) is not None
    gone = replace(ended, instance_gone=True)
    assert leftover(gone, stop_sent_at=None, now=NOW, grace=grace) is None


observations = st.builds(
    AttemptView,
    number=st.just(1),
    key=st.just("7-1"),
    pool=st.just(POOL),
    launched_at=st.sampled_from([NOW, NOW - timedelta(hours=1)]),
    registered=st.booleans(),
    probe_status=st.sampled_from([None, "pass", "warn", "fail"]),
    job_started=st.booleans(),
    exit_code=st.sampled_from([None, 0, 1, 143]),
    interruption_notice_at=st.sampled_from([None, NOW]),
    instance_gone=st.booleans(),
    preempted=st.booleans(),
    stop_sent=st.booleans(),
)


@given(
    observed=observations,
    state=st.sampled_from(list(JobState)),
    restarts=st.integers(0, 5),
    cancel=st.booleans(),
)
def test_decisions_are_deterministic_and_consistent(
    observed: AttemptView, state: JobState, restarts: int, cancel: bool
) -> None:
    view = job(state=state, restarts=restarts, cancel_requested=cancel)
    first = decide(view, observed, now=NOW, strategy=REC)
    assert first == decide(view, observed, now=NOW, strategy=REC)
    if state in TERMINAL:
        assert first.state is state and first.actions == ()
    if first.state in TERMINAL:
        assert not first.launches  # a finished job never launches
    if first.launches:
        assert first.restarts == restarts + 1 and first.restarts <= SETTINGS.max_restarts
        assert any(isinstance(a, Cooldown) for a in first.actions)


def test_the_fallback_reason_names_the_configured_window() -> None:
    twice = (NOW - timedelta(minutes=20), NOW - timedelta(minutes=1))
    for window, said in (
        (timedelta(hours=1), "2 interruptions within an hour"),
        (timedelta(minutes=30), "2 interruptions within 30 minutes"),
        (timedelta(hours=6), "2 interruptions within 6 hours"),
    ):
        rec = Failover(replace(SETTINGS, on_demand_window=window))
        d = decide(
            job(state=JobState.PENDING, failures=preempted(*twice)), None, now=NOW, strategy=rec
        )
        assert f"{said}: falling back to on-demand" in d.reason


def test_the_fence_holds_while_an_earlier_job_runs_and_lifts_when_it_is_over() -> None:
    running = attempt(interruption_notice_at=NOW, power_off_at=NOW + timedelta(seconds=90))
    assert fence([running], now=NOW) == "attempt 1's job has not exited yet"
    assert fence([replace(running, exit_code=143)], now=NOW) is None
    assert fence([replace(running, instance_gone=True)], now=NOW) is None
    assert fence([replace(running, job_started=False)], now=NOW) is None  # never ran
    # no notice and no exit (a lost attempt not yet seen gone): the fence holds
    assert fence([attempt()], now=NOW + timedelta(days=1)) is not None
    assert fence([], now=NOW) is None


def test_the_fence_holds_past_the_power_off_until_the_old_job_exits_or_its_instance_goes() -> None:
    """The announced power-off is not the old job's end: a job still checkpointing then would
    share its checkpoint folder with the replacement."""
    off = NOW + timedelta(seconds=6)
    old = attempt(interruption_notice_at=NOW, power_off_at=off)
    for later in (timedelta(0), timedelta(seconds=1), timedelta(minutes=4, seconds=59)):
        assert fence([old], now=off + later) == "attempt 1's job has not exited yet"
        assert lifted_on_clock([old], now=off + later) == []
    assert fence([replace(old, exit_code=143)], now=off) is None  # job_exited
    assert fence([replace(old, instance_gone=True)], now=off) is None  # describe: TERMINATED
    # both silent: the clock lets go only FENCE_CLOCK_MARGIN after the power-off, and says so
    late = off + FENCE_CLOCK_MARGIN
    assert fence([old], now=late) is None
    assert lifted_on_clock([old], now=late) == [old]
    assert lifted_on_clock([replace(old, exit_code=0)], now=late) == []  # it did exit
    # a move announces no power-off: only the exit or the instance's end lifts it
    moved = attempt(migrated=True)
    assert fence([moved], now=NOW + timedelta(days=1)) is not None


def test_a_final_checkpoint_in_the_bucket_lifts_the_fence_and_the_clock_lets_nothing_go() -> None:
    """A job syncing to a bucket: once the old attempt's final checkpoint is committed
    there, the replacement may restore it and start; the old job may still be exiting."""
    off = NOW + timedelta(seconds=90)
    old = attempt(interruption_notice_at=NOW, power_off_at=off)
    assert fence([replace(old, final_checkpoint=True)], now=NOW) is None
    assert (
        lifted_on_clock([replace(old, final_checkpoint=True)], now=off + FENCE_CLOCK_MARGIN) == []
    )
    assert fence([old, replace(old, number=2, key="7-2")], now=NOW) is not None
    moved = attempt(migrated=True, final_checkpoint=True)
    assert fence([moved], now=NOW) is None


def test_a_job_that_finishes_during_its_handover_succeeds_and_its_replacement_never_runs() -> None:
    moved = attempt(migrated=True, exit_code=0, finished=True)
    noticed = attempt(interruption_notice_at=NOW, exit_code=0, finished=True)
    assert finished_on([moved]) == moved and finished_on([noticed]) == noticed
    assert fence([moved], now=NOW) == "attempt 1's job has finished"
    # exit 0 after its stop: it only checkpointed; nothing to do with a handover: not this rule
    for other in (replace(moved, finished=False), attempt(exit_code=0, finished=True)):
        assert finished_on([other]) is None and fence([other], now=NOW) is None
    # the replacement, fenced: ended without running the job, which succeeded
    fenced = attempt(number=2, key="7-2", job_started=False)
    moving = job(state=JobState.PROVISIONING, restarts=1, migrations=1, finished_on=1)
    d = decide(moving, fenced, now=NOW, strategy=REC)
    assert d.state is JobState.SUCCEEDED and d.end_attempt == "finished_earlier"
    assert d.restarts is None and not d.launches
    assert Terminate("7-2", "the job finished on attempt 1") in d.actions
    [alert] = [a for a in d.actions if isinstance(a, Alert)]
    assert alert.kind is EventKind.JOB_SUCCEEDED
    assert "finished on attempt 1, before its replacement started it" in alert.message
    # no replacement launched yet (none found): it succeeds all the same, nothing to end
    d = decide(job(state=JobState.PENDING, finished_on=1), None, now=NOW, strategy=REC)
    assert d.state is JobState.SUCCEEDED and kinds(d) == ["Alert"] and d.end_attempt is None


def test_an_older_attempts_finish_never_ends_the_job_a_later_attempt_started() -> None:
    moved = attempt(migrated=True, exit_code=0, finished=True)
    fenced = attempt(number=2, key="7-2", job_started=False)
    assert finished_on([moved, fenced]) == moved  # the hot handover: the old job finished it
    started = replace(fenced, job_started=True)
    assert finished_on([moved, started]) is None
    # A third attempt waits for attempt 2's job, not for good on attempt 1's finish.
    assert fence([moved, started], now=NOW) == "attempt 2's job has not exited yet"
    # A later attempt that only launched, or an earlier one that started, changes nothing.
    before = attempt(number=0, key="7-0", job_started=True)
    assert finished_on([before, moved, fenced]) == moved


def test_power_off_time_follows_the_notice() -> None:
    at = "2026-11-30T12:02:00Z"
    assert power_off_time({"action": "terminate", "time": at}, NOW) == NOW + timedelta(minutes=2)
    # GCP's time is when the agent saw the preemption: 30 s later the instance goes
    seen = {"action": "preempted", "time": "2026-11-30T12:00:00Z"}
    assert power_off_time(seen, NOW) == NOW + timedelta(seconds=30)
    assert power_off_time({"action": "rebalance", "time": at}, NOW) is None
    assert power_off_time({"action": "terminate", "time": "soon"}, NOW) == NOW + timedelta(
        minutes=2
    )


# --- who ends an interrupted instance: gpuopt, or the cloud ----------------------------------

HOUR = timedelta(hours=1)  # AWS: a spot instance EC2 interrupts in its first hour is free
MINUTE = timedelta(minutes=1)  # GCP: one preempted in its first minute is
GRACE = timedelta(seconds=45)
MARGIN = timedelta(minutes=2)


def timeline(
    *,
    launched: timedelta,
    warning: timedelta = timedelta(minutes=2),
    exits: timedelta | None = timedelta(seconds=30),
    free_window: timedelta | None = HOUR,
    preempting: bool = False,
    until: timedelta = timedelta(minutes=10),
    step: timedelta = timedelta(seconds=1),
) -> list[tuple[timedelta, str]]:
    """Every reconcile pass from the notice on, one `step` apart, on a ManualClock: the
    decision of each pass as (time since the notice, what), wherever it changes. The
    instance was launched `launched` before the notice, the power-off is `warning` after it,
    the job (stopped at the notice) exits `exits` after it (None: never); gpuopt's terminate
    takes effect at once, and the cloud powers the instance off at the power-off."""
    clock = ManualClock(NOW)
    notice = clock()
    off = notice + warning
    view = attempt(
        launched_at=notice - launched - timedelta(minutes=3),  # gpuopt's start, before launch
        instance_launched_at=notice - launched,
        interruption_notice_at=notice,
        power_off_at=off,
        stop_sent=True,
    )
    seen: list[tuple[timedelta, str]] = []
    while clock() - notice <= until:
        now = clock()
        if exits is not None and now - notice >= exits:
            view = replace(view, exit_code=143)
        if now >= off:  # the cloud's own power-off
            view = replace(view, instance_gone=True)
        got = reclaim(
            view,
            stop_sent_at=notice,
            now=now,
            grace=GRACE,
            free_window=free_window,
            preempting=preempting,
            margin=MARGIN,
        )
        what = "none" if got is None else type(got).__name__
        if isinstance(got, LeaveToCloud):
            assert (got.at, got.until) == (off, off + MARGIN) and now < got.until
        if not seen or seen[-1][1] != what:
            seen.append((now - notice, what))
        if isinstance(got, Terminate):
            view = replace(view, instance_gone=True)  # gpuopt's terminate ends it
        clock.advance(step.total_seconds())
    return seen


def test_an_aws_spot_instance_in_its_first_hour_is_left_for_ec2_to_end() -> None:
    # Launched 10 minutes before the notice: EC2's interruption is free, gpuopt's terminate
    # would bill 12 minutes; so gpuopt leaves it, before and after the job exits.
    assert timeline(launched=timedelta(minutes=10)) == [
        (timedelta(0), "LeaveToCloud"),
        (timedelta(minutes=2), "none"),  # EC2 powered it off
    ]
    # 57:59 after the launch, the power-off is still in the first hour.
    assert timeline(launched=timedelta(minutes=55, seconds=59))[0][1] == "LeaveToCloud"


def test_a_power_off_past_the_first_hour_is_not_waited_for() -> None:
    # EC2's interruption at 60:00 or later bills every second up to it: terminate as soon as
    # the job has exited, as before.
    assert timeline(launched=timedelta(minutes=58)) == [
        (timedelta(0), "none"),
        (timedelta(seconds=30), "Terminate"),
        (timedelta(seconds=31), "none"),
    ]
    # A long grace that carries the instance past its hour: the same.
    assert timeline(launched=timedelta(minutes=50), warning=timedelta(minutes=15)) == [
        (timedelta(0), "none"),
        (timedelta(seconds=30), "Terminate"),
        (timedelta(seconds=31), "none"),
    ]
    # ... and a job that never exits is terminated when the stop's grace is over.
    never = timeline(launched=timedelta(minutes=50), warning=timedelta(minutes=15), exits=None)
    assert never[:2] == [(timedelta(0), "none"), (GRACE, "Terminate")]


def test_an_instance_the_cloud_does_not_end_is_terminated_after_the_margin() -> None:
    clock = ManualClock(NOW)
    off = NOW + timedelta(minutes=2)
    view = attempt(
        interruption_notice_at=NOW,
        power_off_at=off,
        instance_launched_at=NOW - timedelta(minutes=10),
        stop_sent=True,
    )
    decisions = []
    while clock() <= off + MARGIN + timedelta(seconds=5):
        decisions.append(
            (
                clock(),
                reclaim(
                    view,
                    stop_sent_at=NOW,
                    now=clock(),
                    grace=GRACE,
                    free_window=HOUR,
                    margin=MARGIN,
                ),
            )
        )
        clock.advance(1)
    left = [t for t, d in decisions if isinstance(d, LeaveToCloud)]
    ended = [t for t, d in decisions if isinstance(d, Terminate)]
    assert left == [t for t, _ in decisions if t < off + MARGIN]  # the job never exited
    assert ended[0] == off + MARGIN and len(ended) == 6  # nothing leaks


def test_a_gcp_preemption_is_left_to_gcp_whatever_the_age() -> None:
    # The first minute's credit is long gone, but the VM is already being stopped: deleting
    # it would only race GCP's own end.
    gcp = timeline(
        launched=timedelta(minutes=30),
        warning=timedelta(seconds=30),
        free_window=MINUTE,
        preempting=True,
        exits=timedelta(seconds=10),
    )
    assert gcp == [(timedelta(0), "LeaveToCloud"), (timedelta(seconds=30), "none")]
    # Preempted 20 s after its creation: free, and left to GCP for that reason too.
    young = attempt(
        interruption_notice_at=NOW,
        power_off_at=NOW + timedelta(seconds=30),
        instance_launched_at=NOW - timedelta(seconds=20),
    )
    left = reclaim(young, stop_sent_at=None, now=NOW, grace=GRACE, free_window=MINUTE)
    assert isinstance(left, LeaveToCloud) and "50 s after the launch" in left.reason


def test_without_a_credit_or_a_power_off_the_leftover_rule_applies() -> None:
    exited = attempt(
        interruption_notice_at=NOW,
        power_off_at=NOW + timedelta(minutes=2),
        instance_launched_at=NOW - timedelta(minutes=5),
        exit_code=143,
    )
    # on-demand (no credit anywhere): terminate once the job exited
    got = reclaim(exited, stop_sent_at=NOW, now=NOW, grace=GRACE, free_window=None)
    assert isinstance(got, Terminate)
    # a rebalance recommendation announces no power-off: the same
    hint = replace(exited, power_off_at=None)
    assert isinstance(
        reclaim(hint, stop_sent_at=NOW, now=NOW, grace=GRACE, free_window=HOUR), Terminate
    )
    # an instance already gone needs nothing
    gone = replace(exited, instance_gone=True)
    assert reclaim(gone, stop_sent_at=NOW, now=NOW, grace=GRACE, free_window=HOUR) is None


def test_the_launch_is_the_providers_when_known_else_the_attempts_start() -> None:
    notice = attempt(interruption_notice_at=NOW, power_off_at=NOW + timedelta(minutes=2))
    # gpuopt started the attempt 70 minutes before the power-off, the instance ran 30
    started_early = replace(
        notice,
        launched_at=NOW - timedelta(minutes=68),
        instance_launched_at=NOW - timedelta(minutes=28),
    )
    left = reclaim(started_early, stop_sent_at=None, now=NOW, grace=GRACE, free_window=HOUR)
    assert isinstance(left, LeaveToCloud) and "30 min after the launch" in left.reason
    # without the provider's time, the attempt's start: 70 minutes, no credit, so the job's
    # stop runs its course and the instance is terminated once it has exited
    unknown = replace(started_early, instance_launched_at=None)
    assert reclaim(unknown, stop_sent_at=NOW, now=NOW, grace=GRACE, free_window=HOUR) is None
    done = replace(unknown, exit_code=143)
    assert isinstance(
        reclaim(done, stop_sent_at=NOW, now=NOW, grace=GRACE, free_window=HOUR), Terminate
    )


@given(
    observed=observations,
    launched_min=st.integers(0, 180),
    warning_s=st.integers(0, 3600),
    now_s=st.integers(0, 7200),
    free=st.sampled_from([None, MINUTE, HOUR]),
    preempting=st.booleans(),
)
def test_reclaim_leaves_only_a_running_instance_and_only_until_its_deadline(
    observed: AttemptView,
    launched_min: int,
    warning_s: int,
    now_s: int,
    free: timedelta | None,
    preempting: bool,
) -> None:
    off = NOW + timedelta(seconds=warning_s)
    view = replace(
        observed,
        power_off_at=off,
        instance_launched_at=NOW - timedelta(minutes=launched_min),
    )
    now = NOW + timedelta(seconds=now_s)
    got = reclaim(
        view, stop_sent_at=NOW, now=now, grace=GRACE, free_window=free, preempting=preempting
    )
    if view.instance_gone:
        assert got is None
    elif isinstance(got, LeaveToCloud):
        credit = free is not None and off - view.instance_launched_at < free
        assert (credit or preempting) and now < off + MARGIN == got.until
    elif (free is not None and off - view.instance_launched_at < free) or preempting:
        assert isinstance(got, Terminate) and now >= off + MARGIN
    else:
        assert got == leftover(view, stop_sent_at=NOW, now=now, grace=GRACE)
