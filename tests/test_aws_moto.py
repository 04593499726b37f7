"""The AWS adapter against moto in-process: real instance-type and offering data, launches,
idempotency, describe and terminate. (moto's spot prices are a fixed placeholder, so price
logic lives in test_aws_prices.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from optimizer.model import Fabric, Interconnect, Market, Offer
from providers.aws import AwsProvider, client_token
from providers.aws import launch as L
from providers.aws import specs as S
from providers.base import CapacityError, EndReason, Gang, InstanceState, LaunchSpec
from tests.helpers.aws import NOW, Clock, StubSession
from tests.helpers.gang import gang_walk, walk_one

pytestmark = pytest.mark.usefixtures("aws_env", "offline")

REGIONS = ["us-east-1", "eu-west-1"]


@pytest.fixture
def moto(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from moto import mock_aws

    # moto's ~2 s load of its public AMI list per test buys nothing here (see `image`).
    monkeypatch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    with mock_aws():
        yield


@pytest.fixture
def session(moto: None) -> Any:
    import boto3

    return boto3.session.Session(region_name="us-east-1")


def _ec2(region: str = "us-east-1") -> Any:
    import boto3

    return boto3.client("ec2", region_name=region)


def _seed_list_prices(cache: S.MemoryCache, region: str) -> dict[str, float]:
    """On-demand list prices as an earlier poll would have cached them (moto has no Price List)."""
    prices = {t.instance_type: 1.0 + t.gpu_count for t in S.list_gpu_types(_ec2(region))}
    for kind, usd in prices.items():
        cache.save_cached("aws", f"on-demand/{kind}", {region: usd}, NOW)
    return prices


def test_moto_gpu_types_become_offers_named_canonically(session: Any) -> None:
    cache = S.MemoryCache()
    prices = _seed_list_prices(cache, "us-east-1")
    aws = AwsProvider(REGIONS, session=session, cache=cache, clock=Clock())
    offers = aws.fetch_offers()
    assert aws.problems == []

    def one(kind: str) -> Offer:
        return next(o for o in offers if o.instance_type == kind)

    assert (one("p4d.24xlarge").gpu_model, one("p4d.24xlarge").gpu_count) == ("A100-40GB", 8)
    assert one("p4de.24xlarge").gpu_model == "A100-80GB"  # same AWS name, told apart by memory
    assert one("p5en.48xlarge").gpu_model == "H200-141GB"
    assert one("p5.48xlarge").interconnect is Interconnect.NVLINK
    assert one("g5.48xlarge").interconnect is Interconnect.PCIE
    l4 = one("g6.xlarge")
    assert (l4.gpu_model, l4.gpu_count, l4.interconnect) == ("L4", 1, Interconnect.NONE)
    assert l4.gpu_memory_gib == pytest.approx(22888 / 1024)
    assert (l4.vcpus, l4.ram_gib) == (4, 16)
    assert one("g5g.xlarge").gpu_model == "T4"
    assert not [o for o in offers if o.instance_type.startswith(("g6f.", "gr6f."))]

    on_demand = [o for o in offers if o.market is Market.ON_DEMAND]
    assert {o.region for o in on_demand} == {"us-east-1"}  # eu-west-1 has no list price cached
    assert all(o.usd_per_hour == prices[o.instance_type] for o in on_demand)
    assert {o.source for o in offers} == {"aws-api"}


def test_offers_carry_zone_ids_matching_the_offerings(session: Any) -> None:
    aws = AwsProvider(REGIONS, session=session, clock=Clock())
    offers = aws.fetch_offers()
    for region in REGIONS:
        ec2 = _ec2(region)
        zone_ids = {z["ZoneId"] for z in ec2.describe_availability_zones()["AvailabilityZones"]}
        # Ask EC2 for the offerings by zone ID directly: the name → ID mapping must agree.
        by_id = ec2.describe_instance_type_offerings(
            LocationType="availability-zone-id",
            Filters=[{"Name": "instance-type", "Values": ["p5.48xlarge", "g6.xlarge"]}],
        )["InstanceTypeOfferings"]
        for kind in ("p5.48xlarge", "g6.xlarge"):
            expected = {row["Location"] for row in by_id if row["InstanceType"] == kind}
            got = {
                o.zone
                for o in offers
                if o.region == region and o.instance_type == kind and o.market is Market.SPOT
            }
            assert got == expected and got <= zone_ids
    assert all(o.zone and "-az" in o.zone for o in offers)


# --- launching ---------------------------------------------------------------------------------


def _offer(aws: AwsProvider, kind: str = "g6.xlarge", market: Market = Market.SPOT) -> Offer:
    return (
        next(
            o
            for o in aws.fetch_offers(["us-east-1"])
            if o.instance_type == kind and o.market is market
        )
        if market is Market.SPOT
        else replace(_offer(aws, kind), market=market, usd_per_hour=0.8)
    )


def _spec(image: str | None, **kwargs: Any) -> LaunchSpec:
    return LaunchSpec(
        job="job-42",
        attempt=3,
        bootstrap="#!/bin/sh\necho agent\n",
        image=image,
        labels=(("team", "ml"),),
        **kwargs,
    )


@pytest.fixture
def image(moto: None) -> str:
    """An AMI of our own (root device /dev/sda1), like a configured image."""
    image_id: str = _ec2().register_image(Name="gpuopt-test", RootDeviceName="/dev/sda1")["ImageId"]
    return image_id


@pytest.fixture
def captured(session: Any) -> list[dict[str, Any]]:
    """Every RunInstances request the provider sends, as botocore is about to serialize it."""
    calls: list[dict[str, Any]] = []
    session.events.register(
        "provide-client-params.ec2.RunInstances", lambda params, **_: calls.append(dict(params))
    )
    return calls


def test_a_spot_launch_sends_the_request_gpuopt_needs(
    session: Any, image: str, captured: list[dict[str, Any]]
) -> None:
    aws = AwsProvider(["us-east-1"], session=session, clock=Clock())
    offer = _offer(aws)
    ref = aws.launch(offer, _spec(image), "job-42/attempt-3")

    (request,) = captured
    assert request["ClientToken"] == "job-42/attempt-3"
    assert request["InstanceMarketOptions"] == {
        "MarketType": "spot",
        "SpotOptions": {
            "SpotInstanceType": "one-time",
            "InstanceInterruptionBehavior": "terminate",
        },
    }
    assert request["MetadataOptions"]["HttpTokens"] == "required"
    assert request["MetadataOptions"]["HttpPutResponseHopLimit"] == 2
    assert request["UserData"] == "#!/bin/sh\necho agent\n"
    assert request["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"] == 200
    zone_names = {
        z["ZoneId"]: z["ZoneName"]
        for z in _ec2().describe_availability_zones()["AvailabilityZones"]
    }
    assert request["Placement"] == {"AvailabilityZone": zone_names[offer.zone]}

    (instance,) = _ec2().describe_instances(InstanceIds=[ref.instance_id])["Reservations"][0][
        "Instances"
    ]
    tags = {t["Key"]: t["Value"] for t in instance["Tags"]}
    assert tags["gpuopt:job"] == "job-42" and tags["gpuopt:attempt"] == "3"
    assert tags["team"] == "ml"
    assert instance["InstanceLifecycle"] == "spot"
    assert instance["MetadataOptions"]["HttpTokens"] == "required"
    assert instance["InstanceType"] == "g6.xlarge"
    assert (ref.provider, ref.region, ref.zone) == ("aws", "us-east-1", offer.zone)


def test_max_price_is_sent_only_when_the_policy_enforces_its_cap_in_aws(
    session: Any, image: str, captured: list[dict[str, Any]]
) -> None:
    aws = AwsProvider(["us-east-1"], session=session, clock=Clock())
    offer = _offer(aws)
    aws.launch(offer, _spec(image, max_usd_per_hour=3.5), "capped")
    assert captured[0]["InstanceMarketOptions"]["SpotOptions"]["MaxPrice"] == "3.5"


@pytest.mark.parametrize(
    ("bid", "max_price"),
    [
        ("{max_usd_per_hour: 4, max_usd_per_gpu_hour: 2.5, enforce_in_cloud: true}", "2.5"),
        ("{max_usd_per_hour: 1.75, max_usd_per_gpu_hour: 2.5, enforce_in_cloud: true}", "1.75"),
        ("{max_usd_per_hour: 4}", None),  # enforced by gpuopt before launching, the default
        ("{max_fraction_of_on_demand: 0.9, enforce_in_cloud: true}", None),  # no instance cap
    ],
)
def test_the_launch_walk_sends_the_policys_cap_as_max_price_when_it_enforces_it_in_aws(
    session: Any,
    image: str,
    captured: list[dict[str, Any]],
    tmp_path: Path,
    bid: str,
    max_price: str | None,
) -> None:
    config = L.AwsLaunchConfig(image_id=image)
    aws = AwsProvider(["us-east-1"], session=session, clock=Clock(), launch_config=config)
    offer = _offer(aws)  # g6.xlarge: one GPU
    assert offer.gpu_count == 1
    policy = f"apiVersion: gpuopt/v1\nkind: Policy\nname: p\nbid: {bid}\n"
    walk_one(tmp_path, aws, offer, policy)
    (request,) = captured
    assert request["InstanceMarketOptions"]["SpotOptions"].get("MaxPrice") == max_price


def test_an_on_demand_launch_has_no_market_options(
    session: Any, image: str, captured: list[dict[str, Any]]
) -> None:
    aws = AwsProvider(["us-east-1"], session=session, clock=Clock())
    ref = aws.launch(_offer(aws, market=Market.ON_DEMAND), _spec(image), "od-1")
    assert "InstanceMarketOptions" not in captured[0]
    (instance,) = _ec2().describe_instances(InstanceIds=[ref.instance_id])["Reservations"][0][
        "Instances"
    ]
    assert "InstanceLifecycle" not in instance


def test_the_same_key_twice_gives_one_instance(
    session: Any, image: str, captured: list[dict[str, Any]]
) -> None:
    aws = AwsProvider(["us-east-1"], session=session, clock=Clock())
    offer = _offer(aws)
    first = aws.launch(offer, _spec(image), "job-42/attempt-3")
    again = aws.launch(offer, _spec(image), "job-42/attempt-3")
    assert again == first
    assert len(captured) == 1
    reservations = _ec2().describe_instances()["Reservations"]
    assert sum(len(r["Instances"]) for r in reservations) == 1


def test_a_long_key_becomes_a_64_character_token(
    session: Any, image: str, captured: list[dict[str, Any]]
) -> None:
    key = "job-" + "x" * 100 + "/attempt-1"
    aws = AwsProvider(["us-east-1"], session=session, clock=Clock())
    aws.launch(_offer(aws), _spec(image), key)
    token = captured[0]["ClientToken"]
    assert token == client_token(key) and len(token) == 64 and token.isascii()
    assert client_token("ünïcode") != "ünïcode"


def test_describe_follows_an_instance_to_its_user_termination(session: Any, image: str) -> None:
    aws = AwsProvider(["us-east-1"], session=session, clock=Clock())
    ref = aws.launch(_offer(aws), _spec(image), "life")
    (status,) = aws.describe([ref])
    assert status.state in (InstanceState.PENDING, InstanceState.RUNNING)
    assert status.end_reason is None

    aws.terminate(ref)
    aws.terminate(ref)  # again: still fine
    (status,) = aws.describe([ref])
    assert status.state is InstanceState.TERMINATED
    assert status.end_reason is EndReason.USER
    assert status.detail == "Client.UserInitiatedShutdown"


def test_an_instance_ec2_no_longer_knows_is_gone(session: Any) -> None:
    from providers.base import InstanceRef

    aws = AwsProvider(["us-east-1"], session=session, clock=Clock())
    ghost = InstanceRef("aws", "us-east-1", None, "i-0123456789abcdef0")
    (status,) = aws.describe([ghost])
    assert (status.state, status.end_reason, status.detail) == (
        InstanceState.TERMINATED,
        None,
        "not-found",
    )
    aws.terminate(ghost)  # InvalidInstanceID.NotFound counts as done


def test_the_default_image_is_the_dlami_for_the_type_architecture(moto: None) -> None:
    session = StubSession(strict=False)
    arm = L.DLAMI_PARAMETER.format(arch="arm64")
    session.stub("ssm").add_response(
        "get_parameter",
        {"Parameter": {"Name": arm, "Type": "String", "Value": "ami-0123456789abcdef0"}},
        {"Name": arm},
    )
    aws = AwsProvider(["us-east-1"], session=session, clock=Clock())
    offer = _offer(aws, "g5g.xlarge")  # Graviton + T4g: an arm64 image
    ref = aws.launch(offer, _spec(None), "arm-1")
    aws.launch(replace(offer), _spec(None), "arm-2")  # the image id is remembered
    session.assert_done()
    (instance,) = _ec2().describe_instances(InstanceIds=[ref.instance_id])["Reservations"][0][
        "Instances"
    ]
    assert instance["ImageId"] == "ami-0123456789abcdef0"


def test_the_agent_bootstrap_arrives_intact_as_user_data(session: Any, image: str) -> None:
    """The script the daemon config's `agent:` section renders is what the instance reads."""
    import base64

    from optimizer.jobs.bootstrap import AgentInstall, AgentProxy, AgentSettings

    agent = AgentSettings(
        install=AgentInstall(version="0.4.1", index_url="https://pypi.internal/simple"),
        images={"aws": image},
        env={"HF_HOME": "/data/hf", "NOTE": 'it\'s $HOME & "quoted"'},
        proxy=AgentProxy(https="http://proxy.internal:3128", no_proxy=("10.0.0.0/8",)),
    )
    script = agent.script(
        daemon_url="https://gpuopt.example:8470",
        token="tok-" + "x" * 40,
        attempt_key="7-1",
        cloud="aws",
        metadata_kind="aws-imds",
        expected_gpus=1,
    )
    assert "gpuopt[probes]==0.4.1" in script and "HTTPS_PROXY" in script
    aws = AwsProvider(["us-east-1"], session=session, clock=Clock())
    spec = LaunchSpec(job="job-7", attempt=1, bootstrap=script, image=agent.image("aws"))
    ref = aws.launch(_offer(aws), spec, "7-1")

    attribute = _ec2().describe_instance_attribute(InstanceId=ref.instance_id, Attribute="userData")
    assert base64.b64decode(attribute["UserData"]["Value"]).decode() == script
    (instance,) = _ec2().describe_instances(InstanceIds=[ref.instance_id])["Reservations"][0][
        "Instances"
    ]
    assert instance["ImageId"] == image


