"""The AWS adapter over HTTP against moto's threaded server on loopback: the same code path a
local AWS-compatible endpoint (or AWS itself) gets, for EC2 and SQS."""

from __future__ import annotations

import json
import urllib.request
from dataclasses import replace
from typing import Any

import pytest

from optimizer.model import Market
from providers.aws import AwsProvider
from providers.base import EndReason, InstanceState, LaunchSpec
from tests.helpers.aws import Clock, StubSession, rebalance, spot_warning, state_change

pytestmark = pytest.mark.usefixtures("aws_env", "offline")


@pytest.fixture
def server(moto_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The module's moto server, emptied for this test."""
    monkeypatch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    request = urllib.request.Request(f"{moto_server}/moto-api/reset", method="POST")
    with urllib.request.urlopen(request, timeout=10) as reply:
        assert reply.status == 200
    return moto_server


def _session() -> StubSession:
    """Real clients for EC2/SQS; the Price List (which moto lacks) refuses once."""
    session = StubSession(strict=False)
    session.stub("pricing").add_client_error(
        "get_products", "AccessDeniedException", "no pricing here", http_status_code=400
    )
    return session


def _client(server: str, service: str, region: str = "us-east-1") -> Any:
    import boto3

    return boto3.client(service, region_name=region, endpoint_url=server)


def test_offers_come_over_http_with_zone_ids(server: str) -> None:
    aws = AwsProvider(
        ["us-east-1", "us-west-2"],
        session=_session(),
        clock=Clock(),
        endpoint_url={"ec2": server, "sqs": server},
    )
    offers = aws.fetch_offers()
    assert {o.region for o in offers} == {"us-east-1", "us-west-2"}
    assert {o.market for o in offers} == {Market.SPOT}
    zone_ids = {
        z["ZoneId"]
        for region in ("us-east-1", "us-west-2")
        for z in _client(server, "ec2", region).describe_availability_zones()["AvailabilityZones"]
    }
    assert {o.zone for o in offers} <= zone_ids
    assert len(aws.problems) == 1 and aws.problems[0].startswith("pricing unreachable")


def test_boto3s_own_endpoint_setting_is_honoured(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", server)  # boto3 reads it; gpuopt passes nothing
    offers = AwsProvider(["eu-west-1"], session=_session(), clock=Clock()).fetch_offers()
    assert offers and {o.region for o in offers} == {"eu-west-1"}


def test_launch_describe_and_terminate_over_http(server: str) -> None:
    image = _client(server, "ec2").register_image(Name="gpuopt", RootDeviceName="/dev/sda1")
    spec = LaunchSpec(job="j-9", attempt=2, bootstrap="#!/bin/sh\n", image=image["ImageId"])
    aws = AwsProvider(
        ["us-east-1"], session=_session(), clock=Clock(), endpoint_url={"ec2": server}
    )
    offer = next(o for o in aws.fetch_offers() if o.instance_type == "g6.xlarge")

    spot = aws.launch(offer, spec, "j-9/2")
    assert aws.launch(offer, spec, "j-9/2") == spot  # idempotent over HTTP too
    on_demand = aws.launch(replace(offer, market=Market.ON_DEMAND), spec, "j-9/2-od")
    reservations = _client(server, "ec2").describe_instances()["Reservations"]
    lifecycles = sorted(
        i.get("InstanceLifecycle", "on-demand") for r in reservations for i in r["Instances"]
    )
    assert lifecycles == ["on-demand", "spot"]

    aws.terminate(spot)
    by_id = {s.ref.instance_id: s for s in aws.describe([spot, on_demand])}
    assert by_id[spot.instance_id].state is InstanceState.TERMINATED
    assert by_id[spot.instance_id].end_reason is EndReason.USER
    assert by_id[on_demand.instance_id].state in (InstanceState.PENDING, InstanceState.RUNNING)


def test_queue_events_come_over_http_and_are_deleted(server: str) -> None:
    sqs = _client(server, "sqs")
    url = sqs.create_queue(QueueName="gpuopt-interruptions")["QueueUrl"]
    for body in (spot_warning("i-01"), rebalance("i-02"), state_change("i-03", "terminated")):
        sqs.send_message(QueueUrl=url, MessageBody=json.dumps(body))
    aws = AwsProvider(
        ["us-east-1"],
        session=_session(),
        clock=Clock(),
        queue_url=url,
        endpoint_url={"sqs": server},
    )
    events = aws.poll_interruptions(wait_seconds=1)
    assert sorted((e.instance_id, e.kind, e.detail) for e in events) == [
        ("i-01", "spot_interruption", "terminate"),
        ("i-02", "rebalance", ""),
        ("i-03", "state_change", "terminated"),
    ]
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0)
