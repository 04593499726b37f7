"""The handover probe end to end on the local cloud: a real daemon, a real agent process and
the real probe. Once every local instance type has a full result, a `quick` job's attempt is
told to run the handover probe, its agent runs it (on this host's CPU) and the daemon stores
the result as a handover."""

from __future__ import annotations

from pathlib import Path

import pytest

from optimizer.clock import Clock
from optimizer.daemon.service import Daemon
from tests.helpers import api, wait_until
from tests.helpers.jobs import E2E_FIXTURES, job_body, state_of
from tests.helpers.probes import probe_json

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("daemon_env")]

clock, cloud, daemon = E2E_FIXTURES


def test_a_quick_job_on_a_type_already_probed_runs_the_handover_probe(
    tmp_path: Path, daemon: Daemon, clock: Clock
) -> None:
    # Every local type has a usable quick result (measured on this host's CPU, which on the
    # local cloud counts: its instances are all this host), from a job of a policy the daemon
    # has not loaded, so the reconcile loop leaves its attempts alone.
    offers = daemon.store.prices.latest_offers(provider="local")
    assert offers
    seed = daemon.store.jobs.add_job("seed", "not-loaded", {"run": "x"}, at=clock())
    for number, offer in enumerate(offers, start=1):
        daemon.store.jobs.create_attempt(seed, number, f"seed-{number}", offer, "sha", clock())
        event = {
            "id": f"seed-probe-{number}",
            "kind": "probe_result",
            "data": {"status": "warn", "result": probe_json(0.4, backend="cpu", gpus=1)},
        }
        daemon.store.jobs.record_agent_events(f"seed-{number}", [event], clock(), on_host=True)

    body = job_body("known", tmp_path / "ckpt", steps=10, probes="quick")
    with api(daemon) as client:
        assert client.post("/jobs", json=body).status_code == 201
    # one CPU probe and ten steps; slow on a loaded host
    job = wait_until(
        lambda: (j := state_of(daemon, "known"))["state"] == "succeeded" and j, 180, "the job"
    )
    [probed] = [p for p in daemon.store.probes.page() if p.job_id == job["id"]]
    assert (probed.kind, probed.status, probed.source) == ("handover", "warn", "simulated")
    result = daemon.store.probes.result_json(probed.id)
    assert result is not None and result["kind"] == "handover" and result["backend"] == "cpu"
    assert probed.tflops == {}  # a handover stores no TFLOPS of its own
