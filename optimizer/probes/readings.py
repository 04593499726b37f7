"""What the probes observe, as plain frozen values: NVML health readings and load samples.

These types carry no behaviour beyond summarising; `nvml.py` fills them from the driver and
tests build them by hand, so the verdict never needs a GPU to be judged.
A field that is `None` was not applicable: NVML answered `NotSupported` (REFERENCE 5.5: on VMs,
MIG, older GPUs, and H200 page retirement), which is never a sign of sickness.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

# nvmlClocksEventReasons bits (nvml.h; REFERENCE 5.5). The older ClocksThrottleReasons names
# carry the same values but are deprecated and go away with CUDA 14.
GPU_IDLE = 0x1
APPLICATIONS_CLOCKS = 0x2
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SYNC_BOOST = 0x10
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80
DISPLAY_CLOCK = 0x100
CLOCK_EVENT_NAMES: Mapping[int, str] = {
    GPU_IDLE: "GpuIdle",
    APPLICATIONS_CLOCKS: "ApplicationsClocksSetting",
    SW_POWER_CAP: "SwPowerCap",
    HW_SLOWDOWN: "HwSlowdown",
    SYNC_BOOST: "SyncBoost",
    SW_THERMAL: "SwThermalSlowdown",
    HW_THERMAL: "HwThermalSlowdown",
    HW_POWER_BRAKE: "HwPowerBrakeSlowdown",
    DISPLAY_CLOCK: "DisplayClockSetting",
}

# A sample counts as "under load" from this utilisation up: PCIe links and clocks are only
# judged there, since idle GPUs downshift their links to save power (REFERENCE 5.1).
BUSY_UTILIZATION_PCT = 50


def clock_event_names(mask: int) -> list[str]:
    """The ClocksEventReasons names set in `mask`, lowest bit first (unknown bits as hex)."""
    names = [name for bit, name in CLOCK_EVENT_NAMES.items() if mask & bit]
    rest = mask & ~sum(CLOCK_EVENT_NAMES)
    if rest:
        names.append(hex(rest))
    return names


@dataclass(frozen=True, slots=True)
class RemappedRows:
    """`nvmlDeviceGetRemappedRows` (Ampere and later): counts and the two flags."""

    corrected: int
    uncorrected: int
    pending: bool
    failure: bool


@dataclass(frozen=True, slots=True)
class XidEvent:
    """One XID: from the NVML event set while listening, or from the kernel log."""

    xid: int
    gpu: int | None = None
    source: str = "nvml"


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """One GPU's passive NVML readout. `None` = not applicable (NotSupported)."""

    index: int
    name: str | None = None
    uuid: str | None = None
    serial: str | None = None
    pci_bus_id: str | None = None
    memory_total_bytes: int | None = None
    ecc_enabled: bool | None = None
    ecc_volatile_uncorrected: int | None = None
    ecc_volatile_corrected: int | None = None
    remapped_rows: RemappedRows | None = None
    retired_pages: int | None = None  # pre-Ampere page retirement, both causes together
    retired_pages_pending: bool | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None
    pcie_max_gen: int | None = None  # the slot-limited maximum NVML reports
    pcie_max_width: int | None = None
    pcie_replays: int | None = None
    nvlink_active: tuple[bool, ...] | None = None  # per supported link; None: no NVLink
    nvlink_replays: int | None = None  # summed over links
    nvlink_recoveries: int | None = None
    nvlink_crc_errors: int | None = None
    clock_event_reasons: int | None = None
    temperature_c: float | None = None
    slowdown_temp_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None  # enforced
    default_power_limit_w: float | None = None
    sm_clock_mhz: float | None = None
    max_sm_clock_mhz: float | None = None
    utilization_pct: float | None = None
    recovery_action: int | None = None  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION; 0 = none
    mig_enabled: bool | None = None
    compute_processes: int | None = None
    lost: bool = False  # a call answered GpuIsLost / Unknown: the GPU is gone
    errors: tuple[tuple[str, str], ...] = ()  # (call, error) other than NotSupported

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            name, value = f.name, getattr(self, f.name)
            if isinstance(value, RemappedRows):
                value = {
                    "corrected": value.corrected,
                    "uncorrected": value.uncorrected,
                    "pending": value.pending,
                    "failure": value.failure,
                }
            elif name == "errors":
                value = dict(value)
            elif isinstance(value, tuple):
                value = list(value)
            out[name] = value
        if self.clock_event_reasons is not None:
            out["clock_event_names"] = clock_event_names(self.clock_event_reasons)
        return out


