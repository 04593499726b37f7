"""The rendezvous over /agent/v1: two nodes of one gang register with their addresses, wait
at the fence until both probed, are asked to run the inter-node probe together, and learn
rank 0's address; a failed inter-node probe keeps the fence and names the pair."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from optimizer.daemon.service import Daemon
from optimizer.store.jobs import token_sha256
from tests.helpers import make_offer
from tests.helpers.daemon import make_config, running
from tests.helpers.offers import T0

pytestmark = pytest.mark.usefixtures("daemon_env")


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    with running(make_config(tmp_path)) as d:
        yield d


def gang(daemon: Daemon, probes: str = "quick") -> list[tuple[str, str]]:
    """A job with a two-node attempt (gang 1): [(key, token)] in rank order."""
    spec = {"name": "pair", "run": "train", "checkpoint_dir": "/c", "probes": probes, "nodes": 2}
    job = daemon.store.jobs.add_job("pair", "p", spec, at=T0)
    offer = make_offer(provider="aws", instance_type="p5.48xlarge")
    out = []
    for rank in (0, 1):
        key = f"{job}-1" if rank == 0 else f"{job}-1-n1"
        token = f"token-{rank}"
        daemon.store.jobs.create_attempt(
            job, 1 + rank, key, offer, token_sha256(token), T0, gang=1, node_rank=rank, nodes=2
        )
        out.append((key, token))
    return out


def call(daemon: Daemon, node: tuple[str, str], path: str, **body: Any) -> dict[str, Any]:
    key, token = node
    with httpx.Client(base_url=daemon.url, timeout=10) as client:
        answer = client.post(
            f"/agent/v1/{path}",
            json={"attempt_key": key, **body},
            headers={"Authorization": f"Bearer {token}"},
        )
    assert answer.status_code == 200, answer.text
    return answer.json()


def report(daemon: Daemon, node: tuple[str, str], kind: str, **data: Any) -> dict[str, Any]:
    event = {"id": f"{node[0]}-{kind}", "kind": kind, "data": data}
    return call(daemon, node, "events", events=[event])


def test_nodes_meet_through_the_daemon_and_start_after_the_inter_node_probe(
    daemon: Daemon,
) -> None:
    first, second = gang(daemon)
    answer = call(daemon, first, "register", instance_id="i-0", address="10.0.0.1:29500")
    assert answer["fence"] == "waiting for node 1 of 2 to register"
    assert answer["gang"] == {
        "rank": 0,
        "nodes": 2,
        "master_addr": "10.0.0.1",
        "master_port": 29500,
    }
    answer = call(daemon, second, "register", instance_id="i-1", address="10.0.0.2:29500")
    assert answer["fence"] == "waiting for node 0's probe"
    assert answer["gang"]["rank"] == 1 and answer["gang"]["master_addr"] == "10.0.0.1"
    assert "internode" not in answer

    report(daemon, first, "probe_result", status="pass")
    answer = report(daemon, second, "probe_result", status="pass")
    assert answer["fence"] == "waiting for the inter-node probe"
    # p5.48xlarge: EFA, 3,200 Gbit/s per instance, judged at a quarter of it
    assert answer["internode"] == {
        "rank": 1,
        "nodes": 2,
        "master_addr": "10.0.0.1",
        "master_port": 29500,
        "expected_gbps": 3200.0,
        "min_fraction": 0.25,
        "timeout_s": 120,
    }
    answer = report(daemon, first, "internode_probe", status="pass", reason="ok")
    assert "internode" not in answer and answer["fence"] == "waiting for the inter-node probe"
    answer = report(daemon, second, "internode_probe", status="pass", reason="ok")
    assert answer["fence"] is None and "internode" not in answer


def test_a_failed_inter_node_probe_keeps_the_fence_and_names_the_pair(daemon: Daemon) -> None:
    nodes = gang(daemon)
    for rank, node in enumerate(nodes):
        call(daemon, node, "register", address=f"10.0.0.{rank + 1}:29500")
        report(daemon, node, "probe_result", status="pass")
    why = "slow inter-node link between node 0 and node 1: 1.00 GB/s < 100.00 GB/s"
    for node in nodes:
        answer = report(daemon, node, "internode_probe", status="fail", reason=why)
    assert answer["fence"] == "the inter-node probe failed"
    stored = daemon.store.jobs.attempt(nodes[0][0])
    assert stored is not None and (stored.internode_status, stored.internode_reason) == (
        "fail",
        why,
    )


def test_without_probes_the_gang_starts_once_every_node_registered(daemon: Daemon) -> None:
    first, second = gang(daemon, probes="none")
    assert call(daemon, first, "register", address="127.0.0.1:4100")["fence"] is not None
    answer = call(daemon, second, "register", address="127.0.0.1:4200")
    assert answer["fence"] is None
    assert answer["gang"]["master_port"] == 4100 and "internode" not in answer


def raw(daemon: Daemon, node: tuple[str, str], path: str, **body: Any) -> str:
    key, token = node
    with httpx.Client(base_url=daemon.url, timeout=10) as client:
        answer = client.post(
            f"/agent/v1/{path}",
            json={"attempt_key": key, **body},
            headers={"Authorization": f"Bearer {token}"},
        )
    assert answer.status_code == 200, answer.text
    return answer.text


def test_the_answers_bytes_are_what_agents_have_always_read(daemon: Daemon) -> None:
    """The daemon builds its answers through the protocol's models: the JSON text, key order
    included, is the one it wrote when it built them by hand."""
    first, second = gang(daemon)
    registered = raw(daemon, first, "register", instance_id="i-0", address="10.0.0.1:29500")
    assert registered == (
        '{"job":{"name":"pair","run":"train","setup":null,"workdir":null,"env":{},'
        '"checkpoint_dir":"/c","probes":"quick","expected_gpus":null,'
        '"checkpoint_allowance_s":20.0},"attempt":1,'  # added last (older agents ignore it)
        '"restarts":0,"heartbeat_s":2,"commands":[],'
        '"fence":"waiting for node 1 of 2 to register",'
        '"gang":{"rank":0,"nodes":2,"master_addr":"10.0.0.1","master_port":29500},'
        '"probe":"quick"}'  # added last: the probe this node runs (older agents ignore it)
    )
    assert raw(daemon, second, "events", events=[]) == (
        '{"ack":[],"commands":[],"fence":"waiting for node 1 of 2 to register",'
        '"gang":{"rank":1,"nodes":2,"master_addr":"10.0.0.1","master_port":29500}}'
    )
    chunk = {"seq": 0, "stream": "stdout", "text": "hi\n"}
    assert raw(daemon, first, "logs", chunks=[chunk]) == '{"ack":[0]}'
