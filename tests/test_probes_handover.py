"""The handover probe: the quick probe's stages with shorter timing and no sustained stage,
judged by the same rules, and chosen for an attempt only once its type has a full result.

The active subprocess is a stand-in that answers like `python -m optimizer.probes.active gpu`
on an H200 and records the arguments it was given, so the runner's choices are seen without a
GPU; the CPU run at the end is the real subprocess."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from optimizer import protocol
from optimizer.probes import (
    DEEP,
    HANDOVER,
    QUICK,
    GpuHealth,
    NodeHealth,
    NvmlUnavailable,
    ProbeOptions,
    ProbeResult,
    Status,
    XidEvent,
    run_probe,
)
from optimizer.probes.readings import LoadSample
from optimizer.protocol import probe_to_run

# Writes an H200-like report to --out, with the argv it got; a sustained figure only when
# asked for one (--sustain-s > 0), as active.run_gpu does.
STAND_IN = r"""
import json, sys
argv = sys.argv[1:]
def arg(name, default=None):
    return argv[argv.index(name) + 1] if name in argv else default
figures = {"bf16": 790.0, "fp16": 750.0, "tf32": 380.0, "fp32": 50.9, "fp64": 60.0}
dtypes = argv[argv.index("--dtypes") + 1 : argv.index("--copy-bytes")]
report = {
    "info": {"name": "NVIDIA H200", "memory_bytes": 150754820096, "torch": "2.11", "argv": argv},
    "name": "NVIDIA H200",
    "gemm": [
        {"dtype": d, "n": int(arg("--n")), "tflops": figures[d], "tflops_min": figures[d],
         "tflops_max": figures[d], "repeats": int(arg("--repeats", 20))}
        for d in dtypes
    ],
    "copy_gbps": 4250.0, "h2d_gbps": 55.0, "d2h_gbps": 55.0,
    "correctness": {"dtype": "fp32", "n": 4096, "repeats": 10, "mismatches": 0, "nonfinite": 0,
                    "rel_error": 1e-6, "tolerance": 1e-3, "digest": "ab"},
}
if float(arg("--sustain-s")) > 0:
    report["sustained"] = {"seconds": float(arg("--sustain-s")), "tflops_median": 658.0,
                           "tflops_min": 650.0, "windows": 10}
