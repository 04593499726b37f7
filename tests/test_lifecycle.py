"""A managed job's lifecycle words, written once (optimizer/lifecycle.py): the states and end
reasons keep the exact text the store, the API and events carry, and the sets every layer asks
about are derived from them."""

from __future__ import annotations

import json

from optimizer.jobs import machine, recovery
from optimizer.lifecycle import (
    FAILURES,
    HANDED_OVER,
    LIVE_JOB_STATES,
    TERMINAL_JOB_STATES,
    AttemptEnd,
    AttemptState,
    Failure,
    JobState,
)
from policies.schema import RecoveryStrategy, recovery_strategies


def test_a_state_is_its_text_on_the_wire_and_in_comparisons() -> None:
    assert json.dumps({"state": JobState.RUNNING}) == '{"state": "running"}'
    assert f"{AttemptEnd.MIGRATED}" == "migrated" and str(AttemptState.ENDED) == "ended"
    assert "succeeded" in TERMINAL_JOB_STATES and JobState("stopped") in TERMINAL_JOB_STATES
    assert AttemptEnd.PREEMPTED == "preempted" and Failure("lost") is Failure.LOST


def test_the_terminal_and_live_job_states_split_every_state() -> None:
    assert {s.value for s in TERMINAL_JOB_STATES} == {"succeeded", "failed", "cancelled", "stopped"}
    assert set(JobState) == TERMINAL_JOB_STATES | LIVE_JOB_STATES
    assert not TERMINAL_JOB_STATES & LIVE_JOB_STATES


def test_every_failure_is_an_end_reason_and_a_handover_is_a_preemption_or_a_move() -> None:
    assert {f.value for f in Failure} == {e.value for e in FAILURES}
    assert set(AttemptEnd) >= FAILURES
    assert {"preempted", "migrated"} == HANDED_OVER
    assert AttemptEnd.MIGRATED not in FAILURES  # a move is not held against the pool


def test_the_state_machine_and_the_recovery_strategies_use_the_one_definition() -> None:
    assert machine.JobState is JobState and machine.TERMINAL is TERMINAL_JOB_STATES
    assert machine.MIGRATED is AttemptEnd.MIGRATED
    assert recovery.Failure is Failure


def test_each_built_in_recovery_strategy_name_is_written_once_and_implemented_once() -> None:
    installed = recovery.strategies()
    assert {"failover", "eager-on-demand"} <= set(recovery_strategies())
    assert set(RecoveryStrategy) <= set(installed)
    assert all(kind.name == name for name, kind in installed.items())
    assert all(installed[member].name is member for member in RecoveryStrategy)