def test_describe_reports_the_times_ec2_keeps(session: Any, image: str) -> None:
    """The launch and a user termination as moto records them, and a spot reclaim (moto has
    none: the backend is edited as REFERENCE.md §3 describes) whose reason names no time."""
    aws = AwsProvider(["us-east-1"], session=session, clock=Clock())
    ref = aws.launch(_offer(aws), _spec(image), "times")
    reclaimed = aws.launch(_offer(aws), _spec(image), "reclaimed")

    def ec2_says(instance_id: str) -> dict[str, Any]:
        reply = _ec2().describe_instances(InstanceIds=[instance_id])
        instance: dict[str, Any] = reply["Reservations"][0]["Instances"][0]
        return instance

    (running,) = aws.describe([ref])
    assert running.launched_at == ec2_says(ref.instance_id)["LaunchTime"]
    assert running.launched_at is not None and running.launched_at.tzinfo is not None
    assert running.terminated_at is None

    aws.terminate(ref)
    (gone,) = aws.describe([ref])
    reason = ec2_says(ref.instance_id)["StateTransitionReason"]  # "User initiated (… UTC)"
    assert gone.terminated_at is not None
    assert gone.terminated_at.strftime("(%Y-%m-%d %H:%M:%S UTC)") in reason
    assert gone.launched_at == running.launched_at

    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ec2.models import ec2_backends
    from moto.ec2.models.instances import StateReason

    instance = ec2_backends[DEFAULT_ACCOUNT_ID]["us-east-1"].get_instance(reclaimed.instance_id)
    instance._state.name, instance._state.code = "terminated", 48
    instance.state_reason = StateReason(
        "Server.SpotInstanceTermination: Spot instance termination",
        "Server.SpotInstanceTermination",
    )
    (taken,) = aws.describe([reclaimed])
    assert (taken.state, taken.end_reason) == (InstanceState.TERMINATED, EndReason.PREEMPTED)
    assert taken.launched_at == ec2_says(reclaimed.instance_id)["LaunchTime"]
    assert taken.terminated_at is None  # the reconciler falls back to the notice's time


