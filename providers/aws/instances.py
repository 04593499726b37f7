"""launch / describe / terminate and queue polling, mixed into AwsProvider."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlparse

from optimizer.model import Offer
from providers.aws import launch as L
from providers.aws.errors import translate
from providers.aws.queue import InterruptionEvent, poll_queue
from providers.aws.specs import GpuType, chunks
from providers.base import InstanceRef, InstanceState, InstanceStatus, LaunchSpec, ProviderError

IMAGE_MAX_AGE = timedelta(hours=24)
# EC2 reads lag writes by a few seconds; an instance launched this recently that describe
# cannot find yet is reported pending, not gone.
LAUNCH_VISIBILITY_GRACE = timedelta(seconds=90)
NOT_FOUND = "InvalidInstanceID.NotFound"
PG_DUPLICATE = "InvalidPlacementGroup.Duplicate"  # the gang's group exists already
# DeletePlacementGroup's answers (EC2 API reference, "Error codes for the Amazon EC2 API"):
# a group with no such name, and one that still holds an instance (terminated ones excepted).
PG_UNKNOWN = "InvalidPlacementGroup.Unknown"
PG_IN_USE = "InvalidPlacementGroup.InUse"


def queue_region(queue_url: str) -> str | None:
    """The region in an SQS queue URL (`https://sqs.<region>.amazonaws.com/…`), if any."""
    host = (urlparse(queue_url).hostname or "").split(".")
    if len(host) >= 3 and host[0] == "sqs":
        return host[1]
    if len(host) >= 3 and host[1] == "queue":  # legacy https://<region>.queue.amazonaws.com
        return host[0]
    return None


class InstanceOps:
    """The Provider contract's write half; AwsProvider supplies the plumbing declared here."""

    name: str
    clock: Callable[[], datetime]
    launch_config: L.AwsLaunchConfig
    queue_url: str | None
    queue_problems: list[str]
    _launched: dict[str, datetime]

    def client(self, service: str, region: str) -> Any:
        raise NotImplementedError

    @property
    def home_region(self) -> str:
        raise NotImplementedError

    def _inventory(
        self, region: str, problems: list[str]
    ) -> tuple[dict[str, GpuType], dict[str, str]]:
        raise NotImplementedError

    def _remember(self, key: tuple[str, ...], max_age: timedelta, make: Callable[[], Any]) -> Any:
        raise NotImplementedError

    # --- launch -----------------------------------------------------------------------------

    def launch(self, offer: Offer, spec: LaunchSpec, idempotency_key: str) -> InstanceRef:
        """Start the offer's instance; a repeat with the same key returns the same instance."""
        if offer.provider != self.name:
            raise ValueError(f"not an AWS offer: provider {offer.provider!r}")
        region = offer.region
        token = L.client_token(idempotency_key)
        try:
            ec2 = self.client("ec2", region)
            types, zones = self._inventory(region, [])
            instance = self._by_token(ec2, token)
            if instance is None:
                if spec.gang is not None:
                    self._placement_group(ec2, spec)
                request = self._run_request(ec2, offer, spec, token, types, zones)
                instance = ec2.run_instances(**request)["Instances"][0]
                self._launched[instance["InstanceId"]] = self.clock()
        except Exception as exc:
            raise translate(exc, zone=offer.zone) from exc
        return InstanceRef(self.name, region, _zone_id(instance, zones), instance["InstanceId"])

    def _run_request(
        self,
        ec2: Any,
        offer: Offer,
        spec: LaunchSpec,
        token: str,
        types: Mapping[str, GpuType],
        zones: Mapping[str, str],
    ) -> dict[str, Any]:
        zone_name = None
        if offer.zone:
            zone_name = {zid: name for name, zid in zones.items()}.get(offer.zone)
            if zone_name is None:
                raise ProviderError(
                    f"zone {offer.zone} is not a zone of {offer.region} in this account",
                    provider=self.name,
                    code="UnknownZone",
                    zone=offer.zone,
                )
        config = self.launch_config
        image = spec.image or config.image_id
        if not image:
            image = self._default_image(offer.region, types.get(offer.instance_type))
        root = config.root_device_name or self._root_device(ec2, offer.region, image)
        return L.run_request(
            offer,
            spec,
            token,
            image_id=image,
            zone_name=zone_name,
            config=config,
            root_device_name=root,
        )

    def _placement_group(self, ec2: Any, spec: LaunchSpec) -> None:
        """Make the gang's cluster placement group, once: the first node makes it, the others
        (and a retried node) find it made."""
        assert spec.gang is not None
        try:
            ec2.create_placement_group(**L.placement_group_request(spec.gang.placement, spec.job))
        except Exception as exc:
            typed = translate(exc)
            if typed.code != PG_DUPLICATE:
                raise typed from exc

    def release_placement(self, region: str, placement: str) -> bool:
        """Delete a gang's cluster placement group (DeletePlacementGroup): True once it is
        gone (a name EC2 does not know is gone already), False while an instance is in it."""
        try:
            self.client("ec2", region).delete_placement_group(GroupName=placement)
        except Exception as exc:
            typed = translate(exc)
            if typed.code == PG_UNKNOWN:
                return True
            if typed.code == PG_IN_USE:
                return False
            raise typed from exc
        return True

    def _by_token(self, ec2: Any, token: str) -> Mapping[str, Any] | None:
        """An instance launched earlier under this ClientToken (found by its tag), if any."""
        pages = ec2.get_paginator("describe_instances").paginate(
            Filters=[{"Name": f"tag:{L.TAG_TOKEN}", "Values": [token]}]
        )
        found = [i for page in pages for i in L.instances_in(page.get("Reservations", []))]
        live = [i for i in found if i.get("State", {}).get("Name") != "terminated"]
        chosen = live or found
        return chosen[0] if chosen else None

    def _default_image(self, region: str, spec: GpuType | None) -> str:
        """The DLAMI for the type's architecture, from its public SSM parameter."""
        arch = "x86_64"
        if spec is not None and spec.architectures and "x86_64" not in spec.architectures:
            arch = spec.architectures[0]
        name = self.launch_config.image_parameter.format(arch=arch)

        def fetch() -> str:
            reply = self.client("ssm", region).get_parameter(Name=name)
            return str(reply["Parameter"]["Value"])

        image: str = self._remember(("image", region, name), IMAGE_MAX_AGE, fetch)
        return image

    def _root_device(self, ec2: Any, region: str, image: str) -> str | None:
        """The image's root device name, so the root volume can be sized; None if unknown."""

        def fetch() -> str | None:
            try:
                images = ec2.describe_images(ImageIds=[image]).get("Images", [])
            except Exception:  # run_instances reports a bad image more clearly
                return None
            return images[0].get("RootDeviceName") if images else None

        device: str | None = self._remember(("root", region, image), IMAGE_MAX_AGE, fetch)
        return device

    # --- describe / terminate ---------------------------------------------------------------

    def describe(self, refs: Iterable[InstanceRef]) -> list[InstanceStatus]:
        """State and end reason of each instance, in the order given."""
        refs = list(refs)
        by_region: dict[str, list[InstanceRef]] = {}
        for ref in refs:
            by_region.setdefault(ref.region, []).append(ref)
        found: dict[str, tuple[Mapping[str, Any], str | None]] = {}
        for region, group in by_region.items():
            try:
                found.update(self._describe_region(region, [r.instance_id for r in group]))
            except Exception as exc:
                raise translate(exc) from exc
        return [self._status(ref, found.get(ref.instance_id)) for ref in refs]

    def _describe_region(
        self, region: str, ids: list[str]
    ) -> dict[str, tuple[Mapping[str, Any], str | None]]:
        ec2 = self.client("ec2", region)
        instances: dict[str, Mapping[str, Any]] = {}
        # A filter, not InstanceIds: an unknown ID then drops out instead of failing the call.
        for part in chunks(sorted(set(ids))):
            pages = ec2.get_paginator("describe_instances").paginate(
                Filters=[{"Name": "instance-id", "Values": list(part)}]
            )
            for page in pages:
                for instance in L.instances_in(page.get("Reservations", [])):
                    instances[instance["InstanceId"]] = instance
        requests = {
            i["SpotInstanceRequestId"]: iid
            for iid, i in instances.items()
            if i.get("SpotInstanceRequestId")
        }
        status: dict[str, str] = {}
        for part in chunks(sorted(requests)):
            pages = ec2.get_paginator("describe_spot_instance_requests").paginate(
                Filters=[{"Name": "spot-instance-request-id", "Values": list(part)}]
            )
            for page in pages:
                for request in page.get("SpotInstanceRequests", []):
                    iid = request.get("InstanceId") or requests.get(
                        request["SpotInstanceRequestId"]
                    )
                    code = (request.get("Status") or {}).get("Code")
                    if iid and code:
                        status[iid] = code
        return {iid: (i, status.get(iid)) for iid, i in instances.items()}

    def _status(
        self, ref: InstanceRef, found: tuple[Mapping[str, Any], str | None] | None
    ) -> InstanceStatus:
        if found is None:
            launched = self._launched.get(ref.instance_id)
            if launched is not None and self.clock() - launched < LAUNCH_VISIBILITY_GRACE:
                return InstanceStatus(ref, InstanceState.PENDING, None, "not-found yet")
            return InstanceStatus(ref, InstanceState.TERMINATED, None, "not-found")
        instance, spot_status = found
        state = L.instance_state(str((instance.get("State") or {}).get("Name", "")))
        reason = (instance.get("StateReason") or {}).get("Code")
        return InstanceStatus(
            ref,
            state,
            L.end_reason(state, reason, spot_status),
            L.detail_text(reason, spot_status),
            launched_at=L.launch_time(instance),
            terminated_at=L.termination_time(instance, state),
        )

    def terminate(self, ref: InstanceRef) -> None:
        """Terminate the instance; one that no longer exists counts as terminated."""
        try:
            self.client("ec2", ref.region).terminate_instances(InstanceIds=[ref.instance_id])
        except Exception as exc:
            error = translate(exc)
            if error.code == NOT_FOUND:
                return
            raise error from exc

    # --- queue mode -------------------------------------------------------------------------

    def poll_interruptions(
        self,
        *,
        wait_seconds: int = 20,
        record: Callable[[list[InterruptionEvent]], None] | None = None,
    ) -> list[InterruptionEvent]:
        """Interruption events from the configured SQS queue; [] without one.

        Messages are deleted once parsed, after `record` (when given) has taken each batch.
        Unreadable messages are deleted and listed in `queue_problems`.
        """
        if not self.queue_url:
            return []
        region = queue_region(self.queue_url) or self.home_region
        problems: list[str] = []
        sqs = self.client("sqs", region)
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            events = poll_queue(
                sqs, self.queue_url, wait_seconds=wait_seconds, record=record, problems=problems
            )
        except (BotoCoreError, ClientError) as exc:  # `record`'s own errors pass through as-is
            raise translate(exc) from exc
        finally:
            self.queue_problems = problems
        return events


def _zone_id(instance: Mapping[str, Any], zones: Mapping[str, str]) -> str | None:
    placement = instance.get("Placement") or {}
    name = placement.get("AvailabilityZone")
    return placement.get("AvailabilityZoneId") or (zones.get(name) if name else None)
