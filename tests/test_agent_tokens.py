"""Agent tokens over HTTP on a real loopback server: a token dies with its attempt once the
attempt has ended and its instance is gone (its last output is still taken for a short grace),
a removed job's spec is never handed out again, an older attempt's report never ends the job
a newer attempt runs, and bad `job_exited` data is a 422 naming the field."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from optimizer.api.agent import TOKEN_GRACE
from optimizer.clock import ManualClock
from optimizer.daemon.service import Daemon
from optimizer.jobs.views import finished_earlier
from optimizer.store.jobs import token_sha256
from tests.helpers import make_offer
from tests.helpers.daemon import make_config, running
from tests.helpers.offers import T0

pytestmark = pytest.mark.usefixtures("daemon_env")

SPEC = {
    "name": "train",
    "run": "python train.py",
    "checkpoint_dir": "/ckpt",
    "env": {"WANDB_API_KEY": "not-for-strangers"},
}


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def daemon(tmp_path: Path, clock: ManualClock) -> Iterator[Daemon]:
    with running(make_config(tmp_path), clock=clock) as d:
        yield d


def attempt(daemon: Daemon, job: int, number: int) -> tuple[str, str]:
    """An attempt of the job with its own token: (key, token)."""
    key, token = f"{job}-{number}", f"token-{job}-{number}"
    offer = make_offer(provider="aws", instance_type="p5.48xlarge")
    daemon.store.jobs.create_attempt(job, number, key, offer, token_sha256(token), T0)
    return key, token


def post(daemon: Daemon, node: tuple[str, str], path: str, **body: Any) -> httpx.Response:
    key, token = node
    with httpx.Client(base_url=daemon.url, timeout=10) as client:
        return client.post(
            f"/agent/v1/{path}",
            json={"attempt_key": key, **body},
            headers={"Authorization": f"Bearer {token}"},
        )


def exited(node: tuple[str, str], eid: str, **data: Any) -> dict[str, Any]:
    return {"id": eid, "kind": "job_exited", "data": data}


def chunk(seq: int, text: str) -> dict[str, Any]:
    return {"seq": seq, "stream": "stdout", "text": text}


def test_a_token_is_refused_once_its_attempt_has_ended_and_its_instance_is_gone(
    daemon: Daemon, clock: ManualClock
) -> None:
    store = daemon.store
    job = store.jobs.add_job("train", "p", SPEC, at=T0)
    old = attempt(daemon, job, 1)
    assert post(daemon, old, "register", instance_id="i-1").status_code == 200
    # Moved away, its job still running (a hot handover): its token still works.
    store.jobs.update_attempt(old[0], state="ended", ended_at=T0, end_reason="migrated")
    assert post(daemon, old, "events", events=[]).status_code == 200

    clock.advance(30)
    store.jobs.record_billing(old[0], terminated_at=clock(), instance_gone=True)
    forged = [
        exited(old, "forged", exit_code=0, stopped=False),
        {"id": "p", "kind": "probe_result", "data": {"status": "fail", "result": {}}},
    ]
    for path, body in (("register", {}), ("events", {"events": forged})):
        refused = post(daemon, old, path, **body)
        assert refused.status_code == 403, refused.text
        assert "has ended and its instance is gone" in refused.json()["detail"]
        assert "not-for-strangers" not in refused.text
    held = store.jobs.attempt(old[0])
    assert held is not None and (held.exit_code, held.probe_status) == (None, None)
    assert store.jobs.agent_events(old[0]) == []

    # Its last output is still taken for the grace, counted from the instance's end.
    clock.advance(TOKEN_GRACE.total_seconds() - 1)
    taken = post(daemon, old, "logs", chunks=[chunk(0, "last words\n")])
    assert taken.status_code == 200 and taken.json()["ack"] == [0]
    clock.advance(2)
    late = post(daemon, old, "logs", chunks=[chunk(1, "too late\n")])
    assert late.status_code == 403 and "last output" in late.json()["detail"]
    held = store.jobs.attempt(old[0])
    assert held is not None and held.log_bytes == len("last words\n")


def test_a_removed_jobs_attempt_cannot_register(daemon: Daemon) -> None:
    store = daemon.store
    job = store.jobs.add_job("train", "p", SPEC, at=T0)
    node = attempt(daemon, job, 1)
    store.jobs.transition_job(job, expected="pending", state="failed", reason="x", at=T0)
    assert store.jobs.remove_job("train", at=T0) is not None

    refused = post(daemon, node, "register", instance_id="i-1")
    assert refused.status_code == 403, refused.text
    assert refused.json()["detail"] == f"attempt {node[0]}'s job was removed"
    assert "not-for-strangers" not in refused.text and "python train.py" not in refused.text


def test_an_older_attempts_exit_never_ends_the_job_a_newer_attempt_runs(
    daemon: Daemon, clock: ManualClock
) -> None:
    store = daemon.store
    job = store.jobs.add_job("train", "p", SPEC, at=T0)
    old, new = attempt(daemon, job, 1), attempt(daemon, job, 2)
    # Attempt 1 was moved away; its instance still runs. Attempt 2 has started the job.
    store.jobs.update_attempt(old[0], state="ended", ended_at=T0, end_reason="migrated")
    started = {"id": "s2", "kind": "job_started", "data": {"pid": 7}}
    assert post(daemon, new, "events", events=[started]).status_code == 200

    # Attempt 1 says its job exited 0 unstopped: recorded, but the job is attempt 2's now.
    answer = post(daemon, old, "events", events=[exited(old, "x1", exit_code=0, stopped=False)])
    assert answer.status_code == 200 and answer.json()["ack"] == ["x1"]
    attempts = store.jobs.attempts(job)
    assert finished_earlier(store, attempts, [attempts[1]]) is None

    # Before attempt 2 started the job, the same exit would have finished it (hot handover).
    store.jobs.update_attempt(new[0], job_started_at=None)
    attempts = store.jobs.attempts(job)
    assert finished_earlier(store, attempts, [attempts[1]]) == 1


def test_a_second_job_exited_is_acknowledged_and_ignored(daemon: Daemon) -> None:
    store = daemon.store
    job = store.jobs.add_job("train", "p", SPEC, at=T0)
    node = attempt(daemon, job, 1)
    first = post(daemon, node, "events", events=[exited(node, "a", exit_code=3, stopped=False)])
    assert first.status_code == 200
    again = post(daemon, node, "events", events=[exited(node, "b", exit_code=0, stopped=False)])
    assert again.status_code == 200 and again.json()["ack"] == ["b"]
    held = store.jobs.attempt(node[0])
    assert held is not None and held.exit_code == 3
    assert store.jobs.exit_reports([node[0]]) == {node[0]: {"exit_code": 3, "stopped": False}}


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"exit_code": 2**64}, "exit_code"),
        ({"exit_code": -(2**63)}, "exit_code"),
        ({"exit_code": "0"}, "exit_code"),
        ({"exit_code": True}, "exit_code"),
        ({"exit_code": None, "signal": "abc"}, "signal"),
        ({"exit_code": None, "signal": 2**40}, "signal"),
        ({"exit_code": 0, "stopped": "no"}, "stopped"),
        ({"exit_code": 0, "log_chunks": 2**64}, "log_chunks"),
    ],
)
def test_job_exited_data_the_store_cannot_hold_is_a_422_naming_the_field(
    daemon: Daemon, data: dict[str, Any], field: str
) -> None:
    store = daemon.store
    job = store.jobs.add_job("train", "p", SPEC, at=T0)
    node = attempt(daemon, job, 1)
    heartbeat = {"id": "hb", "kind": "heartbeat", "data": {"state": "running"}}
    answer = post(daemon, node, "events", events=[heartbeat, exited(node, "x", **data)])
    assert answer.status_code == 422, answer.text
    [error] = answer.json()["detail"]
    assert error["loc"] == ["body", "events", 1, "data", field]
    assert error["msg"].startswith("job_exited: ")
    assert store.jobs.agent_events(node[0]) == []  # the batch is refused whole
    held = store.jobs.attempt(node[0])
    assert held is not None and held.exit_code is None