json.dump(report, open(arg("--out"), "w"))
"""
PYTHON = (sys.executable, "-c", STAND_IN)


class OneH200:
    """A HealthSource with one H200, healthy unless `gpu` says otherwise."""

    gpu = GpuHealth(
        0,
        name="NVIDIA H200",
        uuid="GPU-x",
        memory_total_bytes=150_754_820_096,
        ecc_enabled=True,
        ecc_volatile_uncorrected=0,
    )

    def __init__(self, visible: str | None) -> None:
        self.visible = visible

    def snapshot(self) -> NodeHealth:
        return NodeHealth(gpus=(self.gpu,), device_count=1)

    def sample(self, t: float) -> list[LoadSample]:
        return []

    def start_xid_watch(self) -> None:
        pass

    def stop_xid_watch(self) -> list[XidEvent]:
        return []

    def close(self) -> None:
        pass


class SickH200(OneH200):
    gpu = replace(OneH200.gpu, ecc_volatile_uncorrected=2)


def probe(kind: str, source: type[OneH200] = OneH200) -> ProbeResult:
    options = ProbeOptions(kind=kind, python=PYTHON, timeout_s=60)
    return run_probe(options, open_source=source, read_kernel_log=str)


def argv_of(result: ProbeResult) -> list[str]:
    (run,) = result.runs
    assert run.ok, run.error
    return list(run.info["argv"])


def option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def checks(result: ProbeResult) -> dict[str, Status]:
    return {c.name: c.status for c in result.checks}


@pytest.fixture(scope="module")
def runs() -> dict[str, ProbeResult]:
    return {kind: probe(kind) for kind in (HANDOVER, QUICK)}


def test_the_handover_runs_the_quick_stages_shorter_and_without_the_sustained_stage(
    runs: dict[str, ProbeResult],
) -> None:
    handover, quick = runs[HANDOVER], runs[QUICK]
    assert (handover.kind, quick.kind) == (HANDOVER, QUICK)
    assert handover.runs[0].sustained is None and quick.runs[0].sustained is not None
    short, full = argv_of(handover), argv_of(quick)
    assert (option(short, "--sustain-s"), option(full, "--sustain-s")) == ("0.0", "10.0")
    assert (option(short, "--repeats"), option(full, "--repeats")) == ("10", None)
    assert option(short, "--warmup") is option(full, "--warmup") is None  # active.py's 5
    assert (option(short, "--host-bytes"), option(full, "--host-bytes")) == (
        str(256 << 20),
        str(1 << 30),
    )
    # The same stages otherwise: every dtype, the same sizes, the same copy.
    for name in ("--n", "--copy-bytes", "--memtest-fraction"):
        assert option(short, name) == option(full, name), name
    assert short[short.index("--dtypes") :][:6] == full[full.index("--dtypes") :][:6]
    assert handover.host["timeout_s"] == 60
    assert ProbeOptions(kind=HANDOVER).limit_s == 30.0


def test_a_healthy_gpu_gets_the_same_verdict_from_both_but_for_the_sustained_check(
    runs: dict[str, ProbeResult],
) -> None:
    handover, quick = checks(runs[HANDOVER]), checks(runs[QUICK])
    assert runs[HANDOVER].status is runs[QUICK].status is Status.PASS
    assert set(quick) - set(handover) == {"gemm.bf16.sustained"}
    assert {k: v for k, v in quick.items() if k in handover} == handover
    # Without a sustained figure the handover's bf16 is the burst figure.
    assert runs[HANDOVER].measured_tflops["H200-141GB"]["bf16"] == 790.0
    assert runs[QUICK].measured_tflops["H200-141GB"]["bf16"] == 658.0


def test_a_failing_health_reading_fails_the_handover_as_it_fails_the_quick_probe() -> None:
    handover, quick = probe(HANDOVER, SickH200), probe(QUICK, SickH200)
    for result in (handover, quick):
        assert result.status is Status.FAIL
        assert checks(result)["ecc.volatile_uncorrected"] is Status.FAIL


def test_an_unknown_kind_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown probe kind 'quik'"):
        ProbeOptions(kind="quik")


@pytest.mark.parametrize(
    ("spec", "probed", "runs"),
    [
        (QUICK, False, QUICK),  # a type's first boot: the full quick probe
        (QUICK, True, HANDOVER),
        (DEEP, True, DEEP),
        (DEEP, False, DEEP),
        ("none", True, "none"),
        ("none", False, "none"),
    ],
)
def test_the_attempts_probe_follows_the_spec_and_whether_its_type_was_probed(
    spec: str, probed: bool, runs: str
) -> None:
    assert probe_to_run(spec, probed) == runs
    assert protocol.HANDOVER_PROBE == HANDOVER and protocol.PROBE_KINDS[:2] == (QUICK, DEEP)


def no_nvml(visible: str | None) -> OneH200:
    raise NvmlUnavailable("NVML Shared Library Not Found")


def test_on_the_cpu_the_handover_times_the_cpu_like_the_quick_probe() -> None:
    pytest.importorskip("torch")
    options = ProbeOptions(kind=HANDOVER, cpu_n=64, timeout_s=120)
    result = run_probe(options, open_source=no_nvml, read_kernel_log=str)
    data: dict[str, Any] = json.loads(json.dumps(result.to_dict()))
    assert (data["kind"], data["backend"], data["status"]) == ("handover", "cpu", "warn")
    assert data["measured_tflops"]["cpu"]["fp32"] > 0


def test_the_agent_runs_the_probe_the_daemon_chose_else_the_specs() -> None:
    from optimizer.agent.config import Assignment

    job = {"run": "python train.py", "probes": "quick"}
    assert Assignment.parse({"job": job, "probe": "handover"}).probe == "handover"
    assert Assignment.parse({"job": job}).probe == "quick"  # an older daemon says nothing
    assert Assignment.parse({"job": job, "probe": "handover"}).job.probes == "quick"
    with pytest.raises(ValueError, match="unknown probe value 'sideways'"):
        Assignment.parse({"job": job, "probe": "sideways"})


def test_the_agent_runs_and_reports_the_kind_in_its_answer(tmp_path: Path) -> None:
    from optimizer.agent import Agent, AgentConfig
    from optimizer.common.retry import Backoff
    from tests.helpers.agent_loop import ScriptedDaemon, ScriptedWatcher, job

    def run(answer: dict[str, Any], where: Path) -> tuple[list[str], ScriptedDaemon]:
        asked: list[str] = []

        def fake_probe(kind: str, expected: int | None) -> tuple[str, dict[str, Any]]:
            asked.append(kind)
            return "pass", {"kind": kind}

        config = AgentConfig(
            daemon_url="http://d",
            token="t",
            attempt_key="train/1",
            metadata_kind="aws-imds",
            cloud="aws",
            agent_dir=where,
        )
        daemon = ScriptedDaemon(answer)
        agent = Agent(
            config,
            client=daemon,  # type: ignore[arg-type]
            watcher=ScriptedWatcher(),  # type: ignore[arg-type]
            probe=fake_probe,
            register_backoff=Backoff(base=0.01, cap=0.02),
            send_backoff=Backoff(base=0.01, cap=0.05),
            telemetry_source=lambda: None,
        )
        assert agent.run() == 0
        return asked, daemon

    answer = job(tmp_path, 3, probes="quick")
    asked, daemon = run({**answer, "probe": "handover"}, tmp_path / "handover")
    assert asked == ["handover"]
    [result] = [e.data for e in daemon.events if e.kind == "probe_result"]
    assert result == {"status": "pass", "result": {"kind": "handover"}}
    assert run(answer, tmp_path / "older-daemon")[0] == ["quick"]