def test_a_gang_node_launches_in_the_cluster_placement_group_with_every_efa_interface(
    session: Any, image: str, captured: list[dict[str, Any]]
) -> None:
    groups = PlacementGroups(session).created
    aws = AwsProvider(["us-east-1"], session=session, clock=Clock())
    offer = replace(_offer(aws), fabric=Fabric.EFA, fabric_interfaces=4)
    for rank in (0, 1):
        gang = Gang("gpuopt-7-3", nodes=2, rank=rank)
        aws.launch(offer, _spec(image, gang=gang), f"7-3-n{rank}")

    # Asked for by both nodes, made by the first; the second finds it made (Duplicate).
    assert [(g["GroupName"], g["Strategy"]) for g in groups] == [("gpuopt-7-3", "cluster")] * 2
    for request in captured:  # both nodes, the group made once
        assert request["Placement"]["GroupName"] == "gpuopt-7-3"
        assert request["NetworkInterfaces"] == [
            {"NetworkCardIndex": 0, "DeviceIndex": 0, "InterfaceType": "interface"},
            {"NetworkCardIndex": 0, "DeviceIndex": 1, "InterfaceType": "efa-only"},
            {"NetworkCardIndex": 1, "DeviceIndex": 0, "InterfaceType": "efa-only"},
            {"NetworkCardIndex": 2, "DeviceIndex": 0, "InterfaceType": "efa-only"},
            {"NetworkCardIndex": 3, "DeviceIndex": 0, "InterfaceType": "efa-only"},
        ]
    assert len(captured) == 2


