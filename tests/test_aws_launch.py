"""Launch failures and instance status mapping, with Stubber responses for what moto never
produces: spot reclaims, StateReason codes, spot request status codes, capacity errors."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from optimizer.model import Market
from providers.aws import AwsProvider
from providers.aws import launch as L
from providers.base import (
    CapacityError,
    EndReason,
    InstanceRef,
    InstanceState,
    LaunchSpec,
    PriceTooLowError,
    QuotaError,
)
from tests.helpers import make_offer
from tests.helpers.aws import NOW, Clock, StubSession, gpu_type_info
from tests.helpers.offers import G6_XLARGE

pytestmark = pytest.mark.usefixtures("aws_env", "offline")

REGION = "us-east-1"
ZONES = {"us-east-1a": "use1-az6", "us-east-1b": "use1-az1"}
OFFER = make_offer(
    **G6_XLARGE,
    region=REGION,
    zone="use1-az1",
    market=Market.SPOT,
    usd_per_hour=0.34,
    observed_at=NOW,
    source="",
)
SPEC = LaunchSpec(job="job-7", attempt=1, bootstrap="#!/bin/sh\n", image="ami-0123456789abcdef0")
TOKEN = "job-7/attempt-1"


def _session() -> StubSession:
    session = StubSession()
    ec2 = session.stub("ec2")
    ec2.add_response(
        "describe_instance_types",
        {"InstanceTypes": [gpu_type_info("g6.xlarge", "L4", 1, 22888)]},
        {"Filters": [{"Name": "instance-type", "Values": ["g*", "p*"]}]},
    )
    ec2.add_response(
        "describe_availability_zones",
        {"AvailabilityZones": [{"ZoneName": n, "ZoneId": z} for n, z in ZONES.items()]},
        {},
    )
    return session


def _no_earlier_instance(ec2: Any, token: str = TOKEN) -> None:
    ec2.add_response(
        "describe_instances",
        {"Reservations": []},
        {"Filters": [{"Name": "tag:gpuopt:token", "Values": [token]}]},
    )


def _image(ec2: Any) -> None:
    ec2.add_response(
        "describe_images",
        {"Images": [{"ImageId": SPEC.image, "RootDeviceName": "/dev/sda1"}]},
        {"ImageIds": [SPEC.image]},
    )


def _launch_with_error(code: str, status: int = 400) -> Exception:
    session = _session()
    ec2 = session.stub("ec2")
    _no_earlier_instance(ec2)
    _image(ec2)
    ec2.add_client_error("run_instances", code, f"{code} in us-east-1b", http_status_code=status)
    aws = AwsProvider([REGION], session=session, clock=Clock())
    with pytest.raises(Exception) as caught:
        aws.launch(OFFER, SPEC, TOKEN)
    session.assert_done()
    return caught.value


def test_no_capacity_in_the_zone_is_a_capacity_error_for_that_zone() -> None:
    error = _launch_with_error("InsufficientInstanceCapacity", 500)
    assert isinstance(error, CapacityError)
    assert (error.code, error.zone) == ("InsufficientInstanceCapacity", "use1-az1")


def test_a_spot_quota_is_a_quota_error_for_the_region() -> None:
    error = _launch_with_error("MaxSpotInstanceCountExceeded")
    assert isinstance(error, QuotaError) and error.zone is None


def test_a_cloud_side_cap_below_the_spot_price_is_price_too_low() -> None:
    assert isinstance(_launch_with_error("SpotMaxPriceTooLow"), PriceTooLowError)


def test_an_instance_not_yet_visible_after_launch_is_pending_for_a_while() -> None:
    clock = Clock()
    session = _session()
    ec2 = session.stub("ec2")
    _no_earlier_instance(ec2)
    _image(ec2)
    ec2.add_response(
        "run_instances",
        {
            "Instances": [
                {
                    "InstanceId": "i-0aaaaaaaaaaaaaaaa",
                    "Placement": {"AvailabilityZone": "us-east-1b"},
                }
            ]
        },
    )
    aws = AwsProvider([REGION], session=session, clock=clock)
    ref = aws.launch(OFFER, SPEC, TOKEN)
    assert ref == InstanceRef("aws", REGION, "use1-az1", "i-0aaaaaaaaaaaaaaaa")

    lookup = {"Filters": [{"Name": "instance-id", "Values": [ref.instance_id]}]}
    ec2.add_response("describe_instances", {"Reservations": []}, lookup)
    (status,) = aws.describe([ref])
    assert (status.state, status.detail) == (InstanceState.PENDING, "not-found yet")

    clock.advance(minutes=5)
    ec2.add_response("describe_instances", {"Reservations": []}, lookup)
    (status,) = aws.describe([ref])
    assert (status.state, status.detail) == (InstanceState.TERMINATED, "not-found")
    session.assert_done()


# (state, StateReason.Code, spot request Status.Code) → (state, end reason)
CASES = [
    ("running", None, "fulfilled", InstanceState.RUNNING, None),
    ("pending", None, None, InstanceState.PENDING, None),
    # A capacity reclaim marks the request at once; the instance runs two more minutes.
    (
        "running",
        None,
        "instance-terminated-no-capacity",
        InstanceState.RUNNING,
        EndReason.PREEMPTED,
    ),
    ("running", None, "marked-for-termination", InstanceState.RUNNING, EndReason.PREEMPTED),
    (
        "shutting-down",
        "Server.SpotInstanceTermination",
        "instance-terminated-no-capacity",
        InstanceState.STOPPING,
        EndReason.PREEMPTED,
    ),
    (
        "terminated",
        "Server.SpotInstanceTermination",
        None,
        InstanceState.TERMINATED,
        EndReason.PREEMPTED,
    ),
    (
        "terminated",
        "Server.SpotInstanceTermination",
        "instance-terminated-by-price",
        InstanceState.TERMINATED,
        EndReason.PREEMPTED,
    ),
    (
        "terminated",
        "Client.UserInitiatedShutdown",
        "instance-terminated-by-user",
        InstanceState.TERMINATED,
        EndReason.USER,
    ),
    ("terminated", "Client.UserInitiatedShutdown", None, InstanceState.TERMINATED, EndReason.USER),
    (
        "terminated",
        "Client.InstanceInitiatedShutdown",
        None,
        InstanceState.TERMINATED,
        EndReason.USER,
    ),
    (
        "terminated",
        "Server.InsufficientInstanceCapacity",
        None,
        InstanceState.TERMINATED,
        EndReason.FAILED,
    ),
    ("terminated", "Server.InternalError", None, InstanceState.TERMINATED, EndReason.FAILED),
    ("terminated", "Client.VolumeLimitExceeded", None, InstanceState.TERMINATED, EndReason.FAILED),
    ("terminated", "Server.SomethingNew", None, InstanceState.TERMINATED, EndReason.FAILED),
    (
        "terminated",
        "Server.SpotInstanceTermination",
        "instance-terminated-by-experiment",
        InstanceState.TERMINATED,
        EndReason.PREEMPTED,
    ),
]


def test_describe_maps_state_reasons_and_spot_request_codes() -> None:
    session = StubSession()
    ec2 = session.stub("ec2")
    refs, instances, requests = [], [], []
    for n, (state, reason, spot, _, _) in enumerate(CASES):
        iid = f"i-{n:017x}"
        refs.append(InstanceRef("aws", REGION, "use1-az1", iid))
        instance: dict[str, Any] = {
            "InstanceId": iid,
            "State": {"Name": state, "Code": 16},
            "Placement": {"AvailabilityZone": "us-east-1b"},
        }
        if reason:
            instance["StateReason"] = {"Code": reason, "Message": f"{reason}: words"}
        if spot:
            instance["SpotInstanceRequestId"] = f"sir-{n:08x}"
            requests.append(
                {
                    "SpotInstanceRequestId": f"sir-{n:08x}",
                    "InstanceId": iid,
                    "State": "active" if spot == "fulfilled" else "closed",
                    "Status": {"Code": spot, "Message": "words"},
                }
            )
        instances.append(instance)
    ec2.add_response(
        "describe_instances",
        {"Reservations": [{"Instances": instances[:7]}, {"Instances": instances[7:]}]},
        {"Filters": [{"Name": "instance-id", "Values": sorted(r.instance_id for r in refs)}]},
    )
    ec2.add_response(
        "describe_spot_instance_requests",
        {"SpotInstanceRequests": requests},
        {
            "Filters": [
                {
                    "Name": "spot-instance-request-id",
                    "Values": sorted(r["SpotInstanceRequestId"] for r in requests),
                }
            ]
        },
    )
    aws = AwsProvider([REGION], session=session, clock=Clock())
    statuses = aws.describe(refs)
    session.assert_done()
    assert [s.ref for s in statuses] == refs
    got = [(s.state, s.end_reason) for s in statuses]
    assert got == [(state, reason) for *_, state, reason in CASES]
    assert statuses[5].detail == "Server.SpotInstanceTermination"
    assert statuses[6].detail == "Server.SpotInstanceTermination; spot:instance-terminated-by-price"


def test_the_request_builder_tags_and_sizes_the_instance() -> None:
    config = L.AwsLaunchConfig(
        subnets={"use1-az1": "subnet-0abc"},
        security_group_ids=("sg-1",),
        instance_profile="arn:aws:iam::123456789012:instance-profile/gpuopt-agent",
        key_name="ops",
    )
    request = L.run_request(
        OFFER,
        SPEC,
        "tok",
        image_id="ami-1",
        zone_name="us-east-1b",
        config=config,
        root_device_name="/dev/xvda",
    )
    assert request["SubnetId"] == "subnet-0abc" and "Placement" not in request
    assert request["SecurityGroupIds"] == ["sg-1"] and request["KeyName"] == "ops"
    assert request["IamInstanceProfile"] == {"Arn": config.instance_profile}
    assert request["InstanceInitiatedShutdownBehavior"] == "terminate"
    assert request["BlockDeviceMappings"][0]["DeviceName"] == "/dev/xvda"
    for spec in request["TagSpecifications"]:
        tags = {t["Key"]: t["Value"] for t in spec["Tags"]}
        assert tags == {"gpuopt:job": "job-7", "gpuopt:attempt": "1", "gpuopt:token": "tok"}


def test_describe_reads_the_launch_time_and_the_time_a_user_ended_it() -> None:
    """LaunchTime is the launch; StateTransitionReason carries the time of a user-initiated
    transition, in the GMT format EC2 writes (and moto's UTC one); a spot reclaim whose reason
    names no time has none, and neither has a running instance."""
    launched = datetime(2026, 11, 30, 9, 15, 2, tzinfo=UTC)
    rows = [
        ("terminated", "Client.UserInitiatedShutdown", "User initiated (2026-11-30 10:00:00 GMT)"),
        (
            "shutting-down",
            "Client.UserInitiatedShutdown",
            "User initiated (2026-11-30 10:01:00 UTC)",
        ),
        ("terminated", "Server.SpotInstanceTermination", ""),
        ("running", None, ""),
    ]
    session = StubSession()
    ec2 = session.stub("ec2")
    refs = [InstanceRef("aws", REGION, "use1-az1", f"i-{n:017x}") for n in range(len(rows))]
    instances = []
    for ref, (state, reason, transition) in zip(refs, rows, strict=True):
        instance: dict[str, Any] = {
            "InstanceId": ref.instance_id,
            "State": {"Name": state, "Code": 16},
            "LaunchTime": launched,
            "StateTransitionReason": transition,
        }
        if reason:
            instance["StateReason"] = {"Code": reason, "Message": f"{reason}: words"}
        instances.append(instance)
    ec2.add_response(
        "describe_instances",
        {"Reservations": [{"Instances": instances}]},
        {"Filters": [{"Name": "instance-id", "Values": sorted(r.instance_id for r in refs)}]},
    )
    statuses = AwsProvider([REGION], session=session, clock=Clock()).describe(refs)
    session.assert_done()
    assert [s.launched_at for s in statuses] == [launched] * 4
    assert [s.terminated_at for s in statuses] == [
        datetime(2026, 11, 30, 10, 0, tzinfo=UTC),
        datetime(2026, 11, 30, 10, 1, tzinfo=UTC),
        None,
        None,
    ]
    assert statuses[2].end_reason is EndReason.PREEMPTED


def test_termination_time_wants_a_timestamp_in_the_reason() -> None:
    ended = InstanceState.TERMINATED
    assert L.termination_time({"StateTransitionReason": "User initiated"}, ended) is None
    assert L.termination_time({"StateTransitionReason": "User initiated (soon GMT)"}, ended) is None
    assert L.termination_time({}, ended) is None
    text = "Server.SpotInstanceTermination: Spot Instance termination (2026-12-01 00:00:05 GMT)"
    assert L.termination_time({"StateTransitionReason": text}, ended) == datetime(
        2026, 12, 1, 0, 0, 5, tzinfo=UTC
    )
    running = {"StateTransitionReason": "User initiated (2026-11-30 10:00:00 GMT)"}
    assert L.termination_time(running, InstanceState.RUNNING) is None  # a stop, then a start
    assert L.launch_time({"LaunchTime": "2026-11-30T09:00:00.000Z"}) == datetime(
        2026, 11, 30, 9, tzinfo=UTC
    )
    assert L.launch_time({"LaunchTime": "yesterday"}) is None and L.launch_time({}) is None
