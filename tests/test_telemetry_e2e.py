"""GPU telemetry end to end: a real daemon (in-process, real HTTP), the local cloud's instance
running the real agent, simulated readings injected with `gpuopt local telemetry` (a real
process); the job's readings reach the store, `GET /jobs/{name}`, `gpuopt jobs show` and
/metrics labelled simulated; an interruption and the relaunch show in the recovery metrics."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from optimizer.daemon.service import Daemon
from providers.local import LocalCloud
from tests.helpers import TOKEN, api, run_gpuopt, wait_until
from tests.helpers.jobs import E2E_FIXTURES, job_body, running_instance, state_of

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("daemon_env")]


clock, cloud, daemon = E2E_FIXTURES


def scrape(daemon: Daemon) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with api(daemon) as client:
        text = client.get("/metrics").text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def gpu_of(daemon: Daemon, name: str) -> dict | None:
    return state_of(daemon, name).get("gpu")


def test_injected_readings_reach_the_api_cli_and_metrics_and_recovery_is_measured(
    tmp_path: Path, daemon: Daemon, cloud: LocalCloud
) -> None:
    body = job_body("train", tmp_path / "ckpt", steps=1)
    body["run"] = f'{sys.executable} -c "import time; time.sleep(600)"'
    with api(daemon) as client:
        assert client.post("/jobs", json=body).status_code == 201
    first = wait_until(lambda: running_instance(cloud, "train", 1), 30, "attempt 1 running")
    assert gpu_of(daemon, "train") is None  # no GPU here, nothing injected: no readings

    env = {"GPUOPT_API_URL": daemon.url, "GPUOPT_API_TOKEN": TOKEN}
    state_dir = str(tmp_path / "local-cloud")
    injected = run_gpuopt(
        tmp_path / "cli",
        "local", "telemetry", first, "--util", "0.03", "--memory", "0.2",
        "--gpus", "2", "--memory-gib", "80", "--every", "0.1", "--state-dir", state_dir,
    )  # fmt: skip
    assert injected.returncode == 0, injected.stderr
    assert "utilization 3%, memory 20% of 2 x 80 GiB" in injected.stdout

    wait_until(lambda: (gpu_of(daemon, "train") or {}).get("samples", 0) >= 3, 30, "readings")
    gpu = gpu_of(daemon, "train")
    assert gpu is not None and gpu["simulated"] is True
    assert gpu["current_utilization"] == pytest.approx(0.03)
    assert gpu["average_utilization"] == pytest.approx(0.03)
    assert (gpu["peak_memory_used_gib"], gpu["memory_total_gib"]) == (32.0, 160.0)
    # The store holds them per attempt, per minute, labelled simulated.
    job = daemon.store.jobs.get_job("train")
    assert job is not None
    rows = daemon.store.telemetry.samples(job_id=job.id)
    assert rows and all(r.simulated and r.span_s == 60 and r.gpus == 2 for r in rows)

    shown = run_gpuopt(tmp_path / "cli", "jobs", "show", "train", env=env)
    assert shown.returncode == 0, shown.stderr
    line = next(x for x in shown.stdout.splitlines() if "GPU:" in x)
    assert "utilization 3% now" in line and "3% average" in line
    assert "peak memory 32.0 of 160.0 GiB (20%)" in line and line.endswith("[simulated]")

    metrics = scrape(daemon)
    labels = (("job", "train"), ("simulated", "true"))
    assert metrics[("gpuopt_job_gpu_utilization", labels)] == pytest.approx(0.03)
    assert metrics[("gpuopt_job_gpu_memory_used_ratio", labels)] == pytest.approx(0.2)
    assert metrics[("gpuopt_job_recovery_seconds_count", ())] == 0

    cloud.interrupt(first)
    wait_until(lambda: running_instance(cloud, "train", 2), 60, "attempt 2 running")
    wait_until(
        lambda: scrape(daemon).get(("gpuopt_job_recovery_seconds_count", ())) == 1,
        60,
        "the recovery measured",
    )
    metrics = scrape(daemon)
    [(pool, count)] = [
        (dict(k[1]), v) for k, v in metrics.items() if k[0] == "gpuopt_job_interruptions_total"
    ]
    assert count == 1 and pool["provider"] == "local" and pool["region"].startswith("eu-")
    recovery = metrics[("gpuopt_job_recovery_seconds_sum", ())]
    assert 0 < recovery < 60
    # The new attempt has reported nothing yet: its job shows no current reading.
    assert ("gpuopt_job_gpu_utilization", labels) not in metrics
    with api(daemon) as client:
        assert client.post("/jobs/train/cancel").status_code == 200
    wait_until(lambda: state_of(daemon, "train")["state"] == "cancelled", 60, "cancelled")
