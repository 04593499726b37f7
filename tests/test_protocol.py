"""The agent protocol's models (optimizer/protocol.py) against the JSON on the wire today:
every request and answer an agent or a daemon of this version sends parses and dumps back to
the same bytes, so agents already running keep working with a daemon that builds its answers
through the models, and the other way round."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel

from optimizer import protocol
from optimizer.protocol import (
    Events,
    EventsAnswer,
    Logs,
    LogsAnswer,
    Register,
    RegisterAnswer,
    Wait,
)

# The daemon's answers as optimizer/api/agent.py built them by hand, key for key in its order.
REGISTER_ANSWER = {
    "job": {
        "name": "train",
        "run": "python train.py",
        "setup": None,
        "workdir": None,
        "env": {"K": "V"},
        "checkpoint_dir": "s3://bucket/ckpt",
        "probes": "quick",
        "expected_gpus": None,
    },
    "attempt": 3,
    "restarts": 2,
    "heartbeat_s": 2,
    "commands": [],
    "fence": None,
}
GANG_REGISTER_ANSWER = {
    **REGISTER_ANSWER,
    "fence": "waiting for node 1 of 2 to register",
    "gang": {"rank": 0, "nodes": 2},
}
GANG_EVENTS_ANSWER = {
    "ack": ["8c1e-1", "8c1e-2"],
    "commands": [],
    "fence": "waiting for the inter-node probe",
    "gang": {"rank": 1, "nodes": 2, "master_addr": "10.0.0.1", "master_port": 4100},
    "internode": {
        "rank": 1,
        "nodes": 2,
        "master_addr": "10.0.0.1",
        "master_port": 4100,
        "expected_gbps": None,
        "min_fraction": 0.25,
        "timeout_s": 120,
    },
}
STOP_ANSWER = {
    "ack": [],
    "commands": [{"kind": "stop", "reason": "interrupted", "grace_s": 30}],
    "fence": None,
}
# The agent's requests as optimizer/agent/ built them by hand.
REGISTER = {
    "attempt_key": "job-42/3",
    "instance_id": "i-0abc",
    "provider": "aws",
    "hostname": "ip-10-0-0-1",
    "agent_version": "0.1.0",
    "address": "10.0.0.1:4100",
}
EVENTS = {
    "attempt_key": "job-42/3",
    "events": [
        {
            "id": "8c1e",
            "kind": "job_exited",
            "at": "2026-11-30T01:00:00.000Z",
            "data": {"exit_code": 0, "signal": None, "phase": "run", "log_chunks": 3},
        }
    ],
}
LOGS = {
    "attempt_key": "job-42/3",
    "chunks": [
        {"seq": 7, "stream": "stdout", "at": "2026-11-30T01:00:02.500Z", "text": "step 40\n"},
        {"seq": 8, "stream": "stderr", "at": None, "text": "warning: …\n"},
    ],
}

# A job whose checkpoints follow it: `checkpoint` after the fields above (absent without one).
CHECKPOINT_REGISTER_ANSWER = {
    **REGISTER_ANSWER,
    "job": {
        **REGISTER_ANSWER["job"],  # type: ignore[dict-item]
        "checkpoint_dir": None,
        "checkpoint": {"uri": "gs://bucket/jobs/train", "keep": 3},
    },
}

TODAY: list[tuple[type[BaseModel], dict[str, Any]]] = [
    (RegisterAnswer, REGISTER_ANSWER),
    (RegisterAnswer, CHECKPOINT_REGISTER_ANSWER),
    (RegisterAnswer, GANG_REGISTER_ANSWER),
    (EventsAnswer, GANG_EVENTS_ANSWER),
    (EventsAnswer, STOP_ANSWER),
    (EventsAnswer, {"ack": [], "commands": [], "fence": "attempt 1's job has not exited yet"}),
    (LogsAnswer, {"ack": [7, 8]}),
    (Register, REGISTER),
    (Events, EVENTS),
    (Events, {"attempt_key": "job-42/3", "events": []}),
    (Logs, LOGS),
]


@pytest.mark.parametrize(("model", "literal"), TODAY)
def test_todays_json_round_trips_through_the_models_byte_for_byte(
    model: type[BaseModel], literal: dict[str, Any]
) -> None:
    parsed = model.model_validate_json(json.dumps(literal))
    assert json.dumps(parsed.model_dump(mode="json")) == json.dumps(literal)


def test_a_job_without_a_checkpoint_location_sends_none() -> None:
    job = RegisterAnswer.model_validate(REGISTER_ANSWER).job
    assert job.checkpoint is None and "checkpoint" not in job.wire()
    ref = RegisterAnswer.model_validate(CHECKPOINT_REGISTER_ANSWER).job.checkpoint
    assert ref is not None and (ref.uri, ref.keep) == ("gs://bucket/jobs/train", 3)
    with pytest.raises(ValueError, match="keep"):
        protocol.Job.model_validate({"run": "x", "checkpoint": {"uri": "s3://b", "keep": 0}})


def test_the_documented_examples_parse_and_dump_to_the_same_json() -> None:
    """docs/agent-protocol.md's examples (their keys in the order the daemon sends them)."""
    register_answer = {
        "job": {
            "name": "train",
            "run": "python train.py",
            "setup": "pip install -r req.txt",
            "workdir": "/home/ubuntu/src",
            "env": {"K": "V"},
            "checkpoint_dir": "s3://bucket/ckpt",
            "probes": "quick",
            "expected_gpus": 8,
        },
        "attempt": 3,
        "restarts": 2,
        "heartbeat_s": 10,
        "commands": [],
        "fence": None,
    }
    events_answer = {
        "ack": ["8c1e…"],
        "commands": [{"kind": "stop", "reason": "interrupted", "grace_s": 25}],
        "fence": None,
    }
    for model, literal in (
        (RegisterAnswer, register_answer),
        (EventsAnswer, events_answer),
        (LogsAnswer, {"ack": [7, 8]}),
    ):
        assert json.dumps(model.model_validate(literal).wire()) == json.dumps(literal)


