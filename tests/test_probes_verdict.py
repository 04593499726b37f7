"""The probe verdict, fed injected NVML readings: each sick-GPU case fails, healthy ones pass."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from optimizer.probes import (
    Check,
    DeviceRun,
    GpuHealth,
    LoadSummary,
    NodeHealth,
    NodeRun,
    Observations,
    RemappedRows,
    Status,
    XidEvent,
    gpu_spec,
    history_medians,
    judge,
    measured_tflops,
    overall,
)
from optimizer.probes.nvml import kernel_log_xids, select_visible
from optimizer.probes.readings import (
    GPU_IDLE,
    HW_SLOWDOWN,
    SW_POWER_CAP,
    SW_THERMAL,
    LoadSample,
    summarize,
)
from optimizer.probes.schema import (
    AllReducePoint,
    Correctness,
    GemmStat,
    ProbeResult,
)

GIB = 1 << 30


def h200(index: int = 0, **changes: object) -> GpuHealth:
    """A healthy H200 as REFERENCE 5.3 read it (idle)."""
    base = GpuHealth(
        index=index,
        name="NVIDIA H200",
        uuid=f"GPU-0000000{index}-aaaa-bbbb-cccc-dddddddddddd",
        pci_bus_id=f"00000000:{0x18 + index:02X}:00.0",
        memory_total_bytes=150_754_820_096,
        ecc_enabled=True,
        ecc_volatile_uncorrected=0,
        ecc_volatile_corrected=0,
        remapped_rows=RemappedRows(0, 0, False, False),
        retired_pages=None,  # NotSupported on H200
        retired_pages_pending=None,
        pcie_gen=1,  # idle links downshift
        pcie_width=16,
        pcie_max_gen=5,
        pcie_max_width=16,
        pcie_replays=0,
        nvlink_active=(True,) * 18,
        nvlink_replays=0,
        nvlink_recoveries=0,
        nvlink_crc_errors=0,
        clock_event_reasons=GPU_IDLE,
        temperature_c=36,
        slowdown_temp_c=89,
        power_w=80,
        power_limit_w=700,
        default_power_limit_w=700,
        sm_clock_mhz=345,
        max_sm_clock_mhz=1980,
        utilization_pct=0,
        recovery_action=0,
        mig_enabled=False,
        compute_processes=0,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def node(*gpus: GpuHealth) -> NodeHealth:
    return NodeHealth(gpus=gpus, device_count=len(gpus), driver_version="580.159.04")


BUSY = LoadSummary(
    samples=40,
    busy_samples=30,
    pcie_gen_max=5,
    pcie_width_max=16,
    clock_events_busy=SW_POWER_CAP,
    clock_events_all=SW_POWER_CAP | GPU_IDLE,
    temperature_max_c=57,
    power_max_w=691,
    sm_clock_busy_median_mhz=1500,
    sm_clock_busy_min_mhz=1455,
)


def observe(*gpus: GpuHealth, **kw: object) -> Observations:
    health = node(*gpus)
    load = kw.pop("load", {g.index: BUSY for g in gpus})
    return Observations(health=health, health_after=kw.pop("after", health), load=load, **kw)  # type: ignore[arg-type]


def statuses(checks: list[Check], name: str, gpu: int | None = 0) -> list[Status]:
    return [c.status for c in checks if c.name == name and c.gpu == gpu]


def status_of(checks: list[Check], name: str, gpu: int | None = 0) -> Status:
    (found,) = statuses(checks, name, gpu)
    return found


def failing(checks: list[Check]) -> list[str]:
    return [f"{c.gpu}:{c.name}: {c.reason}" for c in checks if c.status is Status.FAIL]


# --- healthy ---------------------------------------------------------------------------------


def test_healthy_h200_pair_under_a_software_power_cap_passes() -> None:
    checks = judge(observe(h200(0), h200(1)), expected_gpus=2)
    assert overall(checks) is Status.PASS, [c for c in checks if c.status is not Status.PASS]
    assert status_of(checks, "clocks.events") is Status.PASS
    assert "power cap under heavy load is normal" in next(
        c.reason for c in checks if c.name == "clocks.events" and c.gpu == 0
    )
    assert status_of(checks, "nvlink.links") is Status.PASS
    assert status_of(checks, "pcie.link") is Status.PASS


def test_not_supported_fields_are_not_applicable_never_sick() -> None:
    blank = GpuHealth(index=0, name="NVIDIA H200", memory_total_bytes=150_754_820_096)
    checks = judge(observe(blank, load={}))
    assert failing(checks) == []
    assert status_of(checks, "ecc.volatile_uncorrected") is Status.SKIP
    assert status_of(checks, "memory.remapped_rows") is Status.SKIP
    assert status_of(checks, "memory.retired_pages") is Status.SKIP
    assert status_of(checks, "pcie.link") is Status.SKIP
    assert overall(checks) is Status.PASS


def test_idle_link_at_gen1_is_not_judged() -> None:
    checks = judge(observe(h200(pcie_gen=1), load={}))
    assert status_of(checks, "pcie.link") is Status.SKIP


def test_single_application_xid_is_ignored() -> None:
    checks = judge(observe(h200(), xids=(XidEvent(13, 0),)))
    assert status_of(checks, "xid") is Status.PASS


# --- sick ------------------------------------------------------------------------------------


def test_double_bit_ecc_fails() -> None:
    checks = judge(observe(h200(ecc_volatile_uncorrected=2)))
    assert status_of(checks, "ecc.volatile_uncorrected") is Status.FAIL


def test_ecc_error_raised_during_the_probe_fails() -> None:
    after = node(h200(ecc_volatile_uncorrected=1))
    checks = judge(observe(h200(), after=after))
    assert status_of(checks, "ecc.volatile_uncorrected") is Status.FAIL


def test_remap_pending_is_rejected_until_reset() -> None:
    checks = judge(observe(h200(remapped_rows=RemappedRows(0, 1, True, False))))
    assert status_of(checks, "memory.remapped_rows") is Status.FAIL
    assert "reset" in next(c.reason for c in checks if c.name == "memory.remapped_rows")


def test_remap_failure_fails() -> None:
    checks = judge(observe(h200(remapped_rows=RemappedRows(0, 8, False, True))))
    assert status_of(checks, "memory.remapped_rows") is Status.FAIL


def test_many_uncorrectable_remaps_warn() -> None:
    checks = judge(observe(h200(remapped_rows=RemappedRows(0, 512, False, False))))
    assert status_of(checks, "memory.remapped_rows") is Status.WARN


def test_xid_79_fails() -> None:
    checks = judge(observe(h200(), xids=(XidEvent(79, 0),)))
    assert status_of(checks, "xid") is Status.FAIL


def test_repeated_application_xid_warns() -> None:
    checks = judge(observe(h200(), xids=(XidEvent(13, 0),) * 3))
    assert status_of(checks, "xid") is Status.WARN


def test_pcie_x8_under_load_fails() -> None:
    load = {0: replace(BUSY, pcie_width_max=8)}
    checks = judge(observe(h200(), load=load))
    assert status_of(checks, "pcie.link") is Status.FAIL


def test_pcie_gen4_under_load_on_a_gen5_slot_warns() -> None:
    load = {0: replace(BUSY, pcie_gen_max=4)}
    checks = judge(observe(h200(), load=load))
    assert status_of(checks, "pcie.link") is Status.WARN


def test_an_nvlink_down_fails() -> None:
    links = (True,) * 5 + (False,) + (True,) * 12
    checks = judge(observe(h200(0, nvlink_active=links), h200(1)))
    assert status_of(checks, "nvlink.links", 0) is Status.FAIL
    assert "link 5 down" in next(c.reason for c in checks if c.name == "nvlink.links")
    assert status_of(checks, "nvlink.links", 1) is Status.PASS


def test_nvlink_on_a_single_gpu_is_not_judged() -> None:
    checks = judge(observe(h200(nvlink_active=(False,) * 18)))
    assert status_of(checks, "nvlink.links") is Status.SKIP


def test_hardware_slowdown_fails() -> None:
    load = {0: replace(BUSY, clock_events_all=SW_POWER_CAP | HW_SLOWDOWN)}
    checks = judge(observe(h200(), load=load))
    assert status_of(checks, "clocks.events") is Status.FAIL
    assert "HwSlowdown" in next(c.reason for c in checks if c.name == "clocks.events")


def test_software_thermal_slowdown_warns() -> None:
    checks = judge(observe(h200(clock_event_reasons=SW_THERMAL), load={}))
    assert status_of(checks, "clocks.events") is Status.WARN


def test_a_missing_gpu_fails() -> None:
    checks = judge(observe(*(h200(i) for i in range(7))), expected_gpus=8)
    assert status_of(checks, "gpu.count", None) is Status.FAIL
    assert overall(checks) is Status.FAIL


def test_a_lost_gpu_fails() -> None:
    checks = judge(observe(h200(lost=True, errors=(("Name", "NVMLError_GpuIsLost"),))))
    assert status_of(checks, "gpu.reachable") is Status.FAIL


def test_a_requested_recovery_action_fails() -> None:
    checks = judge(observe(h200(recovery_action=2)))
    assert status_of(checks, "gpu.recovery_action") is Status.FAIL


def test_temperature_at_the_slowdown_threshold_fails() -> None:
    load = {0: replace(BUSY, temperature_max_c=90)}
    checks = judge(observe(h200(), load=load))
    assert status_of(checks, "temperature") is Status.FAIL


def test_a_provider_power_cap_warns() -> None:
    checks = judge(observe(h200(power_limit_w=500)))
    assert status_of(checks, "power.limit") is Status.WARN


def test_foreign_processes_warn() -> None:
    checks = judge(observe(h200(compute_processes=1)))
    assert status_of(checks, "gpu.processes") is Status.WARN


def test_no_cuda_device_is_a_finding_not_a_failure() -> None:
    cpu = DeviceRun("cpu", None, True, 1.0, gemm=(GemmStat("fp32", 256, 0.1, 0.1, 0.1, 3),))
    obs = Observations(backend="cpu", nvml_error="NVML Shared Library Not Found", runs=(cpu,))
    checks = judge(obs)
    assert status_of(checks, "cuda", None) is Status.WARN
    assert overall(checks) is Status.WARN
    assert overall(judge(obs, expected_gpus=1)) is Status.FAIL


# --- measured performance --------------------------------------------------------------------


def h200_run(gpu: int = 0, **changes: object) -> DeviceRun:
    """Figures like REFERENCE 5.2's calibration run."""
    gemm = tuple(
        GemmStat(d, 8192, t, t * 0.98, t * 1.01, 20)
        for d, t in (("bf16", 759), ("fp16", 727), ("tf32", 392), ("fp32", 51), ("fp64", 62))
    )
    run = DeviceRun(
        "cuda",
        gpu,
        True,
        20.0,
        name="NVIDIA H200",
        info={"sm_count": 132},
        gemm=gemm,
        copy_gbps=4266,
        h2d_gbps=55.4,
        d2h_gbps=55.3,
        correctness=Correctness("fp32", 4096, 10, 0, 0, 1e-6, 1e-3, "abc"),
    )
    return replace(run, **changes)  # type: ignore[arg-type]


