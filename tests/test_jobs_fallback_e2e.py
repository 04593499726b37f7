"""The on-demand fallback end to end on the local cloud: after `on_demand_after_interruptions`
interruptions of its spot attempts, a job is relaunched on on-demand capacity and carries on
from its checkpoint. Real daemon, real agent processes, real training job (see
tests/helpers/jobs.py, shared with test_jobs_e2e.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pytest_httpserver import HTTPServer

from optimizer.daemon.service import Daemon
from providers.local import LocalCloud
from tests.helpers import api, wait_until, write_policy
from tests.helpers.jobs import (
    E2E_FIXTURES,
    POLICY,
    done_summary,
    hook_alerts,
    job_body,
    latest_step,
    running_instance,
    running_instance_id,
    state_of,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("daemon_env")]


clock, cloud, daemon = E2E_FIXTURES


CHECKPOINT_EVERY = 5  # job_body's --checkpoint-every
# Long enough that neither spot attempt ends the job before its interruption takes it
# (each step sleeps 20 ms; a hot handover lets the old job run until the replacement is ready).
STEPS = 800
FALLBACK = "2 interruptions within an hour: falling back to on-demand"


def interruption_alerts(httpserver: HTTPServer) -> list[str]:
    return [a["message"] for a in hook_alerts(httpserver) if a.get("kind") == "job.interrupted"]


def test_a_job_interrupted_twice_on_spot_finishes_on_demand_from_its_checkpoint(
    tmp_path: Path, daemon: Daemon, cloud: LocalCloud, httpserver: HTTPServer
) -> None:
    policy = POLICY.replace(
        "max_restarts: 5, pool_cooldown_minutes: 10, on_demand_after_interruptions: 5",
        "max_restarts: 10, pool_cooldown_minutes: 10, on_demand_after_interruptions: 2",
    )
    assert policy != POLICY
    write_policy(tmp_path / "policies", "local-eu.yaml", policy)
    wait_until(
        lambda: daemon.registry.get("local-eu").policy.recovery.on_demand_after_interruptions == 2,
        10,
        "the policy reload",
    )
    ckpt = tmp_path / "ckpt"
    with api(daemon) as client:
        assert client.post("/jobs", json=job_body("train", ckpt, steps=STEPS)).status_code == 201
    job_id = state_of(daemon, "train")["id"]

    saved_at_notice = []  # the newest checkpoint when each interruption notice went out
    reached = 0
    for attempt in (1, 2):
        instance = wait_until(
            lambda a=attempt: running_instance(cloud, "train", a), 30, f"attempt {attempt} running"
        )
        # this attempt resumed and saved a checkpoint of its own before the cloud takes it back
        wanted = reached + 2 * CHECKPOINT_EVERY
        wait_until(lambda n=wanted: latest_step(ckpt) >= n, 60, f"a checkpoint at step {wanted}")
        saved_at_notice.append(latest_step(ckpt))
        cloud.interrupt(instance)
        wait_until(lambda i=instance: not running_instance_id(cloud, i), 30, "the power-off")
        reached = latest_step(ckpt)
    # the replacement runs the job to its end (too quickly, maybe, to catch it running)
    wait_until(lambda: state_of(daemon, "train")["state"] == "succeeded", 60, "the job to finish")

    attempts = daemon.store.jobs.attempts(job_id)
    seen = [(a.key, a.market, a.end_reason, a.exit_code) for a in attempts]
    assert [a.market for a in attempts] == ["spot", "spot", "on_demand"], seen
    assert [a.end_reason for a in attempts] == ["preempted", "preempted", "succeeded"], seen
    assert attempts[-1].exit_code == 0, seen
    launched = {r.key: r.market for r in cloud.instances()}
    assert launched[attempts[-1].key] == "on_demand"  # what the cloud was asked for

    # the job carried on from its checkpoints: nothing lost beyond one checkpoint interval
    done = done_summary(ckpt)
    assert done["steps"] == STEPS
    runs = done["runs"]
    assert [r["attempt"] for r in runs] == ["1", "2", "3"]
    assert [r["restarts"] for r in runs] == ["0", "1", "2"]
    assert runs[0]["from_step"] == 0
    for run, saved in zip(runs[1:], saved_at_notice, strict=True):
        assert run["from_step"] >= saved > 0  # at least what was saved when the notice came
    assert runs[-1]["to_step"] == STEPS

    # the fallback is on record: in the interruption event and the job's transition
    events = daemon.store.events.recent(job_id=job_id, limit=500)
    interrupted = [e.message for e in events if e.kind == "job.interrupted"]
    assert len(interrupted) == 2, interrupted
    assert FALLBACK not in interrupted[0] and "restart 1" in interrupted[0]
    assert FALLBACK in interrupted[1] and "restart 2" in interrupted[1]
    transitions = [e.message for e in events if e.kind == "job.state_changed"]
    assert any(FALLBACK in m and "attempt 3 on" in m and "on_demand" in m for m in transitions)
    alerted = wait_until(
        lambda: len(m := interruption_alerts(httpserver)) >= 2 and m, 10, "both alerts"
    )
    assert alerted == interrupted  # the webhook carried the same words
