"""Launching, describing and terminating GCP instances against the local REST fake."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.cloud.compute_v1")
from google.auth.credentials import AnonymousCredentials

from optimizer.clock import ManualClock
from optimizer.model import Interconnect, Market, Offer
from providers.base import (
    AuthError,
    CapacityError,
    EndReason,
    Gang,
    InstanceRef,
    InstanceState,
    LaunchSpec,
    PriceTooLowError,
    Provider,
    ProviderError,
    QuotaError,
    ThrottledError,
)
from providers.gcp import GcpProvider
from providers.gcp.names import request_id
from tests.helpers import make_offer
from tests.helpers.gang import gang_walk
from tests.helpers.gcp_fake import FakeGcp, error_body

DATA = Path(__file__).parent / "data" / "gcp"
T0 = datetime(2026, 5, 4, 9, 0, tzinfo=UTC)
ZONE = "us-central1-a"
INSERT = r"/zones/us-central1-a/instances$"
BOOT = "#!/bin/bash\npip install gpuopt && gpuopt agent --server https://gpuopt.example\n"
SPEC = LaunchSpec(job="Llama FT/7b", attempt=3, bootstrap=BOOT, labels=(("Team", "ML Ops"),))
KEY = "job-42:3"


def offer(kind: str, market: Market = Market.SPOT, zone: str = ZONE, usd: float = 1.0) -> Offer:
    """One T4 of machine type `kind` on GCP in `zone`."""
    return make_offer(
        provider="gcp",
        region=zone.rsplit("-", 1)[0],
        zone=zone,
        instance_type=kind,
        gpu_model="T4",
        gpu_count=1,
        gpu_memory_gib=16,
        vcpus=8,
        ram_gib=30,
        interconnect=Interconnect.NONE,
        market=market,
        usd_per_hour=usd,
        observed_at=T0,
        source="gcp-billing",
    )


T4_SPOT = offer("n1-standard-8+nvidia-tesla-t4:1")


@pytest.fixture
def fake() -> Iterator[FakeGcp]:
    with FakeGcp.from_recorded(DATA) as server:
        yield server


def provider(fake: FakeGcp, **kwargs: Any) -> GcpProvider:
    return GcpProvider(
        "gpuopt-test",
        client_options={"api_endpoint": fake.url},
        credentials=AnonymousCredentials(),
        transport="rest",
        clock=lambda: T0,
        **kwargs,
    )


def inserts(fake: FakeGcp) -> list[Any]:
    return fake.calls("POST", "/instances")


def test_gcp_provider_meets_the_provider_contract(fake) -> None:
    gcp = provider(fake)
    assert isinstance(gcp, Provider) and gcp.name == "gcp"


def test_spot_insert_sends_spot_scheduling_gpus_labels_and_startup_script(fake) -> None:
    ref = provider(fake).launch(T4_SPOT, SPEC, KEY)
    assert (ref.provider, ref.region, ref.zone) == ("gcp", "us-central1", ZONE)
    [call] = inserts(fake)
    body = call.body
    assert call.path == "/compute/v1/projects/gpuopt-test/zones/us-central1-a/instances"
    assert body["name"] == ref.instance_id
    assert body["machineType"] == "zones/us-central1-a/machineTypes/n1-standard-8"
    assert body["scheduling"] == {
        "provisioningModel": "SPOT",
        "instanceTerminationAction": "DELETE",
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": False,
    }
    assert body["guestAccelerators"] == [
        {
            "acceleratorType": "zones/us-central1-a/acceleratorTypes/nvidia-tesla-t4",
            "acceleratorCount": 1,
        }
    ]
    assert body["labels"] == {"gpuopt-job": "llama-ft-7b", "gpuopt-attempt": "3", "team": "ml-ops"}
    metadata = {i["key"]: i["value"] for i in body["metadata"]["items"]}
    assert metadata["startup-script"] == BOOT
    disk = body["disks"][0]
    assert disk["boot"] and disk["autoDelete"] and disk["initializeParams"]["diskSizeGb"] == "200"
    assert call.query["requestId"] == request_id(KEY)


def test_on_demand_built_in_gpu_type_has_no_guest_accelerators(fake) -> None:
    provider(fake).launch(offer("a3-highgpu-8g", Market.ON_DEMAND), SPEC, KEY)
    body = inserts(fake)[0].body
    assert "guestAccelerators" not in body or body["guestAccelerators"] == []
    assert body["machineType"] == "zones/us-central1-a/machineTypes/a3-highgpu-8g"
    assert body["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert body["scheduling"].get("provisioningModel") == "STANDARD"
    assert "instanceTerminationAction" not in body["scheduling"]
    assert body["networkInterfaces"][0]["nicType"] == "GVNIC"


def test_a3_ultra_boots_from_hyperdisk_and_a_given_image(fake) -> None:
    spec = LaunchSpec(
        job="j", attempt=1, bootstrap="#!/bin/sh\n", image="projects/p/global/images/i"
    )
    provider(fake).launch(offer("a3-ultragpu-8g", zone="europe-west4-a"), spec, KEY)
    params = fake.calls("POST", "/instances")[0].body["disks"][0]["initializeParams"]
    assert params["diskType"] == "zones/europe-west4-a/diskTypes/hyperdisk-balanced"
    assert params["sourceImage"] == "projects/p/global/images/i"
    items = {i["key"] for i in fake.calls("POST", "/instances")[0].body["metadata"]["items"]}
    assert items == {"startup-script"}  # the driver flag is for the default DLVM image only


def test_a_retried_insert_reuses_the_request_id_and_makes_one_vm(fake) -> None:
    gcp = provider(fake)
    fake.fail_next("POST", INSERT, 503, error_body(503, "Backend Error", "backendError"))
    with pytest.raises(ProviderError):
        gcp.launch(T4_SPOT, SPEC, KEY)
    first = gcp.launch(T4_SPOT, SPEC, KEY)
    again = gcp.launch(T4_SPOT, SPEC, KEY)  # the caller lost the answer and asks once more
    assert first == again
    assert {c.query["requestId"] for c in inserts(fake)} == {request_id(KEY)}
    assert len(inserts(fake)) == 3
    assert list(fake.instances) == [(ZONE, first.instance_id)]


def test_an_insert_answered_already_exists_counts_as_launched(fake) -> None:
    gcp = provider(fake)
    ref = gcp.launch(T4_SPOT, SPEC, KEY)
    fake._by_request_id.clear()  # past the API's request-id memory (60 min or more)
    assert gcp.launch(T4_SPOT, SPEC, KEY) == ref
    assert len(fake.instances) == 1


def test_different_attempts_get_different_instances(fake) -> None:
    gcp = provider(fake)
    one = gcp.launch(T4_SPOT, SPEC, "job-42:3")
    two = gcp.launch(T4_SPOT, LaunchSpec(job=SPEC.job, attempt=4, bootstrap=BOOT), "job-42:4")
    assert one.instance_id != two.instance_id and len(fake.instances) == 2


def test_launch_waits_for_a_running_insert_operation(fake) -> None:
    fake.hold_operations = True
    ref = provider(fake).launch(T4_SPOT, SPEC, KEY)
    assert len(fake.calls("POST", "/wait")) == 1
    assert (ZONE, ref.instance_id) in fake.instances


def test_a_stockout_seen_while_waiting_is_a_capacity_error(fake) -> None:
    fake.hold_operations = True
    fake.fail_next_insert([{"code": "ZONE_RESOURCE_POOL_EXHAUSTED", "message": "no T4 left"}])
    with pytest.raises(CapacityError) as caught:
        provider(fake).launch(T4_SPOT, SPEC, KEY)
    assert caught.value.zone == ZONE and not fake.instances


def test_a_cap_below_the_quoted_price_refuses_to_launch(fake) -> None:
    capped = LaunchSpec(job="j", attempt=1, bootstrap="", max_usd_per_hour=0.5)
    with pytest.raises(PriceTooLowError):
        provider(fake).launch(offer("g2-standard-4", usd=0.7), capped, KEY)
    assert not inserts(fake)


# --- errors, one per code, in the real wire shapes ------------------------------------------------


def test_operation_zone_resource_pool_exhausted_raises_capacity_error(fake) -> None:
    fake.fail_next_insert([{"code": "ZONE_RESOURCE_POOL_EXHAUSTED", "message": "The zone …"}])
    with pytest.raises(CapacityError) as caught:
        provider(fake).launch(T4_SPOT, SPEC, KEY)
    assert (caught.value.zone, caught.value.code) == (ZONE, "ZONE_RESOURCE_POOL_EXHAUSTED")


def test_operation_zone_resource_pool_exhausted_with_details_raises_capacity_error(fake) -> None:
    detail = {
        "errorInfo": {
            "reason": "resource_availability",
            "domain": "compute.googleapis.com",
            "metadatas": {
                "zone": ZONE,
                "vmType": "n1-standard-8",
                "attachment": "nvidia-tesla-t4:1",
            },
        }
    }
    code = "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"
    fake.fail_next_insert(
        [{"code": code, "message": "A n1-standard-8 VM …", "errorDetails": [detail]}]
    )
    with pytest.raises(CapacityError) as caught:
        provider(fake).launch(T4_SPOT, SPEC, KEY)
    assert caught.value.code == code and caught.value.zone == ZONE


def test_operation_quota_exceeded_raises_quota_error_with_the_metric(fake) -> None:
    message = "Quota 'PREEMPTIBLE_NVIDIA_T4_GPUS' exceeded.  Limit: 0.0 in region us-central1."
    info = {"quotaInfo": {"metricName": "compute.googleapis.com/preemptible_nvidia_t4_gpus"}}
    fake.fail_next_insert([{"code": "QUOTA_EXCEEDED", "message": message, "errorDetails": [info]}])
    with pytest.raises(QuotaError, match="PREEMPTIBLE_NVIDIA_T4_GPUS"):
        provider(fake).launch(T4_SPOT, SPEC, KEY)


def test_http_quota_exceeded_raises_quota_error(fake) -> None:
    body = error_body(
        403, "Quota 'GPUS_ALL_REGIONS' exceeded.  Limit: 0.0 globally.", "QUOTA_EXCEEDED"
    )
    fake.fail_next("POST", INSERT, 403, body)
    with pytest.raises(QuotaError, match="GPUS_ALL_REGIONS"):
        provider(fake).launch(T4_SPOT, SPEC, KEY)


def test_rate_limit_exceeded_raises_throttled_error(fake) -> None:
    body = error_body(403, "Rate Limit Exceeded", "rateLimitExceeded", domain="usageLimits")
    fake.fail_next("POST", INSERT, 403, body)
    with pytest.raises(ThrottledError):
        provider(fake).launch(T4_SPOT, SPEC, KEY)


def test_http_429_raises_throttled_error(fake) -> None:
    body = {"error": {"code": 429, "message": "Too Many Requests", "status": "RESOURCE_EXHAUSTED"}}
    fake.fail_next("GET", "/aggregated/acceleratorTypes", 429, body)
    with pytest.raises(ThrottledError):
        provider(fake).fetch_offers()


def test_http_401_raises_auth_error(fake) -> None:
    body = error_body(401, "Request had invalid authentication credentials.", "authError")
    fake.fail_next("POST", INSERT, 401, body)
    with pytest.raises(AuthError):
        provider(fake).launch(T4_SPOT, SPEC, KEY)


def test_http_403_forbidden_raises_auth_error(fake) -> None:
    body = error_body(403, "Required 'compute.instances.create' permission", "forbidden")
    fake.fail_next("POST", INSERT, 403, body)
    with pytest.raises(AuthError, match=r"compute\.instances\.create"):
        provider(fake).launch(T4_SPOT, SPEC, KEY)


def test_other_http_errors_raise_provider_error(fake) -> None:
    body = error_body(400, "Invalid value for field 'resource.machineType'", "invalid")
    fake.fail_next("POST", INSERT, 400, body)
    with pytest.raises(ProviderError) as caught:
        provider(fake).launch(T4_SPOT, SPEC, KEY)
    assert type(caught.value) is ProviderError and caught.value.code == "invalid"


# --- describe and terminate -----------------------------------------------------------------------


def test_describe_reports_running_instances_without_reading_operations(fake) -> None:
    gcp = provider(fake)
    ref = gcp.launch(T4_SPOT, SPEC, KEY)
    [status] = gcp.describe([ref])
    assert (status.state, status.end_reason) == (InstanceState.RUNNING, None)
    assert fake.calls("GET", "/instances")[-1].query["filter"] == "labels.gpuopt-job:*"
    assert not fake.calls("GET", "/operations")


def test_a_preempted_and_deleted_spot_vm_is_reported_preempted(fake) -> None:
    gcp = provider(fake)
    ref = gcp.launch(T4_SPOT, SPEC, KEY)
    op = fake.preempt(ZONE, ref.instance_id)
    [status] = gcp.describe([ref])
    assert (status.state, status.end_reason) == (InstanceState.TERMINATED, EndReason.PREEMPTED)
    assert op["insertTime"] in status.detail
    call = fake.calls("GET", "/operations")[-1]
    assert call.query["filter"] == 'operationType="compute.instances.preempted"'


def test_a_preempted_and_stopped_vm_is_reported_preempted(fake) -> None:
    gcp = provider(fake)
    ref = gcp.launch(T4_SPOT, SPEC, KEY)
    fake.preempt(ZONE, ref.instance_id, delete=False)
    [status] = gcp.describe([ref])
    assert (status.state, status.end_reason) == (InstanceState.TERMINATED, EndReason.PREEMPTED)


def test_a_vanished_vm_without_a_preemption_was_deleted_by_a_user(fake) -> None:
    gcp = provider(fake)
    ref = gcp.launch(T4_SPOT, SPEC, KEY)
    other = gcp.launch(T4_SPOT, LaunchSpec(job="other", attempt=1, bootstrap=""), "other:1")
    fake.preempt(ZONE, other.instance_id)  # a different VM's preemption must not count
    del fake.instances[(ZONE, ref.instance_id)]
    statuses = gcp.describe([ref, other])
    assert [(s.ref, s.end_reason) for s in statuses] == [
        (ref, EndReason.USER),
        (other, EndReason.PREEMPTED),
    ]


def test_describe_covers_several_zones_in_input_order(fake) -> None:
    gcp = provider(fake)
    eu = gcp.launch(offer("n1-standard-8+nvidia-tesla-t4:1", zone="europe-west4-b"), SPEC, "a:1")
    us = gcp.launch(T4_SPOT, SPEC, "b:1")
    assert [s.ref for s in gcp.describe([us, eu])] == [us, eu]
    assert {c.path.split("/")[6] for c in fake.calls("GET", "/instances")} == {
        ZONE,
        "europe-west4-b",
    }


def test_terminate_deletes_and_tolerates_a_vm_already_gone(fake) -> None:
    gcp = provider(fake)
    ref = gcp.launch(T4_SPOT, SPEC, KEY)
    gcp.terminate(ref)
    assert not fake.instances
    [call] = fake.calls("DELETE")
    assert call.query["requestId"] == request_id(f"{ZONE}/{ref.instance_id}", "delete")
    gcp.terminate(InstanceRef("gcp", "us-central1", ZONE, "gpuopt-never-was"))
    [status] = gcp.describe([ref])
    assert (status.state, status.end_reason) == (InstanceState.TERMINATED, EndReason.USER)


def test_describe_reports_the_vms_own_start_and_stop_times(fake) -> None:
    """Launched at lastStartTimestamp; a stopped preempted VM ended at lastStopTimestamp, a
    deleted one when its preemption operation finished; a VM deleted by someone else has no
    end time here (the reconciler takes the time it saw it gone)."""
    clock = ManualClock(T0)
    fake.clock = clock
    gcp = provider(fake)
    stopped = gcp.launch(T4_SPOT, SPEC, "a:1")
    clock.advance(seconds=40)
    deleted = gcp.launch(T4_SPOT, SPEC, "b:1")
    vanished = gcp.launch(T4_SPOT, SPEC, "c:1")
    assert [s.launched_at for s in gcp.describe([stopped, deleted])] == [
        T0,
        T0 + timedelta(seconds=40),
    ]
    assert fake.instances[(ZONE, stopped.instance_id)]["lastStartTimestamp"].endswith("Z")
    clock.advance(minutes=30)
    fake.preempt(ZONE, stopped.instance_id, delete=False)
    clock.advance(seconds=5)
    fake.preempt(ZONE, deleted.instance_id)
    del fake.instances[(ZONE, vanished.instance_id)]
    one, two, three = gcp.describe([stopped, deleted, vanished])
    assert (one.state, one.end_reason) == (InstanceState.TERMINATED, EndReason.PREEMPTED)
    assert (one.launched_at, one.terminated_at) == (T0, T0 + timedelta(minutes=30, seconds=40))
    assert two.end_reason is EndReason.PREEMPTED and two.launched_at is None  # gone with it
    assert two.terminated_at == T0 + timedelta(minutes=30, seconds=45)
    assert three.end_reason is EndReason.USER and three.terminated_at is None


def test_timestamps_in_any_offset_read_as_utc() -> None:
    from providers.gcp.launch import Preemption, Times, instance_status, timestamp

    assert timestamp("2026-05-04T02:00:00.123-07:00") == datetime(
        2026, 5, 4, 9, 0, 0, 123000, tzinfo=UTC
    )
    assert timestamp("") is None and timestamp("soon") is None
    assert timestamp("2026-05-04T09:00:00") is None  # no offset: not what the API writes
    ref = InstanceRef("gcp", "us-central1", ZONE, "vm")
    created_only = instance_status(ref, "RUNNING", times=Times(created="2026-05-04T09:00:00Z"))
    assert created_only.launched_at == T0
    open_op = Preemption("vm", "2026-05-04T09:10:00Z")  # not done yet: its start
    assert open_op.ended_at == T0 + timedelta(minutes=10)


def test_the_agent_bootstrap_arrives_intact_as_the_startup_script(fake) -> None:
    """The script the daemon config's `agent:` section renders is the instance's metadata."""
    from optimizer.jobs.bootstrap import AgentInstall, AgentProxy, AgentSettings

    image = "projects/my-images/global/images/family/gpuopt-agent"
    agent = AgentSettings(
        install=AgentInstall(wheel_url="https://files.internal/gpuopt-0.4.1-py3-none-any.whl"),
        images={"gcp": image},
        env={"NOTE": 'it\'s $HOME & "quoted"'},
        proxy=AgentProxy(http="http://proxy.internal:3128"),
    )
    script = agent.script(
        daemon_url="https://gpuopt.example:8470",
        token="tok-" + "x" * 40,
        attempt_key="7-1",
        cloud="gcp",
        metadata_kind="gcp-metadata",
        expected_gpus=1,
    )
    assert "gpuopt[probes] @ https://files.internal/" in script
    spec = LaunchSpec(job="job-7", attempt=1, bootstrap=script, image=agent.image("gcp"))
    ref = provider(fake).launch(T4_SPOT, spec, KEY)

    stored = fake.instances[(ZONE, ref.instance_id)]
    metadata = {i["key"]: i["value"] for i in stored["metadata"]["items"]}
    assert metadata["startup-script"] == script
    assert "install-nvidia-driver" not in metadata  # a configured image brings its driver
    assert stored["disks"][0]["initializeParams"]["sourceImage"] == image


def test_gang_nodes_share_one_compact_placement_policy(fake) -> None:
    gcp = provider(fake)
    a3 = offer("a3-megagpu-8g")
    for rank in (0, 1):
        spec = replace(SPEC, gang=Gang("gpuopt-7-3", nodes=2, rank=rank))
        gcp.launch(a3, spec, f"7-3-n{rank}")
    policies = fake.calls("POST", "/resourcePolicies")
    assert len(policies) == 2  # asked by both nodes; the second finds it made (409)
    assert (
        policies[0].path == "/compute/v1/projects/gpuopt-test/regions/us-central1/resourcePolicies"
    )
    assert policies[0].body == {
        "name": "gpuopt-7-3",
        "groupPlacementPolicy": {"collocation": "COLLOCATED", "vmCount": 2},
    }
    assert list(fake.resource_policies) == [("us-central1", "gpuopt-7-3")]
    for call in inserts(fake):
        assert call.body["resourcePolicies"] == [
            "projects/gpuopt-test/regions/us-central1/resourcePolicies/gpuopt-7-3"
        ]


def test_a_partial_gang_on_gcp_is_deleted_and_the_next_offer_tried(fake, tmp_path: Path) -> None:
    gcp = provider(fake)
    first, second = offer("a3-megagpu-8g"), offer("a3-highgpu-8g", usd=2.0)

    class SecondNodeFails:
        """The GCP fake, except that the first gang's second node meets a stockout."""

        name = "gcp"

        def __init__(self) -> None:
            self.calls = 0

        def launch(self, offer: Offer, spec: LaunchSpec, key: str) -> InstanceRef:
            self.calls += 1
            if self.calls == 2:
                raise CapacityError("ZONE_RESOURCE_POOL_EXHAUSTED", provider="gcp")
            return gcp.launch(offer, spec, key)

        def terminate(self, ref: InstanceRef) -> None:
            gcp.terminate(ref)

    torn_down, *kept = gang_walk(tmp_path, SecondNodeFails(), [first, second])
    assert (ZONE, torn_down) not in fake.instances
    assert sorted(fake.instances) == sorted((ZONE, name) for name in kept) and len(kept) == 2
    assert {i["machineType"].rsplit("/", 1)[1] for i in fake.instances.values()} == {
        "a3-highgpu-8g"
    }


