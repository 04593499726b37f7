"""Utilization rules and max_duration: the pure decision (optimizer/jobs/utilization.py) and
the state machine's stop (machine.decide), on fixed times."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from optimizer.jobs.machine import (
    Alert,
    AttemptView,
    JobView,
    PolicyStop,
    Stop,
    decide,
)
from optimizer.jobs.utilization import (
    GAP,
    Rule,
    Rules,
    Sample,
    below_for,
    overran,
    rules_for,
    watch,
)
from optimizer.lifecycle import JobState
from optimizer.model import EventKind
from policies.loader import PolicyError, parse_policy

T0 = datetime(2026, 11, 30, 12, tzinfo=UTC)
MIN = timedelta(minutes=1)
SECOND = timedelta(seconds=1)
IDLE = Rule("idle", 0.05, timedelta(minutes=20), "stop")
LOW = Rule("low", 0.60, timedelta(minutes=30), "alert")


def minutes(utils: list[float | None], start: datetime = T0) -> list[Sample]:
    """Per-minute samples from `start`, one utilization each."""
    return [Sample(start + i * MIN, MIN, u) for i, u in enumerate(utils)]


def test_a_window_all_below_fires_with_its_bounds_and_peak() -> None:
    samples = minutes([0.03] * 20)
    fired = below_for(samples, IDLE, started_at=T0, now=T0 + 20 * MIN)
    assert fired is not None
    assert (fired.start, fired.end, fired.peak) == (T0, T0 + 20 * MIN, 0.03)
    assert "below 5% for 20m" in fired.message


def test_less_coverage_than_the_window_since_the_job_started_does_not_fire() -> None:
    samples = minutes([0.0] * 19)
    assert below_for(samples, IDLE, started_at=T0, now=T0 + 30 * MIN) is None
    # Readings from before the job started (the probe's) do not count as coverage.
    early = minutes([0.0] * 25, start=T0 - 5 * MIN)
    assert below_for(early, IDLE, started_at=T0, now=T0 + 20 * MIN) is not None
    assert below_for(early[:24], IDLE, started_at=T0, now=T0 + 20 * MIN) is None


def test_one_reading_at_or_above_the_threshold_in_the_window_keeps_it_quiet() -> None:
    utils: list[float | None] = [0.01] * 20
    utils[7] = 0.05  # "below" is strict
    assert below_for(minutes(utils), IDLE, started_at=T0, now=T0 + 20 * MIN) is None
    # Once the busy minute has left the window, it fires.
    later = minutes([*utils, *[0.01] * 8])
    fired = below_for(later, IDLE, started_at=T0, now=T0 + 28 * MIN)
    assert fired is not None and fired.start == T0 + 8 * MIN


def test_a_gap_in_the_readings_breaks_coverage_but_a_small_one_does_not() -> None:
    samples = [s for i, s in enumerate(minutes([0.0] * 20)) if i != 10]
    assert below_for(samples, IDLE, started_at=T0, now=T0 + 20 * MIN) is None
    # Spans a second apart (agents close them on their own clock) still cover.
    jittered = [Sample(T0 + i * (MIN + GAP / 2), MIN, 0.0) for i in range(21)]
    assert below_for(jittered, IDLE, started_at=T0, now=T0 + 25 * MIN) is not None
    # A span without a reading (no GPU) is no evidence either way.
    blank = minutes([0.0] * 10 + [None] + [0.0] * 9)
    assert below_for(blank, IDLE, started_at=T0, now=T0 + 20 * MIN) is None


def test_a_span_in_progress_counts_up_to_now() -> None:
    samples = minutes([0.0] * 21)  # the last minute has 30 s of readings so far
    now = T0 + 20 * MIN + 30 * SECOND
    fired = below_for(samples, IDLE, started_at=T0, now=now)
    assert fired is not None and fired.end == now and fired.start == now - IDLE.window
    # A span that starts now (or later) is no evidence yet.
    assert below_for(samples[:20], IDLE, started_at=T0, now=T0 + 19 * MIN) is None
    # Live readings of one minute alert every window, each from where the last one ended.
    ten = Rule("low", 0.6, timedelta(seconds=10), "alert")
    live = [Sample(T0, MIN, 0.4)]
    first = below_for(live, ten, started_at=T0, now=T0 + 12 * SECOND)
    assert first is not None and first.end == T0 + 12 * SECOND
    assert below_for(live, ten, started_at=T0, now=T0 + 21 * SECOND, since=first.end) is None
    again = below_for(live, ten, started_at=T0, now=T0 + 22 * SECOND, since=first.end)
    assert again is not None and again.start == first.end


def test_an_hour_span_covers_a_window_inside_it() -> None:
    hour = [Sample(T0, timedelta(hours=1), 0.02)]
    fired = below_for(hour, IDLE, started_at=T0, now=T0 + timedelta(hours=2))
    assert fired is not None and fired.end == T0 + timedelta(hours=1)


def test_an_alert_fires_once_per_window_while_the_job_stays_low() -> None:
    utils: list[float | None] = [0.4] * 95
    alerted: dict[str, datetime] = {}
    fired_at: list[tuple[datetime, datetime]] = []
    for n in range(1, 96):  # a pass after every minute's reading
        verdict = watch(
            Rules((LOW,)),
            minutes(utils[:n]),
            started_at=T0,
            first_started_at=T0,
            now=T0 + n * MIN,
            alerted=alerted,
        )
        assert verdict.stop is None
        for f in verdict.alerts:
            fired_at.append((f.start, f.end))
            alerted[f.rule.name] = f.end
    # Windows of 30 minutes, back to back, never overlapping: minutes 0-30, 30-60, 60-90.
    assert fired_at == [(T0 + k * 30 * MIN, T0 + (k + 1) * 30 * MIN) for k in range(3)]


def test_a_stop_rule_stops_and_an_alert_rule_only_alerts() -> None:
    samples = minutes([0.02] * 30)
    both = Rules((IDLE, LOW))
    verdict = watch(both, samples, started_at=T0, first_started_at=T0, now=T0 + 30 * MIN)
    assert verdict.stopped_by == "idle" and verdict.stop is not None
    assert "below 5% for 20m" in verdict.stop
    alert_only = Rules((Rule("idle", 0.05, timedelta(minutes=20), "alert"),))
    verdict = watch(alert_only, samples, started_at=T0, first_started_at=T0, now=T0 + 30 * MIN)
    assert verdict.stop is None and [f.rule.name for f in verdict.alerts] == ["idle"]


def test_max_duration_counts_from_the_first_start_across_attempts() -> None:
    limit = Rules(max_duration=timedelta(hours=2))
    relaunched = T0 + timedelta(hours=1, minutes=30)  # attempt 2 started here
    kw = {"started_at": relaunched, "first_started_at": T0}
    early = watch(limit, [], now=T0 + timedelta(hours=1, minutes=59), **kw)
    assert early.stop is None
    due = watch(limit, [], now=T0 + timedelta(hours=2), **kw)
    assert due.stopped_by == "max_duration" and "2h" in (due.stop or "")
    assert not overran(None, timedelta(hours=1), now=T0)
    assert not overran(T0, None, now=T0 + timedelta(days=9))


@settings(max_examples=300, deadline=None)
@given(
    utils=st.lists(st.one_of(st.none(), st.floats(0, 1)), min_size=0, max_size=40),
    window_min=st.integers(1, 30),
    below=st.floats(0.01, 1),
    started_min=st.integers(-5, 10),
    now_min=st.integers(0, 50),
)
def test_firing_means_every_reading_in_the_window_is_below(
    utils: list[float | None], window_min: int, below: float, started_min: int, now_min: int
) -> None:
    rule = Rule("low", below, window_min * MIN, "alert")
    samples = minutes(utils)
    started = T0 + started_min * MIN
    now = T0 + now_min * MIN
    fired = below_for(samples, rule, started_at=started, now=now)
    # A brute-force statement of the definition, minute by minute.
    usable = [i for i, u in enumerate(utils) if u is not None and started < T0 + (i + 1) * MIN]
    usable = [i for i in usable if T0 + (i + 1) * MIN <= now]
    if not usable:
        assert fired is None
        return
    last = max(usable)
    first_minute = last + 1 - window_min
    expected = (
        T0 + first_minute * MIN >= started
        and first_minute >= 0
        and all(
            utils[i] is not None and utils[i] < below  # type: ignore[operator]
            for i in range(first_minute, last + 1)
        )
    )
    assert (fired is not None) == expected
    if fired is not None:
        assert fired.end == T0 + (last + 1) * MIN and fired.end <= now


POLICY_TEXT = """apiVersion: gpuopt/v1
kind: Policy
name: p
utilization:
  low: {below: 0.60, for: 30m, action: alert}
  idle: {below: 0.05, for: 20m, action: stop}
