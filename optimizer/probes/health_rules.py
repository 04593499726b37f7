"""Passive health rules: one NVML readout (plus what was sampled under load) to checks.

Pure functions. Thresholds follow REFERENCE 5.5/5.6 (DCGM health watches and diag, NVIDIA's
k8s device plugin, AWS EKS agent, AzNHC) and are named here with their source.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from optimizer.hardware import GpuSpec
from optimizer.probes.readings import (
    HW_POWER_BRAKE,
    HW_SLOWDOWN,
    HW_THERMAL,
    SW_POWER_CAP,
    SW_THERMAL,
    GpuHealth,
    LoadSummary,
    XidEvent,
    clock_event_names,
)
from optimizer.probes.schema import Check, Status

# XIDs that mean the GPU must not take work: DCGM's always-fatal list (48 DBE, 74 NVLink,
# 79 fallen off the bus, 95 uncontained ECC, 119/120 GSP, 140 unrecovered ECC) plus 64 (row
# remap failure), which DCGM and the AWS EKS agent both treat as fatal (REFERENCE 5.6).
FATAL_XIDS = frozenset({48, 64, 74, 79, 95, 119, 120, 140})
# Application-level XIDs (a program's fault, not the GPU's): NVIDIA's k8s device plugin
# ignores them. Repeated, they still deserve a look.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68})
APPLICATION_XID_REPEATS = 3
# Row remapping: uncorrectable remaps from this count up warn (DCGM; REFERENCE 5.5).
REMAP_UNCORRECTED_WARN = 512
# Page retirement (pre-Ampere): 64 pages is the per-GPU limit; at 63 the GPU is due for RMA.
RETIRED_PAGES_FAIL = 63
# Links NVML should report active on a multi-GPU HGX board (REFERENCE 5.5).
EXPECTED_NVLINKS = {"H100-80GB": 18, "H200-141GB": 18, "A100-40GB": 12, "A100-80GB": 12}
# NVLink CRC errors per second that DCGM's health watch warns at (REFERENCE 5.6).
NVLINK_CRC_WARN_PER_S = 100
# DCGM PCIe replay budget per minute per lane, Gen1..Gen6 (DcgmHealthWatch.cpp, REFERENCE 5.6).
PCIE_REPLAYS_PER_LANE_MIN = (0.15, 0.3, 0.48, 0.96, 1.92, 3.84)
TEMPERATURE_MARGIN_C = 5  # warn this close to the slowdown threshold
TEMPERATURE_WARN_C = 85  # where NVML states no slowdown threshold
POWER_CAP_TOLERANCE = 0.95  # an enforced limit under 95% of the default is a provider cap
HW_CLOCK_EVENTS = HW_SLOWDOWN | HW_THERMAL | HW_POWER_BRAKE


def _c(name: str, status: Status, reason: str, gpu: int | None, **kw: object) -> Check:
    return Check(name, status, reason, gpu, **kw)  # type: ignore[arg-type]


def lost_and_errors(g: GpuHealth) -> list[Check]:
    if g.lost:
        return [_c("gpu.reachable", Status.FAIL, "NVML answered GpuIsLost/Unknown", g.index)]
    out = [_c("gpu.reachable", Status.PASS, "NVML answers", g.index)]
    if g.errors:
        calls = ", ".join(f"{call}: {err}" for call, err in g.errors)
        out.append(_c("nvml.errors", Status.SKIP, f"unreadable, not judged: {calls}", g.index))
    return out


def ecc(g: GpuHealth, after: GpuHealth | None) -> Check:
    count = (after or g).ecc_volatile_uncorrected
    if g.ecc_enabled is False:
        return _c("ecc.volatile_uncorrected", Status.WARN, "ECC is disabled", g.index)
    if count is None:
        return _c("ecc.volatile_uncorrected", Status.SKIP, "n/a (NotSupported)", g.index)
    if count > 0:
        reason = f"{count} uncorrected (double-bit) ECC error(s) since the driver loaded"
        return _c("ecc.volatile_uncorrected", Status.FAIL, reason, g.index, value=count)
    return _c("ecc.volatile_uncorrected", Status.PASS, "no uncorrected errors", g.index, value=0)


def remapped_rows(g: GpuHealth, after: GpuHealth | None) -> Check:
    rows = (after or g).remapped_rows
    name = "memory.remapped_rows"
    if rows is None:
        return _c(name, Status.SKIP, "n/a (no row remapping before Ampere)", g.index)
    if rows.failure:
        return _c(name, Status.FAIL, "row remapping failed: the GPU needs RMA", g.index)
    if rows.pending:
        return _c(name, Status.FAIL, "row remap pending: reject until the GPU is reset", g.index)
    if rows.uncorrected >= REMAP_UNCORRECTED_WARN:
        reason = f"{rows.uncorrected} rows remapped for uncorrectable errors (>= 512)"
        return _c(name, Status.WARN, reason, g.index, value=rows.uncorrected)
    reason = f"{rows.corrected} correctable / {rows.uncorrected} uncorrectable remaps"
    return _c(name, Status.PASS, reason, g.index, value=rows.uncorrected)


def retired_pages(g: GpuHealth, after: GpuHealth | None) -> Check:
    now = after or g
    name = "memory.retired_pages"
    if now.retired_pages is None and now.retired_pages_pending is None:
        return _c(name, Status.SKIP, "n/a (NotSupported; Ampere and later remap rows)", g.index)
    if now.retired_pages_pending:
        return _c(name, Status.FAIL, "page retirement pending: needs a reboot", g.index)
    pages = now.retired_pages or 0
    if pages >= RETIRED_PAGES_FAIL:
        reason = f"{pages} retired pages (>= {RETIRED_PAGES_FAIL})"
        return _c(name, Status.FAIL, reason, g.index, value=pages)
    return _c(name, Status.PASS, f"{pages} retired pages", g.index, value=pages)


def recovery_action(g: GpuHealth, after: GpuHealth | None) -> Check:
    action = (after or g).recovery_action
    if action is None:
        return _c("gpu.recovery_action", Status.SKIP, "n/a (NotSupported)", g.index)
    if action != 0:
        reason = f"the driver asks for recovery action {action} (reset, reboot or drain)"
        return _c("gpu.recovery_action", Status.FAIL, reason, g.index, value=action)
    return _c("gpu.recovery_action", Status.PASS, "none requested", g.index, value=0)


def xids(events: Sequence[XidEvent], gpu: int | None) -> Check:
    """Fatal XIDs fail; application XIDs pass unless repeated; any other XID warns."""
    mine = [e.xid for e in events if e.gpu == gpu]
    name = "xid"
    if not mine:
        return _c(name, Status.PASS, "no XID events", gpu)
    fatal = sorted({x for x in mine if x in FATAL_XIDS})
    if fatal:
        return _c(name, Status.FAIL, f"fatal XID {', '.join(map(str, fatal))}", gpu, value=fatal[0])
    other = sorted({x for x in mine if x not in APPLICATION_XIDS})
    if other:
        return _c(name, Status.WARN, f"XID {', '.join(map(str, other))}", gpu, value=other[0])
    # Counted per source: the kernel log and the NVML event set may both report one event.
    per_source = Counter((e.source, e.xid) for e in events if e.gpu == gpu)
    repeated = sorted({x for (_, x), n in per_source.items() if n >= APPLICATION_XID_REPEATS})
    if repeated:
        reason = f"application XID {', '.join(map(str, repeated))} repeated"
        return _c(name, Status.WARN, reason, gpu, value=repeated[0])
    return _c(name, Status.PASS, f"application-level XID(s) {sorted(set(mine))} only", gpu)


def nvlink(
    g: GpuHealth, after: GpuHealth | None, spec: GpuSpec, gpus: int, window_s: float | None
) -> list[Check]:
    name = "nvlink.links"
    kind = spec.gpu_link.kind if spec.gpu_link else ""
    if not kind.startswith("nvlink"):
        return [_c(name, Status.SKIP, "n/a (the model has no NVLink)", g.index)]
    if gpus < 2:
        return [_c(name, Status.SKIP, "n/a (one GPU: no peer to link to)", g.index)]
    links = g.nvlink_active
    if links is None:
        return [_c(name, Status.SKIP, "n/a (NotSupported: a PCIe SKU or VM)", g.index)]
    active = sum(links)
    down = [str(i) for i, up in enumerate(links) if not up]
    want = EXPECTED_NVLINKS.get(spec.name, len(links))
    out = []
    if down or active < want:
        where = f": link {', '.join(down)} down" if down else ""
        reason = f"{active} of {want} NVLink links active{where}"
        out.append(_c(name, Status.FAIL, reason, g.index, value=active))
    else:
        out.append(_c(name, Status.PASS, f"{active} of {want} links active", g.index, value=active))
    if after is not None:
        out.append(_nvlink_errors(g, after, window_s))
    return out


def _delta(before: int | None, after: int | None) -> int | None:
    return None if before is None or after is None else max(0, after - before)


def _nvlink_errors(g: GpuHealth, after: GpuHealth, window_s: float | None) -> Check:
    name = "nvlink.errors"
    replays = _delta(g.nvlink_replays, after.nvlink_replays)
    recoveries = _delta(g.nvlink_recoveries, after.nvlink_recoveries)
    crc = _delta(g.nvlink_crc_errors, after.nvlink_crc_errors)
    if replays is None and recoveries is None and crc is None:
        return _c(name, Status.SKIP, "n/a (counters NotSupported)", g.index)
    if replays or recoveries:
        reason = f"{replays or 0} replay(s), {recoveries or 0} recovery(ies) during the probe"
        return _c(name, Status.WARN, reason, g.index)
    if crc and window_s and crc / window_s >= NVLINK_CRC_WARN_PER_S:
        reason = f"{crc / window_s:.0f} CRC errors/s (>= {NVLINK_CRC_WARN_PER_S})"
        return _c(name, Status.WARN, reason, g.index)
    return _c(name, Status.PASS, "no replays or recoveries during the probe", g.index)


def pcie(
    g: GpuHealth, after: GpuHealth | None, load: LoadSummary | None, window_s: float | None
) -> list[Check]:
    """Judged under load only: idle links drop to Gen1 to save power (REFERENCE 5.1)."""
    name = "pcie.link"
    out = []
    if g.pcie_max_gen is None or g.pcie_max_width is None:
        out.append(_c(name, Status.SKIP, "n/a (NotSupported)", g.index))
    elif load is None or not load.busy_samples or load.pcie_width_max is None:
        out.append(_c(name, Status.SKIP, "not judged at idle (links downshift)", g.index))
    else:
        gen, width = load.pcie_gen_max or 0, load.pcie_width_max
        seen = f"Gen{gen} x{width} under load, Gen{g.pcie_max_gen} x{g.pcie_max_width} possible"
        if width < g.pcie_max_width:
            out.append(_c(name, Status.FAIL, seen, g.index, value=width))
        elif gen < g.pcie_max_gen:
            out.append(_c(name, Status.WARN, seen, g.index, value=gen))
        else:
            out.append(_c(name, Status.PASS, seen, g.index, value=width))
    replays = _delta(g.pcie_replays, after.pcie_replays if after else None)
    if replays is not None and window_s and g.pcie_max_gen and g.pcie_max_width:
        per_lane = PCIE_REPLAYS_PER_LANE_MIN[min(g.pcie_max_gen, 6) - 1]
        budget = math.ceil(per_lane * g.pcie_max_width)
        rate = replays / (window_s / 60)
        status = Status.WARN if rate > budget else Status.PASS
        reason = f"{replays} replay(s) in {window_s:.0f} s ({rate:.1f}/min, budget {budget}/min)"
        out.append(_c("pcie.replays", status, reason, g.index, value=replays))
    return out


def clock_events(g: GpuHealth, load: LoadSummary | None) -> Check:
    """Hardware slowdown, thermal or power brake fail; software thermal warns; a software
    power cap under heavy load is how a healthy GPU runs (REFERENCE 5.2)."""
    name = "clocks.events"
    mask = (g.clock_event_reasons or 0) | (load.clock_events_all if load else 0)
    if g.clock_event_reasons is None and load is None:
        return _c(name, Status.SKIP, "n/a (NotSupported)", g.index)
    names = ", ".join(clock_event_names(mask)) or "none"
    if mask & HW_CLOCK_EVENTS:
        hw = ", ".join(clock_event_names(mask & HW_CLOCK_EVENTS))
        return _c(name, Status.FAIL, f"hardware clock slowdown: {hw}", g.index, value=mask)
    if mask & SW_THERMAL:
        return _c(name, Status.WARN, "software thermal slowdown", g.index, value=mask)
    if mask & SW_POWER_CAP and load is not None and load.busy_samples:
        reason = f"{names} (a power cap under heavy load is normal)"
        return _c(name, Status.PASS, reason, g.index, value=mask)
    return _c(name, Status.PASS, names, g.index, value=mask)


def temperature(g: GpuHealth, load: LoadSummary | None) -> Check:
    name = "temperature"
    seen = [t for t in (g.temperature_c, load.temperature_max_c if load else None) if t is not None]
    if not seen:
        return _c(name, Status.SKIP, "n/a (NotSupported)", g.index)
    hottest = max(seen)
    limit = g.slowdown_temp_c
    if limit is not None and hottest >= limit:
        reason = f"{hottest:.0f} °C reached the slowdown threshold {limit:.0f} °C"
        return _c(name, Status.FAIL, reason, g.index, value=hottest, unit="C")
    warn_at = limit - TEMPERATURE_MARGIN_C if limit is not None else TEMPERATURE_WARN_C
    where = f"slowdown at {limit:.0f} °C" if limit is not None else "no stated slowdown threshold"
    status = Status.WARN if hottest >= warn_at else Status.PASS
    return _c(name, status, f"max {hottest:.0f} °C ({where})", g.index, value=hottest, unit="C")


def power_limit(g: GpuHealth, spec: GpuSpec) -> Check:
    name = "power.limit"
    default = g.default_power_limit_w or spec.tdp_w
    if g.power_limit_w is None:
        return _c(name, Status.SKIP, "n/a (NotSupported)", g.index)
    if default and g.power_limit_w < POWER_CAP_TOLERANCE * default:
        reason = (
            f"enforced {g.power_limit_w:.0f} W of {default:.0f} W default: a provider cap "
            "(count it in $/TFLOP)"
        )
        return _c(name, Status.WARN, reason, g.index, value=g.power_limit_w, unit="W")
    return _c(
        name,
        Status.PASS,
        f"enforced {g.power_limit_w:.0f} W",
        g.index,
        value=g.power_limit_w,
        unit="W",
    )


def sharing(g: GpuHealth) -> list[Check]:
    out = []
    if g.compute_processes:
        reason = f"{g.compute_processes} other compute process(es): figures are not the GPU's own"
        out.append(_c("gpu.processes", Status.WARN, reason, g.index, value=g.compute_processes))
    if g.mig_enabled:
        out.append(
            _c("gpu.mig", Status.WARN, "MIG enabled: whole-GPU figures do not apply", g.index)
        )
    return out


def gpu_checks(
    g: GpuHealth,
    after: GpuHealth | None,
    spec: GpuSpec,
    *,
    gpus: int,
    load: LoadSummary | None,
    events: Sequence[XidEvent],
    window_s: float | None,
) -> list[Check]:
    """Every passive rule for one GPU."""
    out = lost_and_errors(g)
    if g.lost:
        return out
    out += [
        ecc(g, after),
        remapped_rows(g, after),
        retired_pages(g, after),
        recovery_action(g, after),
        xids(events, g.index),
    ]
    out += nvlink(g, after, spec, gpus, window_s)
    out += pcie(g, after, load, window_s)
    out += [clock_events(g, load), temperature(g, load), power_limit(g, spec)]
    out += sharing(g)
    return out
