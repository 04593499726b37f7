"""Multi-node jobs end to end on the local cloud: a real daemon, a real agent process per
node, examples/train_multinode.py meeting over torch.distributed (gloo) across the nodes,
the inter-node probe gating the start, and the gang replaced whole."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from optimizer.daemon.service import Daemon
from optimizer.model import EventKind
from providers.local import LocalCloud
from tests.helpers import api, wait_until
from tests.helpers.code import code_ref
from tests.helpers.jobs import E2E_FIXTURES, bucket, done_summary, latest_step, state_of

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("daemon_env")]


clock, cloud, daemon = E2E_FIXTURES


def gang_body(name: str, ckpt: Path, steps: int, **extra: Any) -> dict[str, Any]:
    body = {
        "name": name,
        "policy": "local-eu",
        "nodes": 2,
        "code": code_ref(),  # examples/, shipped by e2e_daemon
        "run": (
            f"python train_multinode.py --steps {steps} --checkpoint-every 5 --step-sleep 0.05"
        ),
        "checkpoint": bucket(ckpt),
        "probes": "none",
    }
    body.update(extra)
    return body


def running_nodes(cloud: LocalCloud, job_id: int, number: int) -> list[str] | None:
    """The instance ids of gang `number`'s two nodes once both run, rank order."""
    keys = [f"{job_id}-{number}", f"{job_id}-{number}-n1"]
    found = {r.key: r.id for r in cloud.instances() if r.state == "running" and r.key in keys}
    return [found[k] for k in keys] if len(found) == 2 else None


def test_an_interrupted_node_stops_the_gang_which_is_replaced_and_resumes(
    tmp_path: Path, daemon: Daemon, cloud: LocalCloud
) -> None:
    ckpt = tmp_path / "ckpt"
    with api(daemon) as client:
        body = gang_body("pair", ckpt, steps=40)
        assert client.post("/jobs", json=body).status_code == 201
    job_id = state_of(daemon, "pair")["id"]
    first = wait_until(lambda: running_nodes(cloud, job_id, 1), 60, "both nodes of attempt 1")
    wait_until(lambda: state_of(daemon, "pair")["state"] == "running", 120, "the job to start")
    attempts = daemon.store.jobs.attempts(job_id)
    assert [a.node_rank for a in attempts] == [0, 1]
    wait_until(lambda: latest_step(ckpt) >= 10, 90, "a checkpoint past step 10 in the bucket")

    cloud.interrupt(first[1])  # only node 1's instance is taken back
    wait_until(lambda: running_nodes(cloud, job_id, 3), 90, "both nodes of the replacement")
    wait_until(lambda: state_of(daemon, "pair")["state"] == "succeeded", 120, "the job to end")

    done = done_summary(ckpt)
    assert (done["steps"], done["nodes"]) == (40, 2)
    runs = done["runs"]
    assert [r["attempt"] for r in runs] == ["1", "3"]
    for before, after in itertools.pairwise(runs):
        assert after["from_step"] == before["to_step"] > 0  # every step done once
    rows = daemon.store.jobs.attempts(job_id)
    assert [(a.gang, a.node_rank) for a in rows] == [(1, 0), (1, 1), (3, 0), (3, 1)]
    assert {a.end_reason for a in rows[:2]} == {"preempted"}
    shown = state_of(daemon, "pair")["attempts"]
    assert [(a["gang"], a["node_rank"], a["nodes"]) for a in shown] == [
        (1, 0, 2),
        (1, 1, 2),
        (3, 0, 2),
        (3, 1, 2),
    ]
    wait_until(
        lambda: all(r.state == "terminated" for r in cloud.instances()), 30, "every instance gone"
    )
    events = daemon.store.events.list_events(kind=EventKind.JOB_INTERRUPTED, job_id=job_id)
    assert [(e.data or {}).get("attempt") for e in events] == [1]
    assert (events[0].data or {}).get("nodes") == 2


def test_a_gang_one_node_of_which_fails_to_launch_is_torn_down_and_launched_elsewhere(
    tmp_path: Path, daemon: Daemon, cloud: LocalCloud
) -> None:
    cloud.fail_next("*", "capacity", times=1, after=1)  # the first gang's second node
    ckpt = tmp_path / "ckpt"
    with api(daemon) as client:
        assert client.post("/jobs", json=gang_body("half", ckpt, steps=10)).status_code == 201
    job_id = state_of(daemon, "half")["id"]
    wait_until(lambda: state_of(daemon, "half")["state"] == "succeeded", 90, "the job to end")

    rows = daemon.store.jobs.attempts(job_id)
    assert [(a.number, a.node_rank, a.end_reason) for a in rows[:2]] == [
        (1, 0, "gang_incomplete"),
        (2, 1, "capacity"),
    ]
    assert rows[0].instance_id is not None and rows[1].instance_id is None
    assert rows[2].pool != rows[0].pool  # the pool without capacity was cooled down
    assert [a.exit_code for a in rows[2:]] == [0, 0]
    wait_until(
        lambda: all(r.state == "terminated" for r in cloud.instances()), 30, "no instance left"
    )
    assert len(cloud.instances()) == 3  # the torn-down node and the two that ran
