"""PynvmlSource over a scripted NVML: NotSupported reads as n/a, GpuIsLost marks the GPU lost,
XID events are collected, and CUDA_VISIBLE_DEVICES picks the GPUs."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

pynvml = pytest.importorskip("pynvml")

from optimizer.probes import PynvmlSource  # noqa: E402

UUIDS = ("GPU-aaaa", "GPU-bbbb")
HANDLES = [ctypes.c_void_p(0x1000 + i) for i in range(2)]


def _index(handle: Any) -> int:
    return HANDLES.index(next(h for h in HANDLES if h.value == handle.value))


def not_supported(*_: object) -> Any:
    raise pynvml.NVMLError_NotSupported(pynvml.NVML_ERROR_NOT_SUPPORTED)


def per_gpu(first: Callable[..., Any], second: Callable[..., Any] | None = None) -> Callable:
    def call(handle: Any, *args: object) -> Any:
        return (first if _index(handle) == 0 or second is None else second)(handle, *args)

    return call


def lost(*_: object) -> Any:
    raise pynvml.NVMLError_GpuIsLost(pynvml.NVML_ERROR_GPU_IS_LOST)


def nvlink_state(_: Any, link: int) -> int:
    if link >= 18:
        raise pynvml.NVMLError_InvalidArgument(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return 1


class Events:
    """One XID 79 on GPU 0, then an error that ends the listener (no waiting in tests)."""

    def __init__(self) -> None:
        self.calls = 0

    def wait(self, _set: Any, _ms: int) -> Any:
        self.calls += 1
        if self.calls == 1:
            return SimpleNamespace(
                device=HANDLES[0], eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=79
            )
        raise pynvml.NVMLError_Unknown(pynvml.NVML_ERROR_UNKNOWN)


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in dir(pynvml):
        if name.startswith("nvmlDevice") or name.startswith("nvmlSystem"):
            monkeypatch.setattr(pynvml, name, not_supported)
    events = Events()
    fakes: dict[str, Callable[..., Any]] = {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: 2,
        "nvmlDeviceGetHandleByIndex": lambda i: HANDLES[i],
        "nvmlDeviceGetUUID": lambda h: UUIDS[_index(h)],
        "nvmlDeviceGetName": per_gpu(lambda h: "NVIDIA H200", lost),
        "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(total=150_754_820_096),
        "nvmlDeviceGetEccMode": lambda h: [1, 1],
        "nvmlDeviceGetTotalEccErrors": lambda h, kind, counter: 0,
        "nvmlDeviceGetRemappedRows": lambda h: (0, 0, 0, 0),
        "nvmlDeviceGetPciInfo": lambda h: SimpleNamespace(busId=b"00000000:18:00.0"),
        "nvmlDeviceGetNvLinkState": nvlink_state,
        "nvmlDeviceGetNvLinkErrorCounter": lambda h, link, counter: 0,
        "nvmlDeviceGetCurrentClocksEventReasons": lambda h: 0x4,
        "nvmlDeviceGetTemperatureV": lambda h, sensor: (_ for _ in ()).throw(
            pynvml.NVMLError_FunctionNotFound(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        ),
        "nvmlDeviceGetTemperature": lambda h, sensor: 36,
        "nvmlDeviceGetPowerUsage": lambda h: 132_800,
        "nvmlDeviceGetEnforcedPowerLimit": lambda h: 700_000,
        "nvmlDeviceGetCurrPcieLinkGeneration": lambda h: 5,
        "nvmlDeviceGetCurrPcieLinkWidth": lambda h: 16,
        "nvmlDeviceGetUtilizationRates": lambda h: SimpleNamespace(gpu=100),
        "nvmlDeviceGetFieldValues": lambda h, ids: [
            SimpleNamespace(nvmlReturn=pynvml.NVML_SUCCESS, value=SimpleNamespace(uiVal=0))
        ],
        "nvmlSystemGetDriverVersion": lambda: "580.159.04",
        "nvmlSystemGetCudaDriverVersion_v2": lambda: 13000,
        "nvmlEventSetCreate": lambda: object(),
        "nvmlEventSetFree": lambda s: None,
        "nvmlDeviceRegisterEvents": lambda h, mask, s: None,
        "nvmlEventSetWait_v2": events.wait,
    }
    for name, fake in fakes.items():
        monkeypatch.setattr(pynvml, name, fake)


@pytest.mark.usefixtures("nvml")
def test_snapshot_reads_supported_fields_and_leaves_the_rest_as_not_applicable() -> None:
    source = PynvmlSource()
    health = source.snapshot()
    gpu = health.gpus[0]
    assert (health.device_count, health.driver_version, health.cuda_driver_version) == (
        2,
        "580.159.04",
        "13.0",
    )
    assert (gpu.name, gpu.uuid, gpu.pci_bus_id) == ("NVIDIA H200", "GPU-aaaa", "00000000:18:00.0")
    assert gpu.temperature_c == 36  # the deprecated call stands in where GetTemperatureV is absent
    assert gpu.nvlink_active == (True,) * 18
    assert gpu.retired_pages is None and gpu.retired_pages_pending is None  # NotSupported
    assert gpu.recovery_action == 0 and gpu.power_limit_w == 700
    assert gpu.errors == () and not gpu.lost
    assert health.gpus[1].lost
    source.close()


@pytest.mark.usefixtures("nvml")
def test_cuda_visible_devices_limits_what_is_read() -> None:
    source = PynvmlSource("GPU-bbbb")
    assert [g.uuid for g in source.snapshot().gpus] == ["GPU-bbbb"]
    assert source.snapshot().gpus[0].index == 0


@pytest.mark.usefixtures("nvml")
def test_load_samples_and_xid_events() -> None:
    source = PynvmlSource()
    (first, _second) = source.sample(1.5)
    assert (first.gpu, first.t, first.pcie_gen, first.clock_event_reasons) == (0, 1.5, 5, 0x4)
    source.start_xid_watch()
    events = source.stop_xid_watch()
    assert [(e.xid, e.gpu) for e in events] == [(79, 0)]
