"""The agent's event queue and sender: order, acks, retries, persistence, bounds."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from optimizer.agent.reporter import DaemonClient, DaemonError, EventQueue, Reporter
from optimizer.common.retry import Backoff
from optimizer.protocol import Command
from tests.helpers import wait_until


def test_events_get_unique_uuids_and_utc_times() -> None:
    queue = EventQueue()
    a, b = queue.put("job_started", {"pid": 1}), queue.put("job_exited", {"exit_code": 0})
    assert a.id != b.id and uuid.UUID(a.id).version == 4
    assert a.at.endswith("Z") and [e.kind for e in queue.pending()] == ["job_started", "job_exited"]


def test_the_queue_survives_an_agent_restart_but_not_another_attempt(tmp_path: Path) -> None:
    path = tmp_path / "events.json"
    queue = EventQueue(path, attempt_key="job/1")
    started = queue.put("job_started", {"pid": 7})
    notice = queue.put("interruption_notice", {"source": "aws-imds-spot"})
    queue.ack([started.id])
    again = EventQueue(path, attempt_key="job/1")
    assert [(e.id, e.kind, e.data) for e in again.pending()] == [
        (notice.id, "interruption_notice", {"source": "aws-imds-spot"})
    ]
    assert len(EventQueue(path, attempt_key="job/2")) == 0


def test_a_waiting_heartbeat_is_replaced_not_piled_up() -> None:
    queue = EventQueue()
    queue.put("heartbeat", {"n": 1})
    queue.put("job_started")
    queue.put("heartbeat", {"n": 2})
    assert [(e.kind, e.data.get("n")) for e in queue.pending()] == [
        ("job_started", None),
        ("heartbeat", 2),
    ]


def test_a_full_queue_drops_heartbeats_first_then_the_oldest() -> None:
    queue = EventQueue(max_events=3)
    queue.put("heartbeat")
    for n in range(4):
        queue.put("interruption_notice", {"n": n})
    assert [e.data.get("n") for e in queue.pending()] == [1, 2, 3]
    assert queue.dropped == 2


def transport(answers: list[Any], seen: list[dict[str, Any]]) -> httpx.Client:
    """A client answering each POST with the next of `answers` (a status, an exception or a
    JSON body meaning 200; the last one repeats)."""

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append({"path": request.url.path, "auth": request.headers["Authorization"], **body})
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, int):
            return httpx.Response(answer, json={"error": "x"})
        if answer == "ack-all":
            answer = {"ack": [e["id"] for e in body.get("events", [])], "commands": []}
        return httpx.Response(200, json=answer)

    return httpx.Client(transport=httpx.MockTransport(handle))


@pytest.mark.parametrize(
    ("answer", "retryable"),
    [(503, True), (500, True), (401, True), (404, True), (429, True), (400, False), (422, False)],
)
def test_which_daemon_answers_are_worth_retrying(answer: int, retryable: bool) -> None:
    client = DaemonClient("http://d", "tok", "job/1", client=transport([answer], []))
    with pytest.raises(DaemonError) as caught:
        client.register({})
    assert caught.value.retryable is retryable and caught.value.status == answer


def test_a_transport_error_is_retryable_and_the_token_is_a_bearer_header() -> None:
    seen: list[dict[str, Any]] = []
    broken = httpx.ConnectError("refused")
    client = DaemonClient("http://d/", "s3cret", "job/1", client=transport([broken, {}], seen))
    with pytest.raises(DaemonError) as caught:
        client.register({"instance_id": "i-1"})
    assert caught.value.retryable
    client.register({"instance_id": "i-1"})
    assert seen[-1] == {
        "path": "/agent/v1/register",
        "auth": "Bearer s3cret",
        "attempt_key": "job/1",
        "instance_id": "i-1",
    }


def test_the_reporter_retries_in_order_and_hands_on_commands() -> None:
    seen: list[dict[str, Any]] = []
    answers: list[Any] = [503, httpx.ReadTimeout("slow"), "ack-all"]
    client = DaemonClient("http://d", "tok", "job/1", client=transport(answers, seen))
    queue = EventQueue()
    commands: list[Command] = []
    reporter = Reporter(queue, client, commands.extend, backoff=Backoff(base=0.01, cap=0.02))
    first, second = queue.put("job_started"), queue.put("interruption_notice")
    reporter.start()
    assert reporter.flush(5)
    reporter.stop()
    assert len(seen) == 3 and reporter.failures == 2
    assert [e["id"] for e in seen[-1]["events"]] == [first.id, second.id]  # order kept
    assert commands == []


def test_commands_in_an_answer_reach_the_agent() -> None:
    stop = {"kind": "stop", "reason": "interrupted"}
    queue = EventQueue()
    event = queue.put("heartbeat")
    client = DaemonClient(
        "http://d", "tok", "job/1", client=transport([{"ack": [event.id], "commands": [stop]}], [])
    )
    commands: list[Command] = []
    assert Reporter(queue, client, commands.extend).send_once()
    assert commands == [Command(kind="stop", reason="interrupted")] and len(queue) == 0


def test_a_batch_the_daemon_refuses_for_good_is_dropped_not_retried_forever() -> None:
    seen: list[dict[str, Any]] = []
    client = DaemonClient("http://d", "tok", "job/1", client=transport([400], seen))
    queue = EventQueue()
    queue.put("job_started")
    reporter = Reporter(queue, client, lambda c: None)
    assert reporter.send_once() and len(queue) == 0 and len(seen) == 1


def test_an_answer_that_acks_nothing_counts_as_a_failure() -> None:
    client = DaemonClient("http://d", "tok", "job/1", client=transport([{"ack": []}], []))
    queue = EventQueue()
    queue.put("job_started")
    reporter = Reporter(queue, client, lambda c: None)
    assert not reporter.send_once() and len(queue) == 1


def test_flush_gives_up_after_its_timeout_when_the_daemon_is_down() -> None:
    client = DaemonClient("http://d", "tok", "job/1", client=transport([503], []))
    queue = EventQueue()
    queue.put("job_exited")
    reporter = Reporter(queue, client, lambda c: None, backoff=Backoff(base=0.01, cap=0.05))
    reporter.start()
    assert not reporter.flush(0.3)
    wait_until(lambda: reporter.failures >= 2, what="retries")
    reporter.stop()
    assert len(queue) == 1
