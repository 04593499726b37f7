"""GPU telemetry on the instance: NVML read every few seconds, folded into one aggregate per
minute across the GPUs, handed to the reporter as `gpu_telemetry` events
(docs/agent-protocol.md).

Three parts, so each can be tested alone:
- `GpuReading` / `ReadingSource`: one reading of each GPU now. `NvmlSource` reads NVML;
  `SimulatedSource` gives the readings the local cloud injects for drills (labelled simulated);
  `LocalSource`, a local-cloud instance's: the injection while there is one, else the host's
  GPUs through NVML (labelled host), else nothing;
- `MinuteAggregator` (pure): readings in, finished minutes out;
- `TelemetrySampler`: a daemon thread that reads, aggregates and emits. A reading that fails is
  skipped and logged once; nothing it does can block, fail or end the job.

A minute's figures, across the GPUs (the wire form, `GpuMinute` in the store):
`util_mean` the mean over the minute's readings of the GPUs' mean utilization (0..1);
`util_max` the highest one GPU read; `memory_used_gib_max` the highest sum over the GPUs of
memory used; `memory_total_gib` their summed memory; `power_w_mean` the mean summed power;
`temperature_c_max` the hottest GPU; `sm_clock_mhz_mean` the mean SM clock; `throttle_reasons`
NVML's clock-event bits ORed; `xids` the XIDs seen; `source` where the readings came from:
`measured` (this instance's GPUs), `host` (the GPUs of the host a local-cloud instance runs on)
or `simulated` (injected by the local cloud), with `simulated` true only for the last.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from optimizer.clock import machine_now, utc_text

log = logging.getLogger(__name__)

GIB = float(1 << 30)
SAMPLE_INTERVAL_S = 10.0
EVENT_KIND = "gpu_telemetry"
MEASURED, HOST, SIMULATED = "measured", "host", "simulated"  # a minute's `source`


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU now; None where the GPU cannot say."""

    gpu: int
    util: float | None = None  # fraction 0..1
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    sm_clock_mhz: float | None = None
    throttle_reasons: int | None = None


class ReadingSource(Protocol):
    """Where readings come from. `simulated`: the last `read` gave injected readings;
    `source` (optional, read after each `read`): measured | host | simulated."""

    @property
    def simulated(self) -> bool: ...

    def read(self) -> list[GpuReading]: ...
    def xids(self) -> list[int]: ...  # XIDs seen since the last call
    def close(self) -> None: ...


@dataclass
class _Minute:
    start: datetime
    samples: int = 0
    gpus: int = 0
    util: list[float] = field(default_factory=list)
    util_max: float | None = None
    mem_used_max: float | None = None
    mem_total: float | None = None
    power: list[float] = field(default_factory=list)
    temp_max: float | None = None
    clocks: list[float] = field(default_factory=list)
    throttle: int = 0
    xids: set[int] = field(default_factory=set)
    sources: set[str] = field(default_factory=set)