def test_reference_h200_figures_pass_against_the_datasheet() -> None:
    checks = judge(observe(h200(), runs=(h200_run(),)))
    for name in ("gemm.bf16", "gemm.fp64", "memory.copy", "host.h2d", "correctness.fp32"):
        assert status_of(checks, name) is Status.PASS, name
    assert failing(checks) == []


def test_gemm_far_below_the_datasheet_fails() -> None:
    slow = h200_run(gemm=(GemmStat("bf16", 8192, 300, 290, 310, 20),))
    checks = judge(observe(h200(), runs=(slow,)))
    assert status_of(checks, "gemm.bf16") is Status.FAIL


def test_gemm_below_080_of_the_model_median_fails() -> None:
    run = h200_run(gemm=(GemmStat("bf16", 8192, 600, 590, 610, 20),))
    checks = judge(observe(h200(), runs=(run,)), history={"gemm.bf16": 770})
    assert status_of(checks, "gemm.bf16") is Status.FAIL
    assert "0.78 of the model's median" in next(c.reason for c in checks if c.name == "gemm.bf16")


def test_bitwise_mismatch_fails() -> None:
    bad = h200_run(correctness=Correctness("fp32", 4096, 10, 1, 0, 1e-6, 1e-3, "abc"))
    checks = judge(observe(h200(), runs=(bad,)))
    assert status_of(checks, "correctness.fp32") is Status.FAIL