max_duration: 72h
"""


def test_the_policy_block_parses_with_units_and_the_spec_overrides_rule_by_rule() -> None:
    policy = parse_policy(POLICY_TEXT)
    rules = rules_for(policy, {})
    assert rules.rules == (IDLE, LOW)
    assert rules.max_duration == timedelta(hours=72)
    # A spec's rule replaces the policy's of that name; the other stays.
    spec = {"utilization": {"idle": {"below": 0.1, "for": 10.0, "action": "alert"}}}
    own = rules_for(policy, {**spec, "max_duration": 90.0})
    assert own.rules == (Rule("idle", 0.1, timedelta(seconds=10), "alert"), LOW)
    assert own.max_duration == timedelta(seconds=90)
    bare = parse_policy("apiVersion: gpuopt/v1\nkind: Policy\nname: p\n")
    assert not rules_for(bare, {})


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("  idle: {below: 0.05, for: 5s, action: stop}", "utilization.idle.for: must be >= 10"),
        ("  idle: {below: 0.05, for: 2d, action: stop}", "'2d' is not a duration"),
        ("  idle: {below: 1.5, for: 20m, action: stop}", "utilization.idle.below: must be <= 1"),
        ("  idle: {below: 0.05, for: 20m, action: kill}", "utilization.idle.action: must be"),
        ("  idle: {below: 0.05, action: stop}", "utilization.idle.for: "),
        ("  busy: {below: 0.05, for: 20m}", "utilization.busy: "),
    ],
)
def test_bad_rules_are_located_errors(line: str, said: str) -> None:
    text = f"apiVersion: gpuopt/v1\nkind: Policy\nname: p\nutilization:\n{line}\n"
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, path="p.yaml")
    first = str(caught.value).splitlines()[0]
    assert first.startswith("p.yaml:5:") and said in first, first


def test_a_bad_max_duration_is_a_located_error() -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(POLICY_TEXT.replace("72h", "3 weeks"), path="p.yaml")
    assert "p.yaml:7:15: max_duration: '3 weeks' is not a duration" in str(caught.value)


# -- the state machine ---------------------------------------------------------------------

JOB = JobView(id=1, name="train", state=JobState.RUNNING)


def running(**values: object) -> AttemptView:
    base = AttemptView(
        number=1,
        key="train-1",
        pool=("aws", "us-east-1", "use1-az1", "g5.xlarge", "spot"),
        launched_at=T0,
        registered=True,
        probe_status="pass",
        job_started=True,
    )
    return base if not values else AttemptView(**{**_fields(base), **values})  # type: ignore[arg-type]


def _fields(a: AttemptView) -> dict[str, object]:
    return {name: getattr(a, name) for name in a.__slots__}  # type: ignore[attr-defined]


def test_a_rule_stops_a_running_job_with_sigterm_and_ends_its_attempt() -> None:
    why = PolicyStop("idle", "GPU utilization below 5% for 20m")
    d = decide(JOB, running(), now=T0, stop=why)
    assert d.state is JobState.STOPPED and d.end_attempt == "stopped"
    assert d.reason == "stopped by idle: GPU utilization below 5% for 20m"
    stop, alert = d.actions
    assert stop == Stop("train-1", "stopped by idle")
    assert isinstance(alert, Alert) and alert.kind is EventKind.JOB_STOPPED
    assert dict(alert.data) == {"rule": "idle", "reason": why.reason}
    # A stopped job stays stopped.
    assert decide(JobView(1, "train", JobState.STOPPED), running(), now=T0, stop=why).actions == ()


def test_an_exit_a_cancel_or_a_failure_wins_over_a_stop() -> None:
    why = PolicyStop("max_duration", "ran 2h")
    assert decide(JOB, running(exit_code=0), now=T0, stop=why).state is JobState.SUCCEEDED
    cancelled = JobView(1, "train", JobState.RUNNING, cancel_requested=True)
    assert decide(cancelled, running(), now=T0, stop=why).state is JobState.CANCELLED
    lost = decide(JOB, running(instance_gone=True), now=T0, stop=why)
    assert lost.state is JobState.PROVISIONING
    # Not running yet (probing): nothing to stop.
    probing = decide(JOB, running(job_started=False), now=T0, stop=why)
    assert probing.state is JobState.PROBING
