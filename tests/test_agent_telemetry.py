"""The agent's GPU telemetry, without a GPU: fake NVML readings folded into per-minute
aggregates across GPUs, and the sampler thread's steps driven by hand with a manual clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from optimizer.agent.telemetry import (
    GIB,
    IDLE_POLL_S,
    GpuReading,
    LocalSource,
    MinuteAggregator,
    SimulatedReading,
    SimulatedSource,
    TelemetrySampler,
    local_source,
    open_nvml,
)
from optimizer.clock import ManualClock

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def gpu(i: int, util: float | None, used_gib: float, **kw: Any) -> GpuReading:
    fields: dict[str, Any] = {
        "gpu": i,
        "util": util,
        "memory_used_bytes": int(used_gib * GIB),
        "memory_total_bytes": int(80 * GIB),
        "power_w": 300.0,
        "temperature_c": 60.0,
        "sm_clock_mhz": 1800.0,
        "throttle_reasons": 0,
    }
    fields.update(kw)
    return GpuReading(**fields)


def test_readings_fold_into_one_aggregate_per_minute_across_gpus() -> None:
    agg = MinuteAggregator()
    agg.add(T0 + timedelta(seconds=0), [gpu(0, 1.0, 10), gpu(1, 0.5, 30, temperature_c=70.0)])
    agg.add(
        T0 + timedelta(seconds=10),
        [gpu(0, 0.0, 20, throttle_reasons=4), gpu(1, 0.5, 40, power_w=None)],
        xids=[79],
    )
    agg.add(T0 + timedelta(seconds=50), [gpu(0, None, 1), gpu(1, 0.9, 1)])
    agg.add(T0 + timedelta(seconds=61), [gpu(0, 0.3, 5), gpu(1, 0.3, 5)])
    assert agg.finished(T0 + timedelta(seconds=59)) == []  # the minute has not ended
    [m] = agg.finished(T0 + timedelta(seconds=60))
    assert m["start"] == "2026-03-01T12:00:00Z" and (m["samples"], m["gpus"]) == (3, 2)
    # The GPUs' mean per reading (0.75, 0.25, 0.9 from the one GPU that said), then the mean.
    assert m["util_mean"] == pytest.approx((0.75 + 0.25 + 0.9) / 3, abs=1e-4)
    assert m["util_max"] == 1.0
    assert (m["memory_used_gib_max"], m["memory_total_gib"]) == (60.0, 160.0)  # 20 + 40
    assert m["power_w_mean"] == pytest.approx((600 + 300 + 600) / 3)
    assert (m["temperature_c_max"], m["throttle_reasons"], m["xids"]) == (70.0, 4, [79])
    assert m["span_s"] == 60 and m["simulated"] is False
    # The next minute comes out only when it has ended, or when everything is flushed.
    [rest] = agg.finished(T0 + timedelta(seconds=61), all_open=True)
    assert rest["start"] == "2026-03-01T12:01:00Z" and rest["samples"] == 1
    assert agg.finished(T0 + timedelta(hours=1), all_open=True) == []


class FlakySource:
    simulated = False

    def __init__(self) -> None:
        self.calls = 0

    def read(self) -> list[GpuReading]:
        self.calls += 1
        if self.calls == 2:
            raise RuntimeError("NVML hiccup")
        return [gpu(0, 0.95, 70)]

    def xids(self) -> list[int]:
        return []

    def close(self) -> None:
        pass


def test_the_sampler_emits_finished_minutes_and_survives_a_failed_reading(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock(T0)
    sent: list[list[dict[str, Any]]] = []
    source = FlakySource()
    sampler = TelemetrySampler(source, sent.append, interval_s=10, now=clock)
    for _ in range(7):  # 12:00:00 .. 12:01:00, the second reading fails
        sampler.tick()
        clock.advance(10)
    assert [len(batch) for batch in sent] == [1]
    assert sent[0][0]["samples"] == 5 and sent[0][0]["util_mean"] == 0.95
    for _ in range(3):
        sampler.tick()  # failures are logged once, not per reading
    assert sum("NVML hiccup" in r.getMessage() for r in caplog.records) == 1
    sampler.stop(flush=True)  # the minute in progress goes out too
    assert len(sent) == 2 and sent[1][0]["start"] == "2026-03-01T12:01:00Z"


def test_simulated_readings_are_labelled_live_and_absent_until_injected() -> None:
    injected: list[SimulatedReading | None] = [None]
    source = SimulatedSource(lambda: injected[0])
    clock = ManualClock(T0)
    sent: list[list[dict[str, Any]]] = []
    sampler = TelemetrySampler(source, sent.append, interval_s=10, now=clock)
    sampler.tick()
    assert sent == [] and sampler.next_wait() == 1.0  # nothing injected: look again soon
    injected[0] = SimulatedReading(util=0.03, memory=0.2, gpus=2, memory_gib=80, interval_s=2)
    clock.advance(70)
    sampler.tick()
    assert sampler.next_wait() == 2  # the injection's own interval
    clock.advance(2)
    sampler.tick()
    # Live: the minute in progress is reported at every reading, with its samples so far.
    assert [[(m["start"], m["samples"]) for m in batch] for batch in sent] == [
        [("2026-03-01T12:01:00Z", 1)],
        [("2026-03-01T12:01:00Z", 2)],
    ]
    m = sent[-1][0]
    assert m["simulated"] is True and m["util_mean"] == 0.03
    assert (m["memory_used_gib_max"], m["memory_total_gib"]) == (32.0, 160.0)
    injected[0] = None
    clock.advance(60)
    sampler.tick()  # the injection ended: the finished minute goes out, nothing more
    assert [(m["start"], m["samples"]) for m in sent[-1]] == [("2026-03-01T12:01:00Z", 2)]


def test_a_full_queue_drops_heartbeats_then_telemetry_before_any_other_event() -> None:
    from optimizer.agent.reporter import EventQueue

    q = EventQueue(max_events=3)
    q.put("job_started", {"pid": 1})
    q.put("gpu_telemetry", {"minutes": [1]})
    q.put("heartbeat", {})
    q.put("gpu_telemetry", {"minutes": [2]})  # the heartbeat goes
    assert [e.kind for e in q.pending()] == ["job_started", "gpu_telemetry", "gpu_telemetry"]
    q.put("job_exited", {})  # the oldest telemetry goes, not job_started
    assert [(e.kind, e.data) for e in q.pending()] == [
        ("job_started", {"pid": 1}),
        ("gpu_telemetry", {"minutes": [2]}),
        ("job_exited", {}),
    ]
    assert q.dropped == 2


def test_an_agent_without_gpu_readings_says_so_once_and_one_with_them_reports_them(
    tmp_path: Path,
) -> None:
    from optimizer.agent import Agent, AgentConfig
    from optimizer.common.retry import Backoff
    from tests.helpers.agent_loop import ScriptedDaemon, ScriptedWatcher, job

    def agent(daemon: ScriptedDaemon, where: Path, source: Any) -> Agent:
        config = AgentConfig(
            daemon_url="http://d",
            token="t",
            attempt_key="train/1",
            metadata_kind="aws-imds",
            cloud="aws",
            agent_dir=where,
            telemetry_s=0.01,
        )
        return Agent(
            config,
            client=daemon,  # type: ignore[arg-type]
            watcher=ScriptedWatcher(),  # type: ignore[arg-type]
            register_backoff=Backoff(base=0.01, cap=0.02),
            send_backoff=Backoff(base=0.01, cap=0.05),
            telemetry_source=lambda: source,
        )

    bare = ScriptedDaemon(job(tmp_path, 20))
    assert agent(bare, tmp_path / "bare", None).run() == 0
    said = [e.data for e in bare.events if e.kind == "gpu_telemetry"]
    assert said == [{"available": False, "reason": "no GPU readings (NVML)"}]

    gpu = ScriptedDaemon(job(tmp_path, 20))
    assert agent(gpu, tmp_path / "gpu", FlakySource()).run() == 0
    minutes = [m for e in gpu.events if e.kind == "gpu_telemetry" for m in e.data["minutes"]]
    assert minutes and sum(m["samples"] for m in minutes) >= 1
    assert all(m["util_mean"] == 0.95 and m["simulated"] is False for m in minutes)


class HostGpu:
    """The host's GPU as NvmlSource reads it: busy, 40 of 80 GiB used."""

    simulated = False
    source = "measured"

    def __init__(self) -> None:
        self.closed = False

    def read(self) -> list[GpuReading]:
        return [gpu(0, 0.9, 40.0)]

    def xids(self) -> list[int]:
        return [79]

    def close(self) -> None:
        self.closed = True


