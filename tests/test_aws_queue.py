"""Queue mode: EventBridge's EC2 events on SQS become InterruptionEvents, then are deleted."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from providers.aws import AwsProvider, InterruptionEvent, parse_event
from providers.aws.instances import queue_region
from providers.aws.queue import UnreadableEvent
from tests.helpers.aws import QUEUE_REGION, Clock, rebalance, spot_warning, state_change

pytestmark = pytest.mark.usefixtures("aws_env", "offline")

REGION = QUEUE_REGION


@pytest.fixture
def sqs() -> Iterator[tuple[Any, str]]:
    import boto3
    from moto import mock_aws

    with mock_aws():
        client = boto3.client("sqs", region_name=REGION)
        url = client.create_queue(QueueName="gpuopt-interruptions")["QueueUrl"]
        yield client, url


def _count(client: Any, url: str) -> tuple[int, int]:
    attrs = client.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return (
        int(attrs["ApproximateNumberOfMessages"]),
        int(attrs["ApproximateNumberOfMessagesNotVisible"]),
    )


def test_the_three_event_kinds_are_read_and_deleted(sqs: tuple[Any, str]) -> None:
    client, url = sqs
    for body in (spot_warning("i-0aaa"), rebalance("i-0bbb"), state_change("i-0ccc")):
        client.send_message(QueueUrl=url, MessageBody=json.dumps(body))
    aws = AwsProvider([REGION], queue_url=url, clock=Clock())
    events = aws.poll_interruptions(wait_seconds=0)
    assert sorted(events, key=lambda e: e.instance_id) == [
        InterruptionEvent(
            "i-0aaa",
            "spot_interruption",
            datetime(2026, 11, 30, 12, 0, 5, tzinfo=UTC),
            "terminate",
            REGION,
        ),
        InterruptionEvent(
            "i-0bbb", "rebalance", datetime(2026, 11, 30, 11, 58, tzinfo=UTC), "", REGION
        ),
        InterruptionEvent(
            "i-0ccc",
            "state_change",
            datetime(2026, 11, 30, 12, 2, 5, tzinfo=UTC),
            "shutting-down",
            REGION,
        ),
    ]
    assert _count(client, url) == (0, 0)
    assert aws.queue_problems == []


def test_messages_stay_queued_when_recording_fails(sqs: tuple[Any, str]) -> None:
    client, url = sqs
    client.send_message(QueueUrl=url, MessageBody=json.dumps(spot_warning("i-0aaa")))
    aws = AwsProvider([REGION], queue_url=url, clock=Clock())

    def broken(batch: list[InterruptionEvent]) -> None:
        raise RuntimeError("store down")

    with pytest.raises(RuntimeError):
        aws.poll_interruptions(wait_seconds=0, record=broken)
    assert _count(client, url) == (0, 1)  # in flight; back after the visibility timeout


def test_events_are_recorded_before_deletion(sqs: tuple[Any, str]) -> None:
    client, url = sqs
    client.send_message(QueueUrl=url, MessageBody=json.dumps(spot_warning("i-0aaa")))
    aws = AwsProvider([REGION], queue_url=url, clock=Clock())
    seen: list[tuple[list[InterruptionEvent], tuple[int, int]]] = []
    aws.poll_interruptions(wait_seconds=0, record=lambda b: seen.append((b, _count(client, url))))
    ((batch, counts_while_recording),) = seen
    assert [e.instance_id for e in batch] == ["i-0aaa"]
    assert counts_while_recording == (0, 1)  # not yet deleted while being recorded
    assert _count(client, url) == (0, 0)


def test_unreadable_messages_are_dropped_and_reported(sqs: tuple[Any, str]) -> None:
    client, url = sqs
    client.send_message(QueueUrl=url, MessageBody="not json")
    client.send_message(QueueUrl=url, MessageBody=json.dumps({"detail-type": "AWS Health Event"}))
    client.send_message(QueueUrl=url, MessageBody=json.dumps(rebalance("i-0bbb")))
    aws = AwsProvider([REGION], queue_url=url, clock=Clock())
    events = aws.poll_interruptions(wait_seconds=0)
    assert [e.kind for e in events] == ["rebalance"]
    assert len(aws.queue_problems) == 2
    assert all(p.startswith("queue: dropped message") for p in aws.queue_problems)
    assert _count(client, url) == (0, 0)


def test_a_full_queue_is_drained_in_batches(sqs: tuple[Any, str]) -> None:
    client, url = sqs
    for n in range(23):
        client.send_message(QueueUrl=url, MessageBody=json.dumps(rebalance(f"i-{n:04x}")))
    events = AwsProvider([REGION], queue_url=url, clock=Clock()).poll_interruptions(wait_seconds=0)
    assert len({e.instance_id for e in events}) == 23
    assert _count(client, url) == (0, 0)


def test_an_eventbridge_rule_routes_ec2_events_to_the_queue(sqs: tuple[Any, str]) -> None:
    import boto3

    client, url = sqs
    arn = client.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    events = boto3.client("events", region_name=REGION)
    events.put_rule(
        Name="gpuopt-ec2-interruptions",
        EventPattern=json.dumps(
            {
                "source": ["aws.ec2"],
                "detail-type": [
                    "EC2 Spot Instance Interruption Warning",
                    "EC2 Instance Rebalance Recommendation",
                    "EC2 Instance State-change Notification",
                ],
            }
        ),
    )
    events.put_targets(Rule="gpuopt-ec2-interruptions", Targets=[{"Id": "q", "Arn": arn}])
    # moto lets a test send an aws.* source, which real EventBridge reserves for AWS.
    warning = spot_warning("i-0ddd")
    events.put_events(
        Entries=[
            {
                "Source": "aws.ec2",
                "DetailType": warning["detail-type"],
                "Detail": json.dumps(warning["detail"]),
                "Resources": warning["resources"],
            }
        ]
    )
    got = AwsProvider([REGION], queue_url=url, clock=Clock()).poll_interruptions(wait_seconds=0)
    assert [(e.instance_id, e.kind, e.detail) for e in got] == [
        ("i-0ddd", "spot_interruption", "terminate")
    ]


def test_without_a_queue_nothing_is_polled() -> None:
    assert AwsProvider(["us-east-1"]).poll_interruptions() == []


def test_parse_rejects_events_without_an_instance() -> None:
    body = spot_warning("i-0aaa")
    body["detail"] = {}
    with pytest.raises(UnreadableEvent, match="instance-id"):
        parse_event(json.dumps(body))
    assert parse_event(spot_warning("i-0aaa", "hibernate")).detail == "hibernate"


def test_the_queue_region_comes_from_its_url() -> None:
    assert queue_region("https://sqs.eu-west-1.amazonaws.com/123456789012/q") == "eu-west-1"
    assert queue_region("https://ap-south-1.queue.amazonaws.com/123456789012/q") == "ap-south-1"
    assert queue_region("http://127.0.0.1:5000/123456789012/q") is None
