"""The GPU hardware table: one canonical spec per model, with every cloud's spelling mapped onto it.

The figures live in `optimizer/data/gpus.yaml` (each row cites its source). Lookups never raise
and never guess: a name the table does not know becomes an `unknown:<raw>` spec with no figures.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from optimizer.model import Fabric, Interconnect

DTYPES: tuple[str, ...] = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8")
UNKNOWN_PREFIX = "unknown:"
# Cloud-reported memory within 7% of a model's size counts as that model (gpuhunt's rule).
MEMORY_SNAP_TOLERANCE = 0.07
# The policy rule "real FP64 units": consumer/inference parts run FP64 at 1/32-1/64 rate.
FP64_UNITS_MIN_TFLOPS = 5.0

_TFLOPS_KEYS = (*DTYPES, "fp64_tensor")
# torch-style dtype names, accepted where a policy or probe speaks them.
_DTYPE_SYNONYMS = {"float64": "fp64", "float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
_VENDORS = ("nvidia", "amd")
_LINK_KIND = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_CC = re.compile(r"^\d+\.\d+$")


class GpuTableError(ValueError):
    """The hardware table holds a row that cannot be right; the message names the row."""


class UnknownDtypeError(ValueError):
    """A dtype name that is none of DTYPES (nor a common synonym of one)."""


@dataclass(frozen=True, slots=True)
class Link:
    """A GPU's link to its peers or to the host; `gbps` is the bidirectional GB/s, if stated."""

    kind: str
    gbps: float | None = None


@dataclass(frozen=True, slots=True)
class Tflops:
    """Dense peak throughput per GPU (TFLOPS; int8 in TOPS). None: no such unit, or no figure."""

    fp64: float | None = None
    fp32: float | None = None
    tf32: float | None = None
    bf16: float | None = None
    fp16: float | None = None
    fp8: float | None = None
    int8: float | None = None
    fp64_tensor: float | None = None  # tensor/matrix-core FP64, where the GPU has it


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU model's figures. `known` is False for a name the table lacks (see `unknown`)."""

    name: str
    vendor: str | None
    architecture: str | None
    memory_gib: float
    memory_bandwidth_gbs: float | None
    tflops: Tflops
    gpu_link: Link | None
    host_link: Link | None
    tdp_w: float | None
    compute_capability: str | None
    source: str
    aliases: tuple[str, ...] = ()
    aws_names: tuple[str, ...] = ()
    known: bool = True
    raw_name: str | None = None  # the unrecognised spelling, on unknown specs only

    def tflops_for(self, dtype: str) -> float | None:
        """Dense peak for `dtype`: one of DTYPES, `fp64_tensor`, or a torch name (`bfloat16`)."""
        key = dtype.strip().lower()
        key = _DTYPE_SYNONYMS.get(key, key)
        if key not in _TFLOPS_KEYS:
            raise UnknownDtypeError(f"unknown dtype {dtype!r}; expected one of {DTYPES}")
        value: float | None = getattr(self.tflops, key)
        return value

    @property
    def has_fp64_units(self) -> bool:
        """True where vector FP64 reaches FP64_UNITS_MIN_TFLOPS (real FP64 units)."""
        return self.tflops.fp64 is not None and self.tflops.fp64 >= FP64_UNITS_MIN_TFLOPS


# The fields a table row may carry: every GpuSpec field except the two lookups set.
_ROW_KEYS = frozenset(f.name for f in fields(GpuSpec)) - {"known", "raw_name"}


def unknown(raw: str) -> GpuSpec:
    """The spec for a name the table does not know: no figures, zero memory, the name kept."""
    return GpuSpec(
        name=f"{UNKNOWN_PREFIX}{raw}",
        vendor=None,
        architecture=None,
        memory_gib=0.0,
        memory_bandwidth_gbs=None,
        tflops=Tflops(),
        gpu_link=None,
        host_link=None,
        tdp_w=None,
        compute_capability=None,
        source="",
        known=False,
        raw_name=raw,
    )