def test_a_local_instance_reads_the_hosts_gpu_labelled_host_until_an_injection() -> None:
    injected: list[SimulatedReading | None] = [None]
    host = HostGpu()
    source = LocalSource(lambda: injected[0], host)
    clock = ManualClock(T0)
    sent: list[list[dict[str, Any]]] = []
    sampler = TelemetrySampler(source, sent.append, interval_s=10, now=clock)
    sampler.tick()
    # The host's GPU: read often enough to see an injection at once, reported per minute.
    assert sampler.next_wait() == IDLE_POLL_S and sent == []
    clock.advance(60)
    sampler.tick()
    [[host_minute]] = sent
    assert (host_minute["source"], host_minute["simulated"]) == ("host", False)
    assert (host_minute["util_mean"], host_minute["xids"]) == (0.9, [79])
    injected[0] = SimulatedReading(util=0.03, memory=0.2, gpus=1, memory_gib=80, interval_s=2)
    clock.advance(60)
    sampler.tick()  # an injection wins over the host's GPU: simulated, live
    assert sampler.next_wait() == 2
    drill = sent[-1][-1]
    assert (drill["source"], drill["simulated"], drill["util_mean"]) == ("simulated", True, 0.03)
    assert drill["xids"] == []  # the host's XIDs are not the drill's
    sampler.stop()
    assert host.closed


