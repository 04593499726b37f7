"""Passive health from NVML (nvidia-ml-py's `pynvml`), behind the small `HealthSource` interface.

Tests and the verdict never need this module: they build `readings` values by hand. Every call
is wrapped: `NotSupported` becomes `None` (not applicable, never sick), `GpuIsLost`/`Unknown`
mark the GPU lost, and any other error is kept by name (REFERENCE 5.5).
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from optimizer.probes.readings import GpuHealth, LoadSample, NodeHealth, RemappedRows, XidEvent

T = TypeVar("T")
XID_WAIT_MS = 200  # one nvmlEventSetWait_v2; its Timeout result is the normal "no event"


class NvmlUnavailable(RuntimeError):
    """NVML cannot start here: no driver, no GPU, or nvidia-ml-py not installed."""


class HealthSource(Protocol):
    """Where passive readings come from: NVML on a GPU host, a fake in tests."""

    def snapshot(self) -> NodeHealth: ...
    def sample(self, t: float) -> list[LoadSample]: ...
    def start_xid_watch(self) -> None: ...
    def stop_xid_watch(self) -> list[XidEvent]: ...
    def close(self) -> None: ...


def select_visible(uuids: Sequence[str], visible: str | None) -> list[int]:
    """NVML indices that CUDA_VISIBLE_DEVICES selects (None: all). Integer entries are taken in
    PCI bus order (the probes run with CUDA_DEVICE_ORDER=PCI_BUS_ID); `GPU-…` entries match a
    UUID prefix. As in CUDA, an entry that matches nothing ends the list."""
    if visible is None:
        return list(range(len(uuids)))
    chosen: list[int] = []
    for token in (t.strip() for t in visible.split(",")):
        if not token:
            break
        if token.lstrip("-").isdigit():
            index = int(token)
            if not 0 <= index < len(uuids):
                break
        else:
            found = [i for i, u in enumerate(uuids) if u.startswith(token)]
            if len(found) != 1:
                break
            index = found[0]
        if index not in chosen:
            chosen.append(index)
    return chosen


_KERNEL_XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+)")


def kernel_log_xids(text: str, bus_ids: dict[str, int]) -> list[XidEvent]:
    """XIDs in kernel-log text (`NVRM: Xid (PCI:0000:3b:00): 79, ...`); `bus_ids` maps a
    normalised PCI address (domain:bus:device, lower case) to a GPU index."""
    events = []
    for match in _KERNEL_XID.finditer(text):
        gpu = bus_ids.get(bus_key(match.group(1)))
        events.append(XidEvent(xid=int(match.group(2)), gpu=gpu, source="kernel-log"))
    return events


def bus_key(address: str) -> str:
    """`00000000:3B:00.0` and `0000:3b:00` both to `0000:3b:00`."""
    parts = address.lower().split(":")
    if len(parts) < 3:
        return address.lower()
    return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2].split('.')[0]}"


def read_kernel_log() -> str:
    """The kernel ring buffer, or "" where it cannot be read (no permission, no dmesg)."""
    try:
        done = subprocess.run(
            ["dmesg"], capture_output=True, text=True, timeout=5, check=False, errors="replace"
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout if done.returncode == 0 else ""


class PynvmlSource:
    """The real source. Raises NvmlUnavailable from the constructor when NVML cannot start."""

    def __init__(self, visible: str | None = None) -> None:
        try:
            import pynvml
        except ImportError as exc:
            raise NvmlUnavailable("nvidia-ml-py (pynvml) is not installed") from exc
        self.n: Any = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML cannot start: {exc}") from exc
        count = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        uuids = [_text(self._plain(pynvml.nvmlDeviceGetUUID, h)) or "" for h in handles]
        self.device_count = count
        self.nvml_indices = select_visible(uuids, visible)
        self.handles = [handles[i] for i in self.nvml_indices]
        self.uuids = [uuids[i] for i in self.nvml_indices]
        self._xids: list[XidEvent] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- wrapped calls --

    def _call(
        self, errors: dict[str, str], name: str, fn: Callable[..., T], *args: Any
    ) -> T | None:
        """fn(*args); NotSupported -> None; another NVML error -> None, kept in `errors`."""
        n = self.n
        try:
            return fn(*args)
        except n.NVMLError_NotSupported:
            return None
        except n.NVMLError as exc:
            errors[name] = type(exc).__name__
            return None

    def _plain(self, fn: Callable[..., T], *args: Any) -> T | None:
        return self._call({}, "", fn, *args)

    # -- HealthSource --

    def snapshot(self) -> NodeHealth:
        n = self.n
        gpus = tuple(self._gpu(i, h) for i, h in enumerate(self.handles))
        cuda = self._plain(n.nvmlSystemGetCudaDriverVersion_v2)
        return NodeHealth(
            gpus=gpus,
            device_count=self.device_count,
            driver_version=_text(self._plain(n.nvmlSystemGetDriverVersion)),
            cuda_driver_version=f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None,
            nvml_version=_text(self._plain(n.nvmlSystemGetNVMLVersion)),
        )

    def _gpu(self, index: int, h: Any) -> GpuHealth:
        n = self.n
        errors: dict[str, str] = {}

        def get(name: str, fn: Callable[[], T]) -> T | None:
            return self._call(errors, name, fn)

        mem = get("MemoryInfo", lambda: n.nvmlDeviceGetMemoryInfo(h))
        ecc = get("EccMode", lambda: n.nvmlDeviceGetEccMode(h))
        unc = n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        cor = n.NVML_MEMORY_ERROR_TYPE_CORRECTED
        rows = get("RemappedRows", lambda: n.nvmlDeviceGetRemappedRows(h))
        retired = get("RetiredPages", lambda: self._retired_pages(h))
        pending = get("RetiredPagesPending", lambda: n.nvmlDeviceGetRetiredPagesPendingStatus(h))
        pci = get("PciInfo", lambda: n.nvmlDeviceGetPciInfo(h))
        procs = get("ComputeRunningProcesses", lambda: n.nvmlDeviceGetComputeRunningProcesses(h))
        mig = get("MigMode", lambda: n.nvmlDeviceGetMigMode(h))
        links, replays, recoveries, crc = self._nvlink(h, errors)
        slowdown = n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
        sm = n.NVML_CLOCK_SM
        return GpuHealth(
            index=index,
            name=_text(get("Name", lambda: n.nvmlDeviceGetName(h))),
            uuid=self.uuids[index] or None,
            serial=_text(get("Serial", lambda: n.nvmlDeviceGetSerial(h))),
            pci_bus_id=_text(pci.busId) if pci is not None else None,
            memory_total_bytes=int(mem.total) if mem is not None else None,
            ecc_enabled=bool(ecc[0]) if ecc is not None else None,
            ecc_volatile_uncorrected=get(
                "EccUncorrected", lambda: n.nvmlDeviceGetTotalEccErrors(h, unc, n.NVML_VOLATILE_ECC)
            ),
            ecc_volatile_corrected=get(
                "EccCorrected", lambda: n.nvmlDeviceGetTotalEccErrors(h, cor, n.NVML_VOLATILE_ECC)
            ),
            remapped_rows=RemappedRows(rows[0], rows[1], bool(rows[2]), bool(rows[3]))
            if rows is not None
            else None,
            retired_pages=retired,
            retired_pages_pending=bool(pending) if pending is not None else None,
            pcie_gen=get(
                "CurrPcieLinkGeneration", lambda: n.nvmlDeviceGetCurrPcieLinkGeneration(h)
            ),
            pcie_width=get("CurrPcieLinkWidth", lambda: n.nvmlDeviceGetCurrPcieLinkWidth(h)),
            pcie_max_gen=get(
                "MaxPcieLinkGeneration", lambda: n.nvmlDeviceGetMaxPcieLinkGeneration(h)
            ),
            pcie_max_width=get("MaxPcieLinkWidth", lambda: n.nvmlDeviceGetMaxPcieLinkWidth(h)),
            pcie_replays=get("PcieReplayCounter", lambda: n.nvmlDeviceGetPcieReplayCounter(h)),
            nvlink_active=links,
            nvlink_replays=replays,
            nvlink_recoveries=recoveries,
            nvlink_crc_errors=crc,
            clock_event_reasons=get(
                "CurrentClocksEventReasons", lambda: n.nvmlDeviceGetCurrentClocksEventReasons(h)
            ),
            temperature_c=get("Temperature", lambda: self._temperature(h)),
            slowdown_temp_c=get(
                "TemperatureThreshold", lambda: n.nvmlDeviceGetTemperatureThreshold(h, slowdown)
            ),
            power_w=_watts(get("PowerUsage", lambda: n.nvmlDeviceGetPowerUsage(h))),
            power_limit_w=_watts(
                get("EnforcedPowerLimit", lambda: n.nvmlDeviceGetEnforcedPowerLimit(h))
            ),
            default_power_limit_w=_watts(
                get("DefaultLimit", lambda: n.nvmlDeviceGetPowerManagementDefaultLimit(h))
            ),
            sm_clock_mhz=get("ClockInfo", lambda: n.nvmlDeviceGetClockInfo(h, sm)),
            max_sm_clock_mhz=get("MaxClockInfo", lambda: n.nvmlDeviceGetMaxClockInfo(h, sm)),
            utilization_pct=_util(
                get("UtilizationRates", lambda: n.nvmlDeviceGetUtilizationRates(h))
            ),
            recovery_action=get("RecoveryAction", lambda: self._recovery_action(h)),
            mig_enabled=bool(mig[0]) if mig is not None else None,
            compute_processes=len(procs) if procs is not None else None,
            lost=any(e in ("NVMLError_GpuIsLost", "NVMLError_Unknown") for e in errors.values()),
            errors=tuple(sorted(errors.items())),
        )

    def _temperature(self, h: Any) -> int:
        """GetTemperatureV where the driver has it; GetTemperature (deprecated) before that."""
        n = self.n
        try:
            return int(n.nvmlDeviceGetTemperatureV(h, n.NVML_TEMPERATURE_GPU))
        except n.NVMLError_FunctionNotFound:
            return int(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU))

    def _retired_pages(self, h: Any) -> int:
        n = self.n
        causes = (
            n.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
            n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
        )
        return sum(len(n.nvmlDeviceGetRetiredPages(h, cause)) for cause in causes)

    def _recovery_action(self, h: Any) -> int | None:
        n = self.n
        value = n.nvmlDeviceGetFieldValues(h, [n.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])[0]
        if value.nvmlReturn == n.NVML_ERROR_NOT_SUPPORTED:
            return None
        if value.nvmlReturn != n.NVML_SUCCESS:
            raise n.NVMLError(value.nvmlReturn)
        return int(value.value.uiVal)

    def _nvlink(
        self, h: Any, errors: dict[str, str]
    ) -> tuple[tuple[bool, ...] | None, int | None, int | None, int | None]:
        """Per-link active flags over the links NVML supports, and summed error counters."""
        n = self.n
        states: list[bool] = []
        totals: list[int | None] = [None, None, None]
        kinds = (
            (n.NVML_NVLINK_ERROR_DL_REPLAY,),
            (n.NVML_NVLINK_ERROR_DL_RECOVERY,),
            (n.NVML_NVLINK_ERROR_DL_CRC_FLIT, n.NVML_NVLINK_ERROR_DL_CRC_DATA),
        )
        for link in range(n.NVML_NVLINK_MAX_LINKS):
            try:
                states.append(bool(n.nvmlDeviceGetNvLinkState(h, link)))
            except n.NVMLError_NotSupported:
                continue
            except (n.NVMLError_InvalidArgument, n.NVMLError):
                break  # past the last link this GPU has
            for slot, counters in enumerate(kinds):
                for counter in counters:
                    value = self._call(
                        errors,
                        "NvLinkErrorCounter",
                        n.nvmlDeviceGetNvLinkErrorCounter,
                        h,
                        link,
                        counter,
                    )
                    if value is not None:
                        totals[slot] = (totals[slot] or 0) + int(value)
        errors.pop("NvLinkErrorCounter", None)  # counters deprecated on newer GPUs: not sick
        return (tuple(states) if states else None, totals[0], totals[1], totals[2])

    def sample(self, t: float) -> list[LoadSample]:
        n, ask = self.n, self._plain
        out = []
        for i, h in enumerate(self.handles):
            out.append(
                LoadSample(
                    gpu=i,
                    t=t,
                    utilization_pct=_util(ask(n.nvmlDeviceGetUtilizationRates, h)),
                    pcie_gen=ask(n.nvmlDeviceGetCurrPcieLinkGeneration, h),
                    pcie_width=ask(n.nvmlDeviceGetCurrPcieLinkWidth, h),
                    clock_event_reasons=ask(n.nvmlDeviceGetCurrentClocksEventReasons, h),
                    temperature_c=ask(self._temperature, h),
                    power_w=_watts(ask(n.nvmlDeviceGetPowerUsage, h)),
                    sm_clock_mhz=ask(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM),
                )
            )
        return out

    def start_xid_watch(self) -> None:
        """Listen for XID / double-bit ECC events; they are delivered only while listening."""
        n = self.n
        try:
            events = n.nvmlEventSetCreate()
        except n.NVMLError:
            return
        mask = n.nvmlEventTypeXidCriticalError | n.nvmlEventTypeDoubleBitEccError
        registered: dict[int, int] = {}
        for i, h in enumerate(self.handles):
            try:
                n.nvmlDeviceRegisterEvents(h, mask, events)
            except n.NVMLError:
                continue
            registered[_address(h)] = i
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._listen, args=(events, registered), name="xid-watch", daemon=True
        )
        self._thread.start()

    def _listen(self, events: Any, registered: dict[int, int]) -> None:
        n = self.n
        try:
            while True:
                stopping = self._stop.is_set()  # once asked to stop, drain what is queued
                try:
                    data = n.nvmlEventSetWait_v2(events, 0 if stopping else XID_WAIT_MS)
                except n.NVMLError_Timeout:
                    if stopping:
                        break
                    continue
                except n.NVMLError:
                    break
                gpu = registered.get(_address(data.device))
                if data.eventType & n.nvmlEventTypeDoubleBitEccError:
                    self._xids.append(XidEvent(xid=48, gpu=gpu))  # XID 48 is the DBE XID
                else:
                    self._xids.append(XidEvent(xid=int(data.eventData), gpu=gpu))
        finally:
            with contextlib.suppress(n.NVMLError):
                n.nvmlEventSetFree(events)

    def stop_xid_watch(self) -> list[XidEvent]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * XID_WAIT_MS / 1000 + 1)
            self._thread = None
        return list(self._xids)

    def close(self) -> None:
        self.stop_xid_watch()
        with contextlib.suppress(self.n.NVMLError):
            self.n.nvmlShutdown()


def _address(handle: Any) -> int:
    """A device handle's pointer value: handles from events compare equal to ours by it."""
    import ctypes

    return ctypes.cast(handle, ctypes.c_void_p).value or 0


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _watts(milliwatts: Any) -> float | None:
    return None if milliwatts is None else milliwatts / 1000.0


def _util(rates: Any) -> float | None:
    return None if rates is None else float(rates.gpu)