def test_the_fence_is_a_wait_with_its_reason_and_null_once_lifted() -> None:
    held = EventsAnswer.model_validate({"ack": [], "fence": "attempt 1's job has not exited yet"})
    assert (
        isinstance(held.fence, Wait) and held.fence.reason == "attempt 1's job has not exited yet"
    )
    # Missing, null or empty: the job may start (what agents have always read).
    for answer in ({"ack": []}, {"ack": [], "fence": None}, {"ack": [], "fence": ""}):
        assert EventsAnswer.model_validate(answer).fence is None
    assert Wait.of(None) is None and Wait.of("why") == Wait("why")


def test_an_answer_from_an_older_or_newer_daemon_still_parses() -> None:
    """Missing fields take what agents have always assumed; unknown ones are ignored."""
    answer = RegisterAnswer.model_validate({"job": {"run": "x"}, "later": {"field": 1}})
    assert (answer.attempt, answer.restarts, answer.heartbeat_s) == (1, 0, 10.0)
    assert (answer.job.probes, answer.job.env, answer.commands) == ("none", {}, [])
    assert answer.gang is None and "later" not in answer.wire()


def test_the_bootstrap_names_and_limits_live_in_the_protocol() -> None:
    from optimizer.agent import reporter
    from optimizer.agent.logship import BATCH_CHUNKS, CHUNK_BYTES

    assert set(protocol.REQUIRED_ENV) <= set(protocol.BOOTSTRAP_ENV)
    assert reporter.BATCH <= protocol.MAX_EVENTS_PER_CALL
    assert BATCH_CHUNKS <= protocol.MAX_CHUNKS_PER_CALL
    assert CHUNK_BYTES <= protocol.MAX_CHUNK_CHARS  # a chunk of bytes has at most as many chars