def test_nan_in_a_product_fails() -> None:
    bad = h200_run(correctness=Correctness("fp32", 4096, 10, 0, 3, float("inf"), 1e-3, "abc"))
    checks = judge(observe(h200(), runs=(bad,)))
    assert status_of(checks, "correctness.fp32") is Status.FAIL


def test_a_gpu_whose_product_differs_from_its_peers_warns() -> None:
    odd = replace(h200_run(2), correctness=Correctness("fp32", 4096, 10, 0, 0, 1e-6, 1e-3, "x"))
    runs = (h200_run(0), h200_run(1), odd)
    checks = judge(observe(h200(0), h200(1), h200(2), runs=runs))
    assert status_of(checks, "correctness.cross_gpu", 2) is Status.WARN
    assert statuses(checks, "correctness.cross_gpu", 0) == []


def test_a_hung_probe_is_a_failure() -> None:
    hung = DeviceRun("cuda", 0, False, 55.0, error="timed out", timed_out=True)
    checks = judge(observe(h200(), runs=(hung,), timeout_s=55))
    assert status_of(checks, "probe.active") is Status.FAIL
    assert "killed" in next(c.reason for c in checks if c.name == "probe.active")


def test_allreduce_bus_bandwidth_is_judged_against_nvlink() -> None:
    good = NodeRun(2, True, 5.0, points=(AllReducePoint(GIB, 3.25, 330, 330),), sum_correct=True)
    slow = replace(good, points=(AllReducePoint(GIB, 10.7, 100, 100),))
    assert status_of(judge(observe(h200(0), h200(1), node=good)), "allreduce.busbw", None) is (
        Status.PASS
    )
    assert status_of(judge(observe(h200(0), h200(1), node=slow)), "allreduce.busbw", None) is (
        Status.FAIL
    )