class PlacementGroups:
    """Answer CreatePlacementGroup and DeletePlacementGroup, which moto 5.2 does not
    implement, as EC2 does. Create: success the first time, `InvalidPlacementGroup.Duplicate`
    (HTTP 400) for a name already made. Delete: `InvalidPlacementGroup.Unknown` (HTTP 400)
    for a name not made (or deleted), `InvalidPlacementGroup.InUse` (HTTP 400) while an
    instance launched into the group is not terminated (moto keeps no group on its
    instances: they are known by the ClientToken their RunInstances carried), else success
    (`{"Return": true}`). `created` and `deleted` are the requests, in order."""

    def __init__(self, session: Any) -> None:
        self.created: list[dict[str, Any]] = []
        self.deleted: list[str] = []
        self.live: set[str] = set()
        self.tokens: dict[str, str] = {}  # ClientToken -> the group its instance went into
        session.events.register("before-call.ec2.CreatePlacementGroup", self._create)
        session.events.register("before-call.ec2.DeletePlacementGroup", self._delete)
        session.events.register("provide-client-params.ec2.RunInstances", self._run)

    @staticmethod
    def _error(code: str, message: str) -> Any:
        return SimpleNamespace(status_code=400, headers={}), {
            "Error": {"Code": code, "Message": message}
        }

    def _create(self, params: dict[str, Any], **_: Any) -> Any:
        body = params["body"]
        name = body["GroupName"]
        self.created.append({"GroupName": name, "Strategy": body["Strategy"]})
        if name in self.live:
            return self._error("InvalidPlacementGroup.Duplicate", f"{name} exists")
        self.live.add(name)
        return SimpleNamespace(status_code=200, headers={}), {"PlacementGroup": {}}

    def _run(self, params: dict[str, Any], **_: Any) -> None:
        group = (params.get("Placement") or {}).get("GroupName")
        if group:
            self.tokens[params["ClientToken"]] = group

    def _delete(self, params: dict[str, Any], **_: Any) -> Any:
        name = params["body"]["GroupName"]
        self.deleted.append(name)
        if name not in self.live:
            return self._error(
                "InvalidPlacementGroup.Unknown", f"The Placement Group '{name}' is unknown."
            )
        tokens = [t for t, group in self.tokens.items() if group == name]
        found = _ec2().describe_instances(
            Filters=[{"Name": f"tag:{L.TAG_TOKEN}", "Values": tokens}]
        )["Reservations"]
        if any(i["State"]["Name"] != "terminated" for r in found for i in r["Instances"]):
            return self._error(
                "InvalidPlacementGroup.InUse",
                f"The placement group '{name}' is in use and may not be deleted.",
            )
        self.live.discard(name)
        return SimpleNamespace(status_code=200, headers={}), {"Return": True}


