"""A managed job's lifecycle words, written once (optimizer/lifecycle.py): the states and end
reasons keep the exact text the store, the API and events carry, and the sets every layer asks
about are derived from them."""

from __future__ import annotations

import ast
import json
from pathlib import Path

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


# Where an attempt's state or end reason is written or compared in the jobs layer and the agent
# API: a `state=`/`end_reason=` keyword or dict entry, a comparison with `.state`/`.end_reason`,
# or the reason handed to `launch_errors.end`. Its text there must be the lifecycle's member,
# and the lifecycle's sets are not defined again.
LIFECYCLE_WORDS = {str(m) for m in (*AttemptState, *AttemptEnd)}
ROOT = Path(__file__).resolve().parents[1]
SETS = {"FAILURES", "HANDED_OVER", "TERMINAL", "TERMINAL_JOB_STATES", "LIVE", "LIVE_JOB_STATES"}


def _written_out(source: str) -> list[str]:
    """The lifecycle words `source` writes as plain strings where the lifecycle's member
    belongs, and the lifecycle's sets it defines again (`line: what`)."""

    def word(node: ast.AST | None) -> str | None:
        if isinstance(node, ast.Constant) and node.value in LIFECYCLE_WORDS:
            return str(node.value)
        return None

    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            found += [
                f"{node.lineno}: {k.arg}={w!r}"
                for k in node.keywords
                if k.arg in ("state", "end_reason") and (w := word(k.value))
            ]
            callee = node.func
            if isinstance(callee, ast.Name) and callee.id == "end" and (w := word(node.args[-1])):
                found.append(f"{node.lineno}: end(…, {w!r})")
        elif isinstance(node, ast.Dict):
            found += [
                f"{node.lineno}: {k.value!r}: {w!r}"
                for k, v in zip(node.keys, node.values, strict=True)
                if isinstance(k, ast.Constant)
                and k.value in ("state", "end_reason")
                and (w := word(v))
            ]
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(
                isinstance(s, ast.Attribute) and s.attr in ("state", "end_reason") for s in sides
            ):
                found += [f"{node.lineno}: compared with {w!r}" for s in sides if (w := word(s))]
        elif isinstance(node, ast.Assign) and node.col_offset == 0:
            found += [
                f"{node.lineno}: {t.id} defined again"
                for t in node.targets
                if isinstance(t, ast.Name) and t.id in SETS
            ]
            if w := word(node.value):
                found.append(f"{node.lineno}: a name for {w!r}")
    return found


def test_the_jobs_layer_and_the_agent_api_write_lifecycle_words_as_members() -> None:
    paths = [*sorted((ROOT / "optimizer" / "jobs").glob("*.py")), ROOT / "optimizer/api/agent.py"]
    found = [
        f"{path.relative_to(ROOT)}:{hit}"
        for path in paths
        for hit in _written_out(path.read_text())
    ]
    assert found == []


def test_a_lifecycle_word_written_out_is_caught() -> None:
    sample = (
        'FAILURES = frozenset({"preempted"})\n'
        'ABANDONED = "move_abandoned"\n'
        'store.update_attempt(key, state="ended", end_reason="user")\n'
        'x = {"end_reason": "migrated", "state": "ended"}\n'
        'if a.state == "launching" or a.end_reason in HANDED_OVER: pass\n'
        'end(ctx, attempt, "offer gone")\n'
        "end(ctx, attempt, AttemptEnd.OFFER_GONE)\n"
        'update_attempt(key, state=AttemptState.ENDED, note="ended")\n'
    )
    assert sorted(_written_out(sample)) == sorted(
        [
            "1: FAILURES defined again",
            "2: a name for 'move_abandoned'",
            "3: state='ended'",
            "3: end_reason='user'",
            "4: 'end_reason': 'migrated'",
            "4: 'state': 'ended'",
            "5: compared with 'launching'",
            "6: end(…, 'offer gone')",
        ]
    )