def test_a_gangs_compact_placement_policy_is_deleted_once_its_vms_are(fake) -> None:
    gcp = provider(fake)
    a3 = offer("a3-megagpu-8g")
    refs = [
        gcp.launch(a3, replace(SPEC, gang=Gang("gpuopt-7-3", nodes=2, rank=rank)), f"7-3-n{rank}")
        for rank in (0, 1)
    ]
    assert gcp.release_placement("us-central1", "gpuopt-7-3") is False  # both VMs name it
    gcp.terminate(refs[0])
    assert gcp.release_placement("us-central1", "gpuopt-7-3") is False  # one still does
    gcp.terminate(refs[1])
    assert gcp.release_placement("us-central1", "gpuopt-7-3") is True
    assert fake.resource_policies == {}
    assert gcp.release_placement("us-central1", "gpuopt-7-3") is True  # gone already: 404
    path = "/compute/v1/projects/gpuopt-test/regions/us-central1/resourcePolicies/gpuopt-7-3"
    assert [c.path for c in fake.calls("DELETE", "/resourcePolicies/")] == [path] * 4


def test_a_refused_placement_delete_is_a_typed_error(fake) -> None:
    forbidden = error_body(403, "Required 'compute.resourcePolicies.delete'", "forbidden")
    fake.fail_next("DELETE", "/resourcePolicies/", 403, forbidden)
    with pytest.raises(AuthError):
        provider(fake).release_placement("us-central1", "gpuopt-7-3")
