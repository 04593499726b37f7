"""Building the instance to insert, and reading instances and preemptions back.

`instance_body` makes the `compute_v1.Instance` for one attempt; `instance_status` turns what
`instances.list` and the zone's preemption operations say into an InstanceStatus.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from optimizer.clock import parse_utc
from providers.base import EndReason, InstanceRef, InstanceState, InstanceStatus, LaunchSpec
from providers.gcp.names import InstanceType, label_key, label_value

JOB_LABEL = "gpuopt-job"
ATTEMPT_LABEL = "gpuopt-attempt"
# `labels.KEY:*` is the Compute list filter for "has this label key" (API `filter` docs).
MANAGED_FILTER = f"labels.{JOB_LABEL}:*"
# Zone operations recording a Spot/preemptible VM's preemption (REFERENCE §2.5).
PREEMPTED_OPERATION = "compute.instances.preempted"
PREEMPTED_FILTER = f'operationType="{PREEMPTED_OPERATION}"'
# Deep Learning VM image (CUDA 12.8, NVIDIA driver 570: Blackwell included); it installs the
# driver at first boot when `install-nvidia-driver=True` is in the metadata
# (https://cloud.google.com/deep-learning-vm/docs/images). Families are retired over time:
# `gcloud compute images list --project deeplearning-platform-release` shows the current ones.
DEFAULT_IMAGE = (
    "projects/deeplearning-platform-release/global/images/family/"
    "common-cu128-ubuntu-2204-nvidia-570"
)
DEFAULT_NETWORK = "global/networks/default"
# A3 Ultra and A4 attach only Hyperdisk; A3 and A4 need the gVNIC network interface
# (https://cloud.google.com/compute/docs/accelerator-optimized-machines).
_HYPERDISK_ONLY = ("a3-ultragpu-", "a4-", "a4x-")
_GVNIC = ("a3-", "a4-", "a4x-")

_STATES = {
    "PROVISIONING": InstanceState.PENDING,
    "STAGING": InstanceState.PENDING,
    "REPAIRING": InstanceState.PENDING,
    "RUNNING": InstanceState.RUNNING,
    "STOPPING": InstanceState.STOPPING,
    "SUSPENDING": InstanceState.STOPPING,
    "SUSPENDED": InstanceState.TERMINATED,
    "TERMINATED": InstanceState.TERMINATED,
    "STOPPED": InstanceState.TERMINATED,
}


def launch_labels(spec: LaunchSpec) -> dict[str, str]:
    """The job and attempt labels plus the spec's own, all made valid GCP labels."""
    labels = {label_key(k): label_value(v) for k, v in spec.labels}
    labels[JOB_LABEL] = label_value(spec.job)
    labels[ATTEMPT_LABEL] = str(spec.attempt)
    return labels