def test_a_minute_with_any_injected_reading_is_simulated() -> None:
    agg = MinuteAggregator(source="host")
    agg.add(T0, [gpu(0, 0.9, 40.0)])
    agg.add(T0 + timedelta(seconds=5), [gpu(0, 0.1, 1.0)], source="simulated")
    agg.add(T0 + timedelta(seconds=70), [gpu(0, 0.9, 40.0)])
    first, second = agg.finished(T0 + timedelta(minutes=5))
    assert (first["source"], first["simulated"]) == ("simulated", True)
    assert (second["source"], second["simulated"]) == ("host", False)
    plain = MinuteAggregator()
    plain.add(T0, [gpu(0, 0.5, 1.0)])
    assert [(m["source"], m["simulated"]) for m in plain.finished(T0, all_open=True)] == [
        ("measured", False)
    ]


def test_without_a_gpu_on_the_host_a_local_instance_waits_for_an_injection_as_before() -> None:
    source = LocalSource(lambda: None, None)
    sent: list[list[dict[str, Any]]] = []
    sampler = TelemetrySampler(source, sent.append, interval_s=10, now=ManualClock(T0))
    sampler.tick()
    assert sent == [] and sampler.next_wait() == IDLE_POLL_S
    assert source.simulated and source.live


@pytest.fixture
def scripted_nvml(monkeypatch: pytest.MonkeyPatch) -> Any:
    """pynvml answering for one H200 with 30 of its 140 GiB in use (no driver needed)."""
    pynvml = pytest.importorskip("pynvml")
    handle = object()

    def no_events() -> Any:
        raise pynvml.NVMLError_NotSupported(pynvml.NVML_ERROR_NOT_SUPPORTED)

    fakes: dict[str, Any] = {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: 1,
        "nvmlDeviceGetHandleByIndex": lambda i: handle,
        "nvmlDeviceGetUUID": lambda h: "GPU-host",
        "nvmlDeviceGetUtilizationRates": lambda h: type("U", (), {"gpu": 85})(),
        "nvmlDeviceGetMemoryInfo": lambda h: type("M", (), {"used": 30 << 30, "total": 140 << 30}),
        "nvmlDeviceGetPowerUsage": lambda h: 350_000,
        "nvmlDeviceGetTemperatureV": lambda h, sensor: 55,
        "nvmlDeviceGetClockInfo": lambda h, kind: 1700,
        "nvmlDeviceGetCurrentClocksEventReasons": lambda h: 4,
        "nvmlEventSetCreate": no_events,
    }
    for name, fake in fakes.items():
        monkeypatch.setattr(pynvml, name, fake)
    return pynvml


def test_on_a_host_with_a_gpu_the_local_source_reads_nvml_as_the_hosts(
    scripted_nvml: Any,
) -> None:
    source = LocalSource(lambda: None, open_nvml(None))  # nothing injected
    [reading] = source.read()
    assert (reading.util, reading.memory_used_bytes, reading.power_w) == (0.85, 30 << 30, 350.0)
    assert (source.source, source.simulated, source.live) == ("host", False, False)
    source.close()


def test_where_nvml_cannot_start_the_local_source_has_no_host_gpu(
    scripted_nvml: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_driver() -> None:
        raise scripted_nvml.NVMLError_LibraryNotFound(scripted_nvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(scripted_nvml, "nvmlInit", no_driver)
    assert open_nvml(None) is None
    source = local_source("http://127.0.0.1:9/metadata")  # NVML's answer decides, not the URL
    assert (source.source, source.simulated, source.live) == ("simulated", True, True)
    source = LocalSource(lambda: None, open_nvml(None))
    assert source.read() == [] and (source.source, source.simulated) == ("simulated", True)