# --- results, history and naming ------------------------------------------------------------


def result_with(runs: tuple[DeviceRun, ...]) -> ProbeResult:
    checks = judge(observe(h200(0), h200(1), runs=runs))
    return ProbeResult(
        kind="quick",
        status=overall(checks),
        started_at="2026-11-30T00:00:00+00:00",
        seconds=40.0,
        backend="cuda",
        gpu_model="H200-141GB",
        expected_gpus=2,
        host={},
        checks=tuple(checks),
        health=node(h200(0), h200(1)),
        runs=runs,
        measured_tflops=measured_tflops("H200-141GB", runs),
    )


def test_result_json_round_trips_into_history_medians() -> None:
    runs = (h200_run(0), h200_run(1, copy_gbps=4200.0))
    data = json.loads(json.dumps(result_with(runs).to_dict()))
    assert data["schema"] == "gpuopt.probe" and data["version"] == 1
    assert data["measured_tflops"]["H200-141GB"]["bf16"] == 759
    medians = history_medians([data, data], "H200-141GB")
    assert medians["gemm.fp64"] == 62
    assert medians["copy_gbps"] == pytest.approx(4233)
    assert history_medians([data], "A100-80GB") == {}


@pytest.mark.parametrize(
    ("name", "memory_mib", "model"),
    [
        ("NVIDIA H200", 143771, "H200-141GB"),
        ("NVIDIA A100-SXM4-80GB", 81920, "A100-80GB"),
        ("NVIDIA H100 80GB HBM3", 81559, "H100-80GB"),
        ("Tesla T4", 15360, "T4"),
        ("NVIDIA L4", 23034, "L4"),
    ],
)
def test_driver_names_map_to_the_hardware_table(name: str, memory_mib: int, model: str) -> None:
    assert gpu_spec(name, memory_mib << 20).name == model


def test_unknown_gpu_is_named_and_warned_about() -> None:
    checks = judge(observe(h200(name="NVIDIA Mystery 9000")))
    assert status_of(checks, "gpu.model", None) is Status.WARN


def test_load_samples_fold_to_what_was_seen_while_busy() -> None:
    samples = [
        LoadSample(0, 0.1, utilization_pct=0, pcie_gen=1, pcie_width=16, clock_event_reasons=1),
        LoadSample(0, 0.2, utilization_pct=100, pcie_gen=5, pcie_width=16, clock_event_reasons=4),
        LoadSample(0, 0.3, utilization_pct=100, pcie_gen=5, pcie_width=16, sm_clock_mhz=1500),
    ]
    summary = summarize(samples)[0]
    assert (summary.busy_samples, summary.pcie_gen_max) == (2, 5)
    assert summary.clock_events_busy == SW_POWER_CAP
    assert summary.clock_event_counts == {"SwPowerCap": 1}


def test_cuda_visible_devices_selects_nvml_devices() -> None:
    uuids = ["GPU-aaa", "GPU-bbb", "GPU-ccc"]
    assert select_visible(uuids, None) == [0, 1, 2]
    assert select_visible(uuids, "2,0") == [2, 0]
    assert select_visible(uuids, "GPU-bb") == [1]
    assert select_visible(uuids, "1,7,2") == [1]  # CUDA stops at the first invalid entry
    assert select_visible(uuids, "") == []


def test_kernel_log_xids_are_placed_on_their_gpu() -> None:
    text = "[  12.3] NVRM: Xid (PCI:0000:19:00): 79, pid='<unknown>', GPU has fallen off the bus."
    (event,) = kernel_log_xids(text, {"0000:19:00": 1})
    assert (event.xid, event.gpu, event.source) == (79, 1, "kernel-log")
