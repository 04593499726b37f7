"""run_instances requests, instance status mapping and terminate, for one attempt's instance.

The request builder and the status mapping are pure; `AwsProvider` does the calls.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from optimizer.clock import parse_utc
from optimizer.model import Fabric, Market, Offer
from providers.base import EndReason, InstanceState, LaunchSpec

TAG_JOB = "gpuopt:job"
TAG_ATTEMPT = "gpuopt:attempt"
# The ClientToken, also kept as a tag: EC2 honours a token only for a while and moto not at
# all, so a repeat launch looks for an instance carrying it before asking EC2 again.
TAG_TOKEN = "gpuopt:token"
MAX_CLIENT_TOKEN = 64  # ≤ 64 ASCII characters (EC2 idempotency guide, REFERENCE.md §1.5)
# The public Deep Learning Base GPU AMI (NVIDIA driver, CUDA, Docker). Ubuntu 24.04, because
# its Python 3.12 runs the gpuopt agent (Python ≥ 3.11); 22.04 ships 3.10. Parameter name
# format /aws/service/deeplearning/ami/$architecture/$ami_type/latest/ami-id
# (https://docs.aws.amazon.com/dlami/latest/devguide/find-dlami-id.html).
DLAMI_PARAMETER = (
    "/aws/service/deeplearning/ami/{arch}/base-oss-nvidia-driver-gpu-ubuntu-24.04/latest/ami-id"
)


@dataclass(frozen=True, slots=True)
class AwsLaunchConfig:
    """Account-specific launch settings; all optional.

    `subnets` maps zone IDs to subnet IDs (without one, the default VPC's subnet in that zone
    is used). `image_id` overrides the DLAMI lookup for every launch (LaunchSpec.image still
    wins); `image_parameter` is an SSM parameter name with `{arch}` for x86_64/arm64.
    """

    subnets: Mapping[str, str] = field(default_factory=dict)
    security_group_ids: tuple[str, ...] = ()
    instance_profile: str | None = None  # name or ARN
    key_name: str | None = None
    image_id: str | None = None
    image_parameter: str = DLAMI_PARAMETER
    root_device_name: str | None = None  # None: read from the image (DescribeImages)


def client_token(idempotency_key: str) -> str:
    """The ClientToken for a key: the key itself when it fits, else its SHA-256 (64 hex)."""
    key = idempotency_key
    if key and len(key) <= MAX_CLIENT_TOKEN and key.isascii() and key.isprintable():
        return key
    return hashlib.sha256(idempotency_key.encode("utf-8")).hexdigest()


def _price_text(usd: float) -> str:
    return f"{usd:.6f}".rstrip("0").rstrip(".")


def run_request(
    offer: Offer,
    spec: LaunchSpec,
    token: str,
    *,
    image_id: str,
    zone_name: str | None,
    config: AwsLaunchConfig,
    root_device_name: str | None,
) -> dict[str, Any]:
    """The RunInstances parameters for one attempt (REFERENCE.md §1.5)."""
    tags = [
        {"Key": TAG_JOB, "Value": spec.job},
        {"Key": TAG_ATTEMPT, "Value": str(spec.attempt)},
        {"Key": TAG_TOKEN, "Value": token},
        *({"Key": k, "Value": v} for k, v in spec.labels),
    ]
    request: dict[str, Any] = {
        "ImageId": image_id,
        "InstanceType": offer.instance_type,
        "MinCount": 1,
        "MaxCount": 1,
        "ClientToken": token,
        "UserData": spec.bootstrap,  # boto3 base64-encodes it
        # An instance that shuts itself down (the agent, after the job) is gone, not stopped.
        "InstanceInitiatedShutdownBehavior": "terminate",
        # IMDSv2 only; hop limit 2 so the agent can reach IMDS from a container.
        "MetadataOptions": {
            "HttpTokens": "required",
            "HttpEndpoint": "enabled",
            "HttpPutResponseHopLimit": 2,
            "InstanceMetadataTags": "enabled",
        },
        "TagSpecifications": [
            {"ResourceType": "instance", "Tags": tags},
            {"ResourceType": "volume", "Tags": tags},
        ],
    }
    if root_device_name:
        request["BlockDeviceMappings"] = [
            {
                "DeviceName": root_device_name,
                "Ebs": {
                    "VolumeSize": spec.disk_gib,
                    "VolumeType": "gp3",
                    "DeleteOnTermination": True,
                },
            }
        ]
    subnet = config.subnets.get(offer.zone) if offer.zone else None
    if subnet:
        request["SubnetId"] = subnet  # the subnet fixes the zone
    elif zone_name:
        request["Placement"] = {"AvailabilityZone": zone_name}
    if config.security_group_ids:
        request["SecurityGroupIds"] = list(config.security_group_ids)
    if config.key_name:
        request["KeyName"] = config.key_name
    if config.instance_profile:
        key = "Arn" if config.instance_profile.startswith("arn:") else "Name"
        request["IamInstanceProfile"] = {key: config.instance_profile}
    if spec.gang is not None:
        _gang(request, offer, spec.gang.placement)
    if offer.market is Market.SPOT:
        spot: dict[str, Any] = {
            "SpotInstanceType": "one-time",
            "InstanceInterruptionBehavior": "terminate",
        }
        # Only when the policy enforces its cap in the cloud: a MaxPrice adds price-triggered
        # interruptions, and without one AWS caps the spot price at on-demand anyway.
        if spec.max_usd_per_hour is not None:
            spot["MaxPrice"] = _price_text(spec.max_usd_per_hour)
        request["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": spot}
    return request


def _gang(request: dict[str, Any], offer: Offer, placement: str) -> None:
    """A node of a multi-node attempt: in the gang's cluster placement group, with every EFA
    interface the type has (REFERENCE-ROUND2 §6, the EC2 guide's "Maximize network bandwidth"
    layout: the primary ENA interface and an EFA-only one on network card 0, an EFA-only
    interface at device index 0 on every other card). Interfaces take the subnet and security
    groups, which the request then may not carry itself."""
    place = dict(request.get("Placement") or {})
    place["GroupName"] = placement
    request["Placement"] = place
    if offer.fabric is not Fabric.EFA or offer.fabric_interfaces < 1:
        return
    where: dict[str, Any] = {}
    subnet = request.pop("SubnetId", None)
    groups = request.pop("SecurityGroupIds", None)
    if subnet:
        where["SubnetId"] = subnet
    if groups:
        where["Groups"] = groups
    interfaces = [
        {"NetworkCardIndex": 0, "DeviceIndex": 0, "InterfaceType": "interface", **where},
        {"NetworkCardIndex": 0, "DeviceIndex": 1, "InterfaceType": "efa-only", **where},
    ]
    for card in range(1, offer.fabric_interfaces):
        interfaces.append(
            {"NetworkCardIndex": card, "DeviceIndex": 0, "InterfaceType": "efa-only", **where}
        )
    request["NetworkInterfaces"] = interfaces


def placement_group_request(placement: str, job: str) -> dict[str, Any]:
    """CreatePlacementGroup for a gang: `cluster` packs it into one AZ's low-latency segment
    (API_CreatePlacementGroup), tagged so an orphan can be found."""
    return {
        "GroupName": placement,
        "Strategy": "cluster",
        "TagSpecifications": [
            {"ResourceType": "placement-group", "Tags": [{"Key": TAG_JOB, "Value": job}]}
        ],
    }


_STATES = {
    "pending": InstanceState.PENDING,
    "running": InstanceState.RUNNING,
    "shutting-down": InstanceState.STOPPING,
    "stopping": InstanceState.STOPPING,
    "stopped": InstanceState.STOPPING,
    "terminated": InstanceState.TERMINATED,
}

# describe_instances StateReason.Code (API_StateReason, REFERENCE.md §1.7).
_STATE_REASONS = {
    "Server.SpotInstanceTermination": EndReason.PREEMPTED,
    "Server.SpotInstanceShutdown": EndReason.PREEMPTED,
    "Client.UserInitiatedShutdown": EndReason.USER,
    "Client.InstanceInitiatedShutdown": EndReason.USER,  # e.g. the agent after the job
    "Server.InsufficientInstanceCapacity": EndReason.FAILED,
    "Server.InternalError": EndReason.FAILED,
    "Client.InternalError": EndReason.FAILED,
    "Client.VolumeLimitExceeded": EndReason.FAILED,
    "Client.InvalidSnapshot.NotFound": EndReason.FAILED,
    "Server.ScheduledStop": EndReason.FAILED,
}

# describe_spot_instance_requests Status.Code (spot-request-status.html, REFERENCE.md §1.7).
# Reclaims and FIS experiments count as preemption from the moment AWS decides them: a
# capacity reclaim shows instance-terminated-no-capacity while the instance still runs its
# last two minutes.
_SPOT_STATUS = {
    "marked-for-termination": EndReason.PREEMPTED,
    "marked-for-stop": EndReason.PREEMPTED,
    "instance-terminated-by-price": EndReason.PREEMPTED,
    "instance-terminated-no-capacity": EndReason.PREEMPTED,
    "instance-stopped-by-price": EndReason.PREEMPTED,
    "instance-stopped-no-capacity": EndReason.PREEMPTED,
    "instance-terminated-by-service": EndReason.PREEMPTED,
    "instance-terminated-launch-group-constraint": EndReason.PREEMPTED,
    "instance-terminated-by-experiment": EndReason.PREEMPTED,
    "marked-for-stop-by-experiment": EndReason.PREEMPTED,
    "instance-stopped-by-experiment": EndReason.PREEMPTED,
    "instance-terminated-by-user": EndReason.USER,
    "spot-instance-terminated-by-user": EndReason.USER,
    "instance-stopped-by-user": EndReason.USER,
    "instance-terminated-by-schedule": EndReason.USER,
}


def instance_state(name: str) -> InstanceState:
    return _STATES.get(name, InstanceState.PENDING)


def end_reason(
    state: InstanceState, reason_code: str | None, spot_status: str | None
) -> EndReason | None:
    """Why the instance ended (or is being ended by AWS); None while it simply runs.

    A spot request's status is the more specific witness, so it is read first.
    """
    if spot_status in _SPOT_STATUS:
        return _SPOT_STATUS[spot_status]
    if state in (InstanceState.PENDING, InstanceState.RUNNING):
        return None
    if reason_code in _STATE_REASONS:
        return _STATE_REASONS[reason_code]
    if state is InstanceState.TERMINATED and reason_code:
        return EndReason.FAILED  # a code this table lacks: AWS ended it for its own reason
    return None


# `StateTransitionReason` carries the time of a user-initiated transition in parentheses, e.g.
# "User initiated (2026-11-30 10:00:00 GMT)" (the field is documented only as "the reason for
# the most recent state transition"; the format is what EC2 returns, and moto writes UTC).
_TRANSITION_TIME = re.compile(r"\((\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}) (?:GMT|UTC)\)")


def launch_time(instance: Mapping[str, Any]) -> datetime | None:
    """`LaunchTime`: when the instance last entered `running` (botocore parses it)."""
    raw = instance.get("LaunchTime")
    if isinstance(raw, datetime):
        return raw.astimezone(UTC) if raw.tzinfo else raw.replace(tzinfo=UTC)
    if isinstance(raw, str):
        try:
            parsed = parse_utc(raw)
        except ValueError:
            return None
        return parsed.astimezone(UTC) if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    return None


def termination_time(instance: Mapping[str, Any], state: InstanceState) -> datetime | None:
    """When the instance was ended, from the timestamp `StateTransitionReason` carries; None
    while it runs, and when the reason names no time (EC2 does not promise one for a spot
    interruption: the reconciler then uses the notice's action time, docs/costs.md)."""
    if state not in (InstanceState.STOPPING, InstanceState.TERMINATED):
        return None
    found = _TRANSITION_TIME.search(str(instance.get("StateTransitionReason") or ""))
    if found is None:
        return None
    return datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)


def detail_text(reason_code: str | None, spot_status: str | None) -> str:
    parts = [p for p in (reason_code, spot_status and f"spot:{spot_status}") if p]
    return "; ".join(parts)


def instances_in(reservations: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [i for r in reservations for i in r.get("Instances", [])]