def _max(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else max(a, b)


def _floor_minute(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(second=0, microsecond=0)


class MinuteAggregator:
    """Readings in (`add`), finished minutes out (`finished`), as wire dicts."""

    def __init__(self, *, simulated: bool = False, source: str | None = None) -> None:
        self.simulated = simulated
        self.source = source or (SIMULATED if simulated else MEASURED)
        self._open: dict[datetime, _Minute] = {}

    def add(
        self,
        at: datetime,
        readings: Sequence[GpuReading],
        xids: Sequence[int] = (),
        *,
        source: str | None = None,
    ) -> None:
        """One reading of every GPU taken at `at` (aware); `source` labels it (default: the
        aggregator's own)."""
        if not readings and not xids:
            return
        start = _floor_minute(at)
        m = self._open.setdefault(start, _Minute(start))
        m.xids.update(int(x) for x in xids)
        if not readings:
            return
        m.sources.add(source or self.source)
        m.samples += 1
        m.gpus = max(m.gpus, len(readings))
        utils = [r.util for r in readings if r.util is not None]
        if utils:
            m.util.append(sum(utils) / len(utils))
            m.util_max = _max(m.util_max, max(utils))
        used = [r.memory_used_bytes for r in readings if r.memory_used_bytes is not None]
        if used:
            m.mem_used_max = _max(m.mem_used_max, sum(used) / GIB)
        total = [r.memory_total_bytes for r in readings if r.memory_total_bytes is not None]
        if total:
            m.mem_total = _max(m.mem_total, sum(total) / GIB)
        power = [r.power_w for r in readings if r.power_w is not None]
        if power:
            m.power.append(sum(power))
        temps = [r.temperature_c for r in readings if r.temperature_c is not None]
        if temps:
            m.temp_max = _max(m.temp_max, max(temps))
        m.clocks.extend(r.sm_clock_mhz for r in readings if r.sm_clock_mhz is not None)
        for r in readings:
            m.throttle |= int(r.throttle_reasons or 0)

    def finished(self, now: datetime, *, all_open: bool = False) -> list[dict[str, Any]]:
        """The minutes that ended by `now` (with `all_open`, the current one too), oldest
        first, as wire dicts; a minute with no reading at all is dropped."""
        cutoff = _floor_minute(now)
        done = sorted(s for s in self._open if all_open or s < cutoff)
        out = []
        for start in done:
            m = self._open.pop(start)
            if m.samples:
                out.append(self._wire(m))
        return out

    def current(self, now: datetime) -> list[dict[str, Any]]:
        """The minute holding `now` so far (kept open), as a wire dict; [] if it has no reading
        yet. The store keeps, of one minute, the report with the most samples."""
        m = self._open.get(_floor_minute(now))
        return [self._wire(m)] if m is not None and m.samples else []

    def _wire(self, m: _Minute) -> dict[str, Any]:
        def mean(values: list[float]) -> float | None:
            return round(sum(values) / len(values), 4) if values else None

        def r(value: float | None, digits: int = 3) -> float | None:
            return None if value is None else round(value, digits)

        return {
            "start": utc_text(m.start),
            "span_s": 60,
            "samples": m.samples,
            "gpus": m.gpus,
            "util_mean": mean(m.util),
            "util_max": r(m.util_max, 4),
            "memory_used_gib_max": r(m.mem_used_max),
            "memory_total_gib": r(m.mem_total),
            "power_w_mean": mean(m.power),
            "temperature_c_max": m.temp_max,
            "sm_clock_mhz_mean": mean(m.clocks),
            "throttle_reasons": m.throttle,
            "xids": sorted(m.xids),
            # A minute with any injected reading is simulated; else the host's or measured.
            "simulated": SIMULATED in m.sources,
            "source": next((k for k in (SIMULATED, HOST) if k in m.sources), MEASURED),
        }


class NvmlSource:
    """Readings from NVML (nvidia-ml-py), of the GPUs CUDA_VISIBLE_DEVICES selects. Raises
    `optimizer.probes.nvml.NvmlUnavailable` from the constructor where NVML cannot start."""

    simulated = False
    source = MEASURED

    def __init__(self, visible: str | None = None) -> None:
        from optimizer.probes.nvml import PynvmlSource

        self._src = PynvmlSource(visible)
        self._n: Any = self._src.n
        self._seen = 0
        with contextlib.suppress(Exception):
            self._src.start_xid_watch()

    @property
    def gpu_count(self) -> int:
        return len(self._src.handles)

    def read(self) -> list[GpuReading]:
        n, ask = self._n, self._src._plain
        out = []
        for i, h in enumerate(self._src.handles):
            rates = ask(n.nvmlDeviceGetUtilizationRates, h)
            mem = ask(n.nvmlDeviceGetMemoryInfo, h)
            power = ask(n.nvmlDeviceGetPowerUsage, h)
            out.append(
                GpuReading(
                    gpu=i,
                    util=None if rates is None else float(rates.gpu) / 100.0,
                    memory_used_bytes=None if mem is None else int(mem.used),
                    memory_total_bytes=None if mem is None else int(mem.total),
                    power_w=None if power is None else power / 1000.0,
                    temperature_c=ask(self._src._temperature, h),
                    sm_clock_mhz=ask(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM),
                    throttle_reasons=ask(n.nvmlDeviceGetCurrentClocksEventReasons, h),
                )
            )
        return out

    def xids(self) -> list[int]:
        seen = list(self._src._xids)  # appended by the watch thread; read past what we took
        new = seen[self._seen :]
        self._seen = len(seen)
        return [e.xid for e in new]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._src.close()


@dataclass(frozen=True, slots=True)
class SimulatedReading:
    """What the local cloud injects for one instance: utilization and memory used as fractions,
    of `gpus` GPUs of `memory_gib` each, read every `interval_s`."""

    util: float
    memory: float
    gpus: int = 1
    memory_gib: float = 80.0
    interval_s: float = SAMPLE_INTERVAL_S

    @classmethod
    def parse(cls, raw: Any) -> SimulatedReading:
        if not isinstance(raw, dict):
            raise ValueError("the injected telemetry is not a JSON object")
        return cls(
            util=float(raw["util"]),
            memory=float(raw["memory"]),
            gpus=int(raw.get("gpus") or 1),
            memory_gib=float(raw.get("memory_gib") or 80.0),
            interval_s=float(raw.get("interval_s") or SAMPLE_INTERVAL_S),
        )


LOCAL_TELEMETRY_PATH = "gpuopt/v1/telemetry"  # below the local cloud's per-instance metadata URL
IDLE_POLL_S = 1.0  # how often a simulated source looks for an injection while there is none


def local_injection(
    metadata_url: str, timeout_s: float = 2.0
) -> Callable[[], SimulatedReading | None]:
    """A `SimulatedSource` fetch for the local cloud: GET <metadata_url>/gpuopt/v1/telemetry
    (404: nothing injected)."""
    import httpx

    url = f"{metadata_url.rstrip('/')}/{LOCAL_TELEMETRY_PATH}"

    def fetch() -> SimulatedReading | None:
        response = httpx.get(url, timeout=timeout_s)
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return SimulatedReading.parse(response.json())

    return fetch


class SimulatedSource:
    """Readings the local cloud injects (`gpuopt local telemetry`); `fetch` returns the current
    injection, or None while there is none (then nothing is read). Its readings are taken at
    the injection's interval, and the minute in progress is reported at every reading (live),
    so drills with windows of seconds see them at once."""

    simulated = True
    source = SIMULATED
    live = True

    def __init__(self, fetch: Callable[[], SimulatedReading | None]) -> None:
        self._fetch = fetch
        self.interval_s: float | None = None

    def read(self) -> list[GpuReading]:
        sim = self._fetch()
        self.interval_s = None if sim is None else sim.interval_s
        if sim is None:
            return []
        total = int(sim.memory_gib * GIB)
        return [
            GpuReading(
                gpu=i,
                util=sim.util,
                memory_used_bytes=int(total * sim.memory),
                memory_total_bytes=total,
            )
            for i in range(sim.gpus)
        ]

    def xids(self) -> list[int]:
        return []

    def close(self) -> None:
        pass


class LocalSource:
    """A local-cloud instance's readings: the local cloud's injection while there is one
    (simulated, live, at the injection's interval, as `SimulatedSource`); else, on a host
    with a GPU, that GPU through NVML, labelled `host` (the instance shares the host's GPUs;
    read every `IDLE_POLL_S` so an injection is seen at once, reported per finished minute);
    else nothing, as `SimulatedSource` with no injection."""

    def __init__(
        self, fetch: Callable[[], SimulatedReading | None], nvml: ReadingSource | None
    ) -> None:
        self._injected = SimulatedSource(fetch)
        self._nvml = nvml
        self._simulated = nvml is None  # until the first read: as the source it will use

    @property
    def simulated(self) -> bool:
        return self._simulated

    @property
    def source(self) -> str:
        return SIMULATED if self._simulated else HOST

    @property
    def live(self) -> bool:
        return self._simulated

    @property
    def interval_s(self) -> float | None:
        if self._simulated:
            return self._injected.interval_s
        return IDLE_POLL_S

    def read(self) -> list[GpuReading]:
        readings = self._injected.read()
        self._simulated = bool(readings) or self._nvml is None
        if readings or self._nvml is None:
            return readings
        return self._nvml.read()

    def xids(self) -> list[int]:
        return [] if self._simulated or self._nvml is None else self._nvml.xids()

    def close(self) -> None:
        if self._nvml is not None:
            self._nvml.close()


def local_source(
    metadata_url: str,
    visible: str | None = None,
    *,
    open_host: Callable[[str | None], ReadingSource | None] | None = None,
) -> LocalSource:
    """The telemetry of an instance on the local cloud: injections from its metadata URL, and
    the host's NVML where the host has a GPU (`open_host`, default `open_nvml`)."""
    return LocalSource(local_injection(metadata_url), (open_host or open_nvml)(visible))


class TelemetrySampler:
    """Reads `source` every `interval_s`, emits finished minutes through `emit` (a list of wire
    dicts each time, never empty). `tick` does one step and is what tests drive; `start` runs
    it on a daemon thread until `stop`, which emits the minute in progress too."""

    def __init__(
        self,
        source: ReadingSource,
        emit: Callable[[list[dict[str, Any]]], None],
        *,
        interval_s: float = SAMPLE_INTERVAL_S,
        now: Callable[[], datetime] | None = None,
    ) -> None:
        self.source = source
        self.emit = emit
        self.interval_s = interval_s
        self._now = now or machine_now
        self.aggregator = MinuteAggregator(simulated=source.simulated)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._failed: set[str] = set()
        self.readings = 0

    def tick(self) -> None:
        """Read once, fold it in, emit the minutes that have ended. Never raises."""
        with self._lock:
            try:
                now = self._now()
                readings = self.source.read()
                xids = self.source.xids()
                label = getattr(self.source, "source", None)  # after the read: LocalSource's
                self.aggregator.add(now, readings, xids, source=label)
                if readings:
                    self.readings += 1
                out = self.aggregator.finished(now)
                if readings and getattr(self.source, "live", False):
                    out += self.aggregator.current(now)
                self._emit(out)
            except Exception as exc:  # a reading must never reach the job
                self._once(type(exc).__name__, "GPU telemetry reading failed: %s", exc)

    def _emit(self, minutes: list[dict[str, Any]]) -> None:
        if not minutes:
            return
        try:
            self.emit(minutes)
        except Exception as exc:
            self._once("emit", "GPU telemetry could not be queued: %s", exc)

    def _once(self, key: str, msg: str, *args: Any) -> None:
        if key not in self._failed:
            self._failed.add(key)
            log.warning(msg, *args)

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpu-telemetry", daemon=True)
        self._thread.start()

    def next_wait(self) -> float:
        """Seconds to the next reading: the source's own interval where it has one (a simulated
        source's injection), else `interval_s`; a source that has nothing yet is asked again
        within `IDLE_POLL_S`."""
        own = getattr(self.source, "interval_s", None)
        if own is not None:
            return max(float(own), 0.05)
        if getattr(self.source, "live", False):
            return min(self.interval_s, IDLE_POLL_S)
        return self.interval_s

    def _run(self) -> None:
        self.tick()
        while not self._stop.wait(self.next_wait()):
            self.tick()

    def stop(self, *, flush: bool = True) -> None:
        """Stop the thread (waiting at most one interval) and emit the minute in progress."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 5)
            self._thread = None
        if flush:
            with self._lock:
                try:
                    self._emit(self.aggregator.finished(self._now(), all_open=True))
                except Exception as exc:
                    self._once("flush", "GPU telemetry flush failed: %s", exc)
        with contextlib.suppress(Exception):
            self.source.close()


def open_nvml(visible: str | None = None) -> NvmlSource | None:
    """NVML's readings here, or None (logged once by the caller) where NVML cannot start."""
    from optimizer.probes.nvml import NvmlUnavailable

    try:
        source = NvmlSource(visible)
    except NvmlUnavailable as exc:
        log.info("no GPU telemetry on this machine: %s", exc)
        return None
    except Exception as exc:  # a broken driver must not stop the agent
        log.info("no GPU telemetry on this machine: NVML failed: %s", exc)
        return None
    if source.gpu_count == 0:
        source.close()
        log.info("no GPU telemetry on this machine: NVML sees no GPU")
        return None
    return source


__all__ = [
    "EVENT_KIND",
    "SAMPLE_INTERVAL_S",
    "GpuReading",
    "LocalSource",
    "MinuteAggregator",
    "NvmlSource",
    "ReadingSource",
    "SimulatedReading",
    "SimulatedSource",
    "TelemetrySampler",
    "local_injection",
    "local_source",
    "open_nvml",
]