def _key(text: str) -> str:
    """Matching form of a name: case-folded, spaces/underscores/dashes as one dash."""
    return re.sub(r"[\s_\-]+", "-", text.strip().casefold()).strip("-")


# --- loading and validation ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Table:
    specs: tuple[GpuSpec, ...]
    by_key: dict[str, GpuSpec]  # canonical names and aliases
    by_aws_name: dict[str, tuple[GpuSpec, ...]]  # AWS GpuInfo names; may be several models


def _number(row_ref: str, field: str, value: Any, *, required: bool = False) -> float | None:
    if value is None:
        if required:
            raise GpuTableError(f"{row_ref}: {field} is required")
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise GpuTableError(f"{row_ref}: {field} must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise GpuTableError(f"{row_ref}: {field} must be a finite number >= 0, got {value!r}")
    return float(value)


def _names(row_ref: str, field: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise GpuTableError(f"{row_ref}: {field} must be a list of non-empty strings")
    return tuple(v.strip() for v in value)


def _link(row_ref: str, field: str, value: Any) -> Link | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = {"kind": value}
    if not isinstance(value, dict) or set(value) - {"kind", "gbps"}:
        raise GpuTableError(f"{row_ref}: {field} must be a kind string or {{kind, gbps}}")
    kind = value.get("kind")
    if not isinstance(kind, str) or not _LINK_KIND.match(kind):
        raise GpuTableError(f"{row_ref}: {field}.kind must be like 'nvlink4', got {kind!r}")
    return Link(kind=kind, gbps=_number(row_ref, f"{field}.gbps", value.get("gbps")))


def _tflops(row_ref: str, value: Any) -> Tflops:
    if not isinstance(value, dict):
        raise GpuTableError(f"{row_ref}: tflops must be a mapping of dtype to TFLOPS")
    extra = sorted(str(k) for k in set(value) - set(_TFLOPS_KEYS))
    if extra:
        raise GpuTableError(f"{row_ref}: tflops has unknown dtype {', '.join(extra)}")
    missing = [d for d in DTYPES if d not in value]
    if missing:
        # Every dtype is written out, null where absent, so a gap is always deliberate.
        raise GpuTableError(f"{row_ref}: tflops lacks {', '.join(missing)} (write null)")
    return Tflops(**{k: _number(row_ref, f"tflops.{k}", value.get(k)) for k in _TFLOPS_KEYS})


def _row(row: Any, ref: str) -> GpuSpec:
    if not isinstance(row, dict):
        raise GpuTableError(f"{ref}: a row must be a mapping")
    name = row.get("name")
    if not isinstance(name, str) or not name.strip():
        raise GpuTableError(f"{ref}: name is required")
    ref = f"{ref} ({name})"
    unknown_keys = sorted(str(k) for k in set(row) - _ROW_KEYS)
    if unknown_keys:
        raise GpuTableError(f"{ref}: unknown field {', '.join(unknown_keys)}")
    source = row.get("source")
    if not isinstance(source, str) or not source.strip():
        raise GpuTableError(f"{ref}: source is required (cite where the figures come from)")
    vendor = row.get("vendor")
    if vendor not in _VENDORS:
        raise GpuTableError(f"{ref}: vendor must be one of {_VENDORS}, got {vendor!r}")
    memory = _number(ref, "memory_gib", row.get("memory_gib"), required=True)
    if not memory:
        raise GpuTableError(f"{ref}: memory_gib must be > 0")
    cc = row.get("compute_capability")
    if cc is not None:
        cc = str(cc)
        if not _CC.match(cc):
            raise GpuTableError(f"{ref}: compute_capability must be like '8.0', got {cc!r}")
    arch = row.get("architecture")
    if arch is not None and not isinstance(arch, str):
        raise GpuTableError(f"{ref}: architecture must be a string")
    return GpuSpec(
        name=name.strip(),
        vendor=vendor,
        architecture=arch,
        memory_gib=memory,
        memory_bandwidth_gbs=_number(ref, "memory_bandwidth_gbs", row.get("memory_bandwidth_gbs")),
        tflops=_tflops(ref, row.get("tflops")),
        gpu_link=_link(ref, "gpu_link", row.get("gpu_link")),
        host_link=_link(ref, "host_link", row.get("host_link")),
        tdp_w=_number(ref, "tdp_w", row.get("tdp_w")),
        compute_capability=cc,
        source=" ".join(source.split()),
        aliases=_names(ref, "aliases", row.get("aliases")),
        aws_names=_names(ref, "aws_names", row.get("aws_names")),
    )


def load_table(path: str | Path | None = None, *, text: str | None = None) -> tuple[GpuSpec, ...]:
    """Parse and validate a hardware table (default: the packaged gpus.yaml).

    Raises GpuTableError naming the file, line and row of the first bad entry.
    """
    return _build(path, text).specs


def _build(path: str | Path | None, text: str | None) -> _Table:
    if text is None:
        if path is None:
            origin = "optimizer/data/gpus.yaml"
            text = resources.files("optimizer").joinpath("data", "gpus.yaml").read_text("utf-8")
        else:
            origin = str(path)
            text = Path(path).read_text(encoding="utf-8")
    else:
        origin = str(path) if path is not None else "<text>"
    try:
        root: Any = yaml.compose(text, Loader=yaml.SafeLoader)  # the node tree, for line numbers
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise GpuTableError(f"{origin}: not valid YAML: {exc}") from exc
    rows = data.get("gpus") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not rows:
        raise GpuTableError(f"{origin}: expected a top-level 'gpus:' list of rows")
    row_nodes = next(value for key, value in root.value if key.value == "gpus").value
    specs: list[GpuSpec] = []
    by_key: dict[str, GpuSpec] = {}
    by_aws: dict[str, list[GpuSpec]] = {}
    for index, (row, node) in enumerate(zip(rows, row_nodes, strict=True), start=1):
        ref = f"{origin}:{node.start_mark.line + 1}: row {index}"
        spec = _row(row, ref)
        for spelling in (spec.name, *spec.aliases):
            key = _key(spelling)
            other = by_key.get(key)
            if other is not None and other is not spec:
                raise GpuTableError(
                    f"{ref} ({spec.name}): name or alias {spelling!r} is already {other.name}"
                )
            by_key[key] = spec
        for aws_name in dict.fromkeys(_key(n) for n in spec.aws_names):
            by_aws.setdefault(aws_name, []).append(spec)
        specs.append(spec)
    return _Table(tuple(specs), by_key, {k: tuple(v) for k, v in by_aws.items()})


@functools.cache
def _default_table() -> _Table:
    return _build(None, None)


# --- lookups ---------------------------------------------------------------------------------


def all_gpus() -> list[GpuSpec]:
    """Every known GPU model, in table order."""
    return list(_default_table().specs)


def lookup(name: str) -> GpuSpec | None:
    """The model a canonical name or alias denotes, or None when the table does not know it."""
    if not isinstance(name, str):
        return None
    return _default_table().by_key.get(_key(name))


def get(name: str) -> GpuSpec:
    """The model for a canonical name or alias; an `unknown:` spec otherwise. Never raises.

    An `unknown:<raw>` name (as stored on an Offer) comes back as the same unknown spec.
    """
    spec = lookup(name)
    if spec is not None:
        return spec
    raw = name if isinstance(name, str) else repr(name)
    return unknown(raw.removeprefix(UNKNOWN_PREFIX))


# p5e/p5en once reported the bare name "NVIDIA" (skypilot#4652). Only a memory size can say
# which GPU that was, so this name never resolves without one.
_AWS_BARE_VENDOR_NAMES: dict[str, tuple[str, ...]] = {"nvidia": ("H200-141GB",)}


def _mib_text(memory_mib: float) -> str:
    return str(int(memory_mib)) if float(memory_mib).is_integer() else f"{memory_mib:g}"


def from_aws(name: str, memory_mib: int | float | None, manufacturer: str | None = None) -> GpuSpec:
    """The model for AWS `GpuInfo.Gpus[].Name` and `MemoryInfo.SizeInMiB`. Never raises.

    Where one AWS name covers several models (`A100`: p4d 40 GB, p4de 80 GB) the memory picks
    the one within MEMORY_SNAP_TOLERANCE; memory far from every candidate, an ambiguous name
    without memory, or a manufacturer that contradicts the model gives an `unknown:` spec.
    """
    name = name if isinstance(name, str) else repr(name)
    key = _key(name)
    table = _default_table()
    mem: float | None = None
    if memory_mib is not None:
        valid = isinstance(memory_mib, int | float) and not isinstance(memory_mib, bool)
        if not valid or not math.isfinite(memory_mib) or memory_mib <= 0:
            return unknown(f"{name}/{memory_mib!r}MiB")
        mem = float(memory_mib)
    raw = name if mem is None else f"{name}/{_mib_text(mem)}MiB"

    if key in _AWS_BARE_VENDOR_NAMES:
        if mem is None:
            return unknown(raw)
        candidates = [table.by_key[_key(n)] for n in _AWS_BARE_VENDOR_NAMES[key]]
    else:
        candidates = list(table.by_aws_name.get(key, ()))
        alias_match = table.by_key.get(key)  # e.g. SkyPilot's rewritten "A100-80GB"
        if alias_match is not None and alias_match not in candidates:
            candidates.append(alias_match)
    if not candidates:
        return unknown(raw)

    if mem is None:
        chosen = candidates[0] if len(candidates) == 1 else None
    else:
        gaps = [(abs(mem - s.memory_gib * 1024) / (s.memory_gib * 1024), s) for s in candidates]
        gap, best = min(gaps, key=lambda pair: pair[0])
        chosen = best if gap <= MEMORY_SNAP_TOLERANCE else None
    if chosen is None:
        return unknown(raw)
    maker = _key(manufacturer) if isinstance(manufacturer, str) else ""
    if maker and maker != chosen.vendor:
        return unknown(f"{manufacturer} {raw}")
    return chosen


def from_gcp(accelerator: str) -> GpuSpec:
    """The model for a GCP accelerator type (`nvidia-l4`, `nvidia-tesla-t4-vws`, ...) or a
    SkyPilot catalog name (`A100-80GB`, `H100-MEGA`). Never raises."""
    if not isinstance(accelerator, str):
        return unknown(repr(accelerator))
    key = _key(accelerator)
    # The -vws types are the same GPU sold with an NVIDIA RTX Virtual Workstation licence.
    key = key.removesuffix("-vws")
    spec = _default_table().by_key.get(key)
    return spec if spec is not None else unknown(accelerator.strip())


# --- interconnect ----------------------------------------------------------------------------

# AWS "Accelerated computing instance types" specifications list NVLink between the GPUs of
# the multi-GPU P3 sizes and of P3dn, P4d, P4de, P5, P5e, P5en and the P6 families
# (p6-b200, p6-b300, p6e-gb200); the G families attach their GPUs over PCIe only.
_AWS_NVLINK_FAMILIES = frozenset({"p3", "p3dn", "p4d", "p4de", "p5", "p5e", "p5en"})
_AWS_NVLINK_PREFIXES = ("p6-", "p6e-")
# GCP "GPU machine types": the accelerator-optimized A2, A3 and A4 series connect their GPUs
# with NVLink/NVSwitch. G2 (L4) is PCIe. N1 with attached GPUs is reported as PCIe: GCP lists
# an NVLink ring for V100 on N1, but the machine type alone does not say which GPU is attached.
_GCP_NVLINK_SERIES = frozenset({"a2", "a3", "a4", "a4x"})


def aws_interconnect(instance_type: str, gpu_count: int) -> Interconnect:
    """The GPU-to-GPU link inside one EC2 instance; PCIE wherever NVLink is not documented."""
    if gpu_count <= 1:
        return Interconnect.NONE
    family = instance_type.strip().lower().split(".", 1)[0]
    if family in _AWS_NVLINK_FAMILIES or family.startswith(_AWS_NVLINK_PREFIXES):
        return Interconnect.NVLINK
    return Interconnect.PCIE


def gcp_interconnect(machine_type: str, gpu_count: int) -> Interconnect:
    """The GPU-to-GPU link inside one GCE machine; PCIE wherever NVLink is not documented."""
    if gpu_count <= 1:
        return Interconnect.NONE
    if machine_type.strip().lower().split("-", 1)[0] in _GCP_NVLINK_SERIES:
        return Interconnect.NVLINK
    return Interconnect.PCIE


def pcie_interconnect(instance_type: str, gpu_count: int) -> Interconnect:
    """PCIe between the GPUs of any multi-GPU type: a cloud that documents no NVLink (the
    local cloud, whose processes share no GPU link)."""
    return Interconnect.NONE if gpu_count <= 1 else Interconnect.PCIE


# --- inter-node fabric -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FabricSpec:
    """An instance type's inter-node fabric: the kind, how many of its interfaces an instance
    carries (AWS: EFA interfaces; GCP: GPU data NICs) and the line rate, Gbit/s per instance
    (None where the source gives a range)."""

    fabric: Fabric
    interfaces: int = 0
    gbps: float | None = None


NO_FABRIC = FabricSpec(Fabric.NONE)

# AWS: EfaInfo.MaximumEfaInterfaces and the network bandwidth of DescribeInstanceTypes (the
# copy in getmoto/moto's instance_types.json, refreshed 2026-08-02; REFERENCE-ROUND2 §6);
# read live as NetworkInfo.EfaInfo.MaximumEfaInterfaces. Smaller g5/g6/g6e sizes, g4ad and
# g5g have no EFA.
_AWS_EFA: dict[str, tuple[int, float | None]] = {
    "p4d.24xlarge": (4, 400.0),
    "p4de.24xlarge": (4, 400.0),
    "p5.48xlarge": (32, 3200.0),
    "p5e.48xlarge": (32, 3200.0),
    "p5en.48xlarge": (16, 3200.0),
    "p5.4xlarge": (1, 100.0),
    "p6-b200.48xlarge": (8, 3200.0),
    "p6-b300.48xlarge": (16, 3200.0),
    "g6e.48xlarge": (4, 400.0),
    "g6e.24xlarge": (2, 200.0),
    "g6e.8xlarge": (1, None),  # 25-100 Gbit
    "g6e.12xlarge": (1, None),
    "g6e.16xlarge": (1, None),
}
# g5, g6 and g4dn carry one EFA interface from 8xlarge up (25-100 Gbit).
_AWS_EFA_FAMILIES = frozenset({"g5", "g6", "g4dn"})
_AWS_EFA_SIZES = frozenset({"8xlarge", "12xlarge", "16xlarge", "24xlarge", "48xlarge", "metal"})
# GCP "GPU network bandwidth" (cloud.google.com/compute/docs/gpus/gpu-network-bandwidth;
# REFERENCE-ROUND2 §6): the GPU data NICs of each accelerator-optimized type and their total
# for GPU traffic. A3 Mega's and A3 High's NIC counts as dstack's cluster examples configure
# them (8 and 4 extra VPCs). A2 and G2 have no GPU fabric.
_GCP_FABRIC: dict[str, FabricSpec] = {
    "a4-highgpu-8g": FabricSpec(Fabric.GPUDIRECT_RDMA, 8, 3200.0),
    "a3-ultragpu-8g": FabricSpec(Fabric.GPUDIRECT_RDMA, 8, 3200.0),
    "a4x-highgpu-4g": FabricSpec(Fabric.GPUDIRECT_RDMA, 4, 1600.0),
    "a3-megagpu-8g": FabricSpec(Fabric.GPUDIRECT_TCPXO, 8, 1800.0),
    "a3-highgpu-8g": FabricSpec(Fabric.GPUDIRECT_TCPX, 4, 1000.0),
    "a3-edgegpu-8g": FabricSpec(Fabric.GPUDIRECT_TCPX, 4, None),  # 600-800 Gbit
}


def aws_fabric(instance_type: str) -> FabricSpec:
    """An EC2 type's EFA interfaces (NO_FABRIC wherever none is documented)."""
    itype = instance_type.strip().lower()
    found = _AWS_EFA.get(itype)
    if found is not None:
        return FabricSpec(Fabric.EFA, found[0], found[1])
    family, _, size = itype.partition(".")
    if family in _AWS_EFA_FAMILIES and size in _AWS_EFA_SIZES:
        return FabricSpec(Fabric.EFA, 1, None)
    return NO_FABRIC


def gcp_fabric(machine_type: str) -> FabricSpec:
    """A GCE machine type's GPU data NICs (NO_FABRIC wherever none is documented)."""
    return _GCP_FABRIC.get(machine_type.strip().lower(), NO_FABRIC)


def either_fabric(instance_type: str) -> FabricSpec:
    """The local cloud's types are the snapshot's AWS and GCP types: looked up under either."""
    aws = aws_fabric(instance_type)
    return aws if aws.fabric is not Fabric.NONE else gcp_fabric(instance_type)


# --- per-cloud facts -------------------------------------------------------------------------


class UnknownCloudError(ValueError):
    """A provider whose hardware facts this table does not hold."""


@dataclass(frozen=True, slots=True)
class HardwareFacts:
    """What a cloud documents about its instance types beyond the GPU: the link between the
    GPUs of one instance and the inter-node fabric. Each provider's registry entry carries its
    own (`ProviderEntry.hardware`)."""

    interconnect: Callable[[str, int], Interconnect]  # (instance type, GPU count)
    fabric: Callable[[str], FabricSpec]  # (instance type)


AWS_FACTS = HardwareFacts(aws_interconnect, aws_fabric)
GCP_FACTS = HardwareFacts(gcp_interconnect, gcp_fabric)
LOCAL_FACTS = HardwareFacts(pcie_interconnect, either_fabric)
# The built-in clouds' facts, for the readers of the bundled tables (the catalog and the price
# history files hold rows of these providers only); a provider's registry entry is the way in
# from anywhere else.
BUILT_IN_FACTS: dict[str, HardwareFacts] = {
    "aws": AWS_FACTS,
    "gcp": GCP_FACTS,
    "local": LOCAL_FACTS,
}


def _facts(provider: str) -> HardwareFacts:
    cloud = provider.strip().lower()
    found = BUILT_IN_FACTS.get(cloud)
    if found is None:
        known = ", ".join(BUILT_IN_FACTS)
        raise UnknownCloudError(f"no hardware facts for provider {provider!r}; known: {known}")
    return found


def instance_interconnect(provider: str, instance_type: str, gpu_count: int) -> Interconnect:
    """The GPU-to-GPU link inside one instance of a built-in cloud; UnknownCloudError for
    another provider."""
    return _facts(provider).interconnect(instance_type, gpu_count)


def instance_fabric(provider: str, instance_type: str) -> FabricSpec:
    """The inter-node fabric of a built-in cloud's type (NO_FABRIC wherever none is
    documented); UnknownCloudError for another provider."""
    return _facts(provider).fabric(instance_type)