def instance_body(
    *,
    name: str,
    zone: str,
    kind: InstanceType,
    spot: bool,
    spec: LaunchSpec,
    image: str = DEFAULT_IMAGE,
    network: str = DEFAULT_NETWORK,
) -> Any:
    """The `compute_v1.Instance` to insert for one attempt."""
    from google.cloud import compute_v1

    machine = kind.machine_type
    source_image = spec.image or image
    if spot:
        # Spot VM deleted on preemption, never restarted (REFERENCE §2.4; SkyPilot's choice).
        scheduling = compute_v1.Scheduling(
            provisioning_model="SPOT",
            instance_termination_action="DELETE",
            on_host_maintenance="TERMINATE",
            automatic_restart=False,
        )
    else:
        # GPU VMs cannot live-migrate: maintenance stops them (https://cloud.google.com/
        # compute/docs/gpus/gpu-host-maintenance).
        scheduling = compute_v1.Scheduling(
            provisioning_model="STANDARD", on_host_maintenance="TERMINATE", automatic_restart=True
        )
    disk_type = "hyperdisk-balanced" if machine.startswith(_HYPERDISK_ONLY) else "pd-balanced"
    disk = compute_v1.AttachedDisk(
        boot=True,
        auto_delete=True,
        initialize_params=compute_v1.AttachedDiskInitializeParams(
            source_image=source_image,
            disk_size_gb=spec.disk_gib,
            disk_type=f"zones/{zone}/diskTypes/{disk_type}",
        ),
    )
    nic = compute_v1.NetworkInterface(
        network=network,
        access_configs=[compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")],
    )
    if machine.startswith(_GVNIC):
        nic.nic_type = "GVNIC"
    items = [compute_v1.Items(key="startup-script", value=spec.bootstrap)]
    if source_image == DEFAULT_IMAGE:
        items.append(compute_v1.Items(key="install-nvidia-driver", value="True"))
    instance = compute_v1.Instance(
        name=name,
        machine_type=f"zones/{zone}/machineTypes/{machine}",
        scheduling=scheduling,
        disks=[disk],
        network_interfaces=[nic],
        metadata=compute_v1.Metadata(items=items),
        labels=launch_labels(spec),
    )
    if kind.accelerator:
        instance.guest_accelerators = [
            compute_v1.AcceleratorConfig(
                accelerator_type=f"zones/{zone}/acceleratorTypes/{kind.accelerator}",
                accelerator_count=kind.count,
            )
        ]
    return instance


def placement_policy(name: str, nodes: int) -> Any:
    """A gang's compact placement: a resource policy with a COLLOCATED group placement for
    exactly `nodes` VMs, which must all be created at the same time (REFERENCE-ROUND2 §6:
    `groupPlacementPolicy.{collocation, vmCount}`; the instances name it in
    `resourcePolicies`)."""
    from google.cloud import compute_v1

    return compute_v1.ResourcePolicy(
        name=name,
        group_placement_policy=compute_v1.ResourcePolicyGroupPlacementPolicy(
            collocation="COLLOCATED", vm_count=nodes
        ),
    )


def placement_url(project: str, region: str, name: str) -> str:
    return f"projects/{project}/regions/{region}/resourcePolicies/{name}"


@dataclass(frozen=True, slots=True)
class Preemption:
    """A `compute.instances.preempted` operation: when GCP took the VM back."""

    instance: str
    at: str  # the operation's insertTime (RFC 3339)
    ended: str = ""  # its endTime, once the operation is done ("" before)

    @property
    def ended_at(self) -> datetime | None:
        """When GCP finished taking the VM back: the end time, else the start."""
        return timestamp(self.ended) or timestamp(self.at)


@dataclass(frozen=True, slots=True)
class Times:
    """An instance's own timestamps (RFC 3339 strings, "" when unset)."""

    created: str = ""  # creationTimestamp
    started: str = ""  # lastStartTimestamp
    stopped: str = ""  # lastStopTimestamp


def timestamp(text: str | None) -> datetime | None:
    """An RFC 3339 timestamp as the Compute API writes it, in UTC; None if unset or unreadable."""
    if not text:
        return None
    try:
        parsed = parse_utc(text)
    except ValueError:
        return None
    return parsed.astimezone(UTC) if parsed.tzinfo else None


def instance_status(
    ref: InstanceRef,
    status: str | None,
    status_message: str = "",
    preemption: Preemption | None = None,
    times: Times = Times(),
) -> InstanceStatus:
    """The InstanceStatus for one instance; `status` None means the instance is gone.

    Launched at its last start (a VM bills from `RUNNING`), else its creation; ended at its
    last stop, else, for a preempted VM, when the preemption operation finished. A VM that is
    gone without a preemption has no end time here (the reconciler uses the time it saw it
    gone)."""
    preempted = f"preempted at {preemption.at}" if preemption else ""
    ended = preemption.ended_at if preemption is not None else None
    if status is None:
        if preemption is not None:
            return InstanceStatus(
                ref,
                InstanceState.TERMINATED,
                EndReason.PREEMPTED,
                preempted,
                terminated_at=ended,
            )
        # Not found and no preemption recorded: someone deleted it.
        return InstanceStatus(ref, InstanceState.TERMINATED, EndReason.USER, "instance not found")
    state = _STATES.get(status.upper(), InstanceState.PENDING)
    detail = " ".join(part for part in (status, status_message, preempted) if part)
    reason: EndReason | None = None
    if preemption is not None and state in (InstanceState.STOPPING, InstanceState.TERMINATED):
        reason = EndReason.PREEMPTED
    elif state is InstanceState.TERMINATED:
        reason = EndReason.USER
    launched = timestamp(times.started) or timestamp(times.created)
    terminated = None
    if state is InstanceState.TERMINATED:
        terminated = timestamp(times.stopped) or ended
    return InstanceStatus(
        ref, state, reason, detail, launched_at=launched, terminated_at=terminated
    )
