"""Shared by the tests: moved from tests/test_probes_store.py, which uses them too."""

from __future__ import annotations

from typing import Any

from optimizer.store import Store
from optimizer.store.jobs import AttemptRecord
from tests.helpers import T0, make_offer


def attempt_of(
    store: Store, job: str, number: int = 1, *, provider: str = "aws", kind: str = "p5.48xlarge"
) -> AttemptRecord:
    found = store.jobs.get_job(job)
    job_id = found.id if found else store.jobs.add_job(job, "small", {"run": "x"}, at=T0)
    offer = make_offer(provider=provider, region="us-east-1", zone="us-east-1a", instance_type=kind)
    return store.jobs.create_attempt(job_id, number, f"{job}-{number}", offer, "sha", T0)


def probe_json(
    bf16: float, *, copy: float = 4000.0, backend: str = "cuda", gpus: int = 2, kind: str = "quick"
) -> dict[str, Any]:
    """A probe result (schema gpuopt.probe) as an agent reports it, with `gpus` GPU runs."""
    run = {
        "device": "cuda" if backend == "cuda" else "cpu",
        "ok": True,
        "gemm": [{"dtype": "bf16", "tflops": bf16 + 100}],
        "copy_gbps": copy,
        "h2d_gbps": 55.0,
        "d2h_gbps": 53.0,
    }
    return {
        "schema": "gpuopt.probe",
        "version": 1,
        "kind": kind,
        "backend": backend,
        "gpu_model": "H100-80GB" if backend == "cuda" else None,
        "measured_tflops": {"H100-80GB" if backend == "cuda" else "cpu": {"bf16": bf16}},
        "runs": [{**run, "gpu": i} for i in range(gpus)],
        "node": {"points": [{"nbytes": 1 << 30, "busbw_gbps": 330.0}, {"nbytes": 1 << 20}]},
    }


def report(
    store: Store, a: AttemptRecord, event_id: str, status: str, result: dict[str, Any], at: Any
) -> list[str]:
    event = {"id": event_id, "kind": "probe_result", "data": {"status": status, "result": result}}
    return store.jobs.record_agent_events(a.key, [event], at)