def test_a_gangs_placement_group_is_deleted_once_every_node_is_terminated(
    session: Any, image: str
) -> None:
    groups = PlacementGroups(session)
    aws = AwsProvider(["us-east-1"], session=session, clock=Clock())
    offer = _offer(aws)
    refs = [
        aws.launch(offer, _spec(image, gang=Gang("gpuopt-7-3", nodes=2, rank=r)), f"7-3-n{r}")
        for r in (0, 1)
    ]
    assert aws.release_placement("us-east-1", "gpuopt-7-3") is False  # both nodes in it
    aws.terminate(refs[0])
    assert aws.release_placement("us-east-1", "gpuopt-7-3") is False  # one still is
    aws.terminate(refs[1])
    assert aws.release_placement("us-east-1", "gpuopt-7-3") is True
    assert groups.live == set()
    assert aws.release_placement("us-east-1", "gpuopt-7-3") is True  # gone already: Unknown
    assert groups.deleted == ["gpuopt-7-3"] * 4


def test_a_partial_gang_on_aws_is_terminated_and_the_next_offer_tried(
    session: Any, image: str, tmp_path: Path
) -> None:
    PlacementGroups(session)
    config = L.AwsLaunchConfig(image_id=image)
    aws = AwsProvider(["us-east-1"], session=session, clock=Clock(), launch_config=config)
    first = _offer(aws)
    second = replace(first, instance_type="g6.2xlarge", usd_per_hour=first.usd_per_hour + 1)

    class SecondNodeFails:
        """AWS in moto, except that the first gang's second node finds no capacity."""

        name = "aws"

        def __init__(self) -> None:
            self.calls = 0

        def launch(self, offer: Offer, spec: LaunchSpec, key: str) -> Any:
            self.calls += 1
            if self.calls == 2:
                raise CapacityError("InsufficientInstanceCapacity", provider="aws")
            return aws.launch(offer, spec, key)

        def terminate(self, ref: Any) -> None:
            aws.terminate(ref)

    refs = gang_walk(tmp_path, SecondNodeFails(), [first, second])
    states = {
        i["InstanceId"]: (i["InstanceType"], i["State"]["Name"])
        for r in _ec2().describe_instances()["Reservations"]
        for i in r["Instances"]
    }
    torn_down = refs[0]
    assert states.pop(torn_down) == ("g6.xlarge", "terminated")
    assert sorted(states.values()) == [("g6.2xlarge", "running")] * 2