@dataclass(frozen=True, slots=True)
class NodeHealth:
    """The whole node's NVML readout."""

    gpus: tuple[GpuHealth, ...]
    device_count: int  # what NVML counts, before any CUDA_VISIBLE_DEVICES selection
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    nvml_version: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "device_count": self.device_count,
            "driver_version": self.driver_version,
            "cuda_driver_version": self.cuda_driver_version,
            "nvml_version": self.nvml_version,
            "gpus": [g.to_dict() for g in self.gpus],
        }


@dataclass(frozen=True, slots=True)
class LoadSample:
    """A cheap reading taken while the active probes run."""

    gpu: int
    t: float  # seconds since the probe started
    utilization_pct: float | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None
    clock_event_reasons: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    sm_clock_mhz: float | None = None


@dataclass(frozen=True, slots=True)
class LoadSummary:
    """One GPU's samples folded: what was seen while it was busy (utilisation >= 50%)."""

    samples: int = 0
    busy_samples: int = 0
    pcie_gen_max: int | None = None  # highest seen while busy
    pcie_width_max: int | None = None
    clock_events_busy: int = 0  # OR of the reasons seen while busy
    clock_events_all: int = 0  # OR over every sample
    clock_event_counts: Mapping[str, int] = field(default_factory=dict)  # busy samples per bit
    temperature_max_c: float | None = None
    power_max_w: float | None = None
    sm_clock_busy_median_mhz: float | None = None
    sm_clock_busy_min_mhz: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "busy_samples": self.busy_samples,
            "pcie_gen_max": self.pcie_gen_max,
            "pcie_width_max": self.pcie_width_max,
            "clock_events_busy": clock_event_names(self.clock_events_busy),
            "clock_events_all": clock_event_names(self.clock_events_all),
            "clock_event_counts": dict(self.clock_event_counts),
            "temperature_max_c": self.temperature_max_c,
            "power_max_w": self.power_max_w,
            "sm_clock_busy_median_mhz": self.sm_clock_busy_median_mhz,
            "sm_clock_busy_min_mhz": self.sm_clock_busy_min_mhz,
        }


def _max(values: Iterable[float | int | None]) -> Any:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def summarize(samples: Iterable[LoadSample]) -> dict[int, LoadSummary]:
    """Fold load samples per GPU (pure)."""
    by_gpu: dict[int, list[LoadSample]] = {}
    for s in samples:
        by_gpu.setdefault(s.gpu, []).append(s)
    out: dict[int, LoadSummary] = {}
    for gpu, rows in by_gpu.items():
        busy = [s for s in rows if (s.utilization_pct or 0) >= BUSY_UTILIZATION_PCT]
        busy_reasons = 0
        counts: dict[str, int] = {}
        for s in busy:
            mask = s.clock_event_reasons or 0
            busy_reasons |= mask
            for name in clock_event_names(mask):
                counts[name] = counts.get(name, 0) + 1
        all_reasons = 0
        for s in rows:
            all_reasons |= s.clock_event_reasons or 0
        clocks = [s.sm_clock_mhz for s in busy if s.sm_clock_mhz is not None]
        out[gpu] = LoadSummary(
            samples=len(rows),
            busy_samples=len(busy),
            pcie_gen_max=_max(s.pcie_gen for s in busy),
            pcie_width_max=_max(s.pcie_width for s in busy),
            clock_events_busy=busy_reasons,
            clock_events_all=all_reasons,
            clock_event_counts=counts,
            temperature_max_c=_max(s.temperature_c for s in rows),
            power_max_w=_max(s.power_w for s in rows),
            sm_clock_busy_median_mhz=statistics.median(clocks) if clocks else None,
            sm_clock_busy_min_mhz=min(clocks) if clocks else None,
        )
    return out
