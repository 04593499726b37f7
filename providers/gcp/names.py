"""GCP names gpuopt derives: instance types with attached GPUs, regions, labels, instance names.

Pure string functions, shared by the live provider and the SkyPilot catalog reader.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from dataclasses import dataclass

# Instance types for n1 hosts with attached GPUs: `<host>+<accelerator type>:<count>`.
_ATTACHED = re.compile(r"^(?P<host>[a-z][a-z0-9-]*)\+(?P<acc>[a-z][a-z0-9-]*):(?P<count>[1-9]\d*)$")
# Label keys and values: at most 63 characters of lowercase letters, digits, `_` and `-`; keys
# start with a letter (https://cloud.google.com/compute/docs/labeling-resources#requirements).
_LABEL_MAX = 63
_LABEL_BAD = re.compile(r"[^a-z0-9_-]+")
# Instance names: RFC 1035, `[a-z]([-a-z0-9]{0,61}[a-z0-9])?` (Compute API `Instance.name`).
_NAME_MAX = 63
_NAME_BAD = re.compile(r"[^a-z0-9-]+")
# A fixed namespace for UUID5 request ids, so one idempotency key always gives one id.
REQUEST_ID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://github.com/gpuopt/gpuopt#gcp")


@dataclass(frozen=True, slots=True)
class InstanceType:
    """A gpuopt GCP instance type split into the machine type and any attached GPUs."""

    machine_type: str
    accelerator: str | None = None  # attached accelerator type (n1 hosts only)
    count: int = 0

    @property
    def attached(self) -> bool:
        return self.accelerator is not None


def attached_instance_type(host: str, accelerator: str, count: int) -> str:
    """The instance type gpuopt uses for an n1 host with attached GPUs."""
    return f"{host}+{accelerator}:{count}"


def parse_instance_type(instance_type: str) -> InstanceType:
    """Split `n1-standard-8+nvidia-tesla-t4:1`; a plain machine type comes back as is."""
    if "+" not in instance_type:
        return InstanceType(instance_type)
    match = _ATTACHED.match(instance_type)
    if match is None:
        raise ValueError(f"not a GCP instance type: {instance_type!r}")
    return InstanceType(match["host"], match["acc"], int(match["count"]))


def region_of(zone: str) -> str:
    """`europe-west4-a` → `europe-west4`."""
    return zone.rsplit("-", 1)[0]


def basename(link: str) -> str:
    """The last path segment of a self link or partial URL (`…/zones/us-central1-a`)."""
    return link.rstrip("/").rsplit("/", 1)[-1]


def _digest(text: str, length: int = 8) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:length]


def label_value(text: str) -> str:
    """`text` as a valid label value: lowercased, other characters as `-`; text too long is
    cut and given a hash of the whole, so two long values stay distinct."""
    clean = _LABEL_BAD.sub("-", text.lower()).strip("-")
    if len(clean) <= _LABEL_MAX:
        return clean
    suffix = _digest(text)
    return f"{clean[: _LABEL_MAX - len(suffix) - 1].rstrip('-')}-{suffix}"


def label_key(text: str) -> str:
    """`text` as a valid label key (starts with a letter)."""
    value = label_value(text)
    return value if value[:1].isalpha() else f"k-{value}"[:_LABEL_MAX]


def instance_name(job: str, attempt: int, idempotency_key: str) -> str:
    """A stable instance name for one attempt: the same key always gives the same name.

    `gpuopt-<job>-a<attempt>-<hash of key>`; the job part is cut so the whole fits 63 chars.
    """
    tail = f"-a{attempt}-{_digest(idempotency_key)}"
    job_part = _NAME_BAD.sub("-", job.lower()).strip("-")
    head = f"gpuopt-{job_part}"[: _NAME_MAX - len(tail)].rstrip("-")
    return f"{head}{tail}"


def request_id(idempotency_key: str, action: str = "insert") -> str:
    """The Compute API `requestId` for one action on one attempt (a UUID5, never zero)."""
    return str(uuid.uuid5(REQUEST_ID_NAMESPACE, f"{action}:{idempotency_key}"))
