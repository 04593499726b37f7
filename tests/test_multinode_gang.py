"""Gangs as pure values: the fence every node waits at, the fold that makes a gang one
attempt for the state machine, the job's rendezvous environment, and the inter-node probe's
judgement (plus one real run of the probe across two processes over loopback)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from optimizer.agent.config import Assignment
from optimizer.jobs.gang import Node, fold, gang_key, gate, master
from optimizer.jobs.machine import AttemptView, JobView, Launch, Terminate, decide
from optimizer.lifecycle import JobState
from optimizer.model import EventKind
from optimizer.probes.internode import Link, bus_bandwidth, judge, ring_pairs

T0 = datetime(2026, 5, 4, 12, tzinfo=UTC)
POOL = ("local", "eu-central-1", "eu-central-1-a", "p5.48xlarge", "spot")


def node(rank: int, **kw: object) -> Node:
    values: dict[str, object] = {
        "rank": rank,
        "registered": True,
        "address": f"10.0.0.{rank + 1}:29500",
        "probe_status": "pass",
        "internode_status": "pass",
    }
    values.update(kw)
    return Node(**values)  # type: ignore[arg-type]


def test_the_fence_holds_until_every_node_probed_then_asks_for_the_internode_probe() -> None:
    assert gate([node(0), node(1, registered=False)], probes="quick").why == (
        "waiting for node 1 of 2 to register"
    )
    assert gate([node(0, probe_status=None), node(1)], probes="quick").why == (
        "waiting for node 0's probe"
    )
    asking = gate([node(0, internode_status=None), node(1, internode_status=None)], probes="quick")
    assert (asking.why, asking.run_internode) == ("waiting for the inter-node probe", True)
    assert gate([node(0), node(1, internode_status="fail")], probes="quick").why is not None
    assert gate([node(0), node(1)], probes="quick").why is None
    assert (
        gate([node(0, probe_status=None, internode_status=None), node(1)], probes="none").why
        is None
    )
    assert master([node(1), node(0)]) == ("10.0.0.1", 29500)
    assert (gang_key(7, 3, 0), gang_key(7, 3, 1)) == ("7-3", "7-3-n1")


def view(rank: int, **kw: object) -> AttemptView:
    base = AttemptView(
        number=3 + rank,
        key=gang_key(7, 3, rank),
        pool=POOL,  # type: ignore[arg-type]
        launched_at=T0,
        registered=True,
        probe_status="pass",
        job_started=True,
    )
    values = {name: getattr(base, name) for name in base.__slots__}
    values.update(kw)
    return AttemptView(**values)  # type: ignore[arg-type]


JOB = JobView(id=7, name="pair", state=JobState.RUNNING)


def test_one_nodes_interruption_ends_the_whole_gang() -> None:
    notice = T0 + timedelta(minutes=5)
    gang = fold([view(0), view(1, interruption_notice_at=notice)], internode={0: ("pass", None)})
    assert (gang.key, gang.interruption_notice_at) == ("7-3", notice)
    decision = decide(JOB, gang, now=notice)
    assert decision.state is JobState.PROVISIONING and decision.end_attempt == "preempted"
    assert any(isinstance(a, Launch) for a in decision.actions)  # the whole gang, anew


def test_a_lost_node_relaunches_the_gang_even_though_the_others_jobs_fail_with_it() -> None:
    gang = fold([view(0, exit_code=1), view(1, instance_gone=True)])
    assert gang.exit_code is None and gang.instance_gone
    decision = decide(JOB, gang, now=T0 + timedelta(minutes=1))
    assert decision.end_attempt == "lost" and decision.state is JobState.PROVISIONING
    # No terminate here: the reconciler stops the surviving nodes' jobs (SIGTERM) and ends
    # their instances once the jobs exited or the grace is over.
    assert not any(isinstance(a, Terminate) for a in decision.actions)
    assert any(isinstance(a, Launch) for a in decision.actions)


def test_a_failed_inter_node_probe_fails_the_attempt_naming_the_pair() -> None:
    why = "slow inter-node link between node 0 and node 1: 1.00 GB/s < 12.50 GB/s"
    gang = fold(
        [view(0, job_started=False), view(1, job_started=False)],
        internode={0: ("fail", why), 1: ("fail", why)},
    )
    decision = decide(JOB, gang, now=T0)
    assert decision.end_attempt == "probe_failed"
    alert = next(
        a for a in decision.actions if getattr(a, "kind", None) is EventKind.JOB_PROBE_FAILED
    )
    assert why in alert.message  # type: ignore[attr-defined]


def test_the_gang_finishes_once_every_node_exited_and_fails_with_any_nodes_failure() -> None:
    assert fold([view(0, exit_code=0), view(1, exit_code=0)]).exit_code == 0
    assert fold([view(0), view(1, exit_code=0)]).exit_code is None  # rank 0 still runs
    assert fold([view(0, exit_code=0), view(1)]).exit_code is None  # and so does rank 1
    assert fold([view(0), view(1, exit_code=3)]).exit_code == 3


def test_the_job_gets_the_rendezvous_in_gpuopt_torch_and_torchrun_names() -> None:
    answer = {
        "job": {"run": "train", "checkpoint_dir": "/c", "name": "pair"},
        "attempt": 3,
        "gang": {"rank": 1, "nodes": 2, "master_addr": "10.0.0.1", "master_port": 29500},
    }
    env = Assignment.parse(answer).protocol_env()
    assert {k: env[k] for k in ("GPUOPT_NODE_RANK", "GPUOPT_NUM_NODES", "GPUOPT_MASTER_ADDR")} == {
        "GPUOPT_NODE_RANK": "1",
        "GPUOPT_NUM_NODES": "2",
        "GPUOPT_MASTER_ADDR": "10.0.0.1",
    }
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["MASTER_PORT"]) == (
        "1",
        "2",
        "0",
        "29500",
    )
    assert (env["PET_NNODES"], env["PET_NODE_RANK"], env["PET_MASTER_ADDR"]) == (
        "2",
        "1",
        "10.0.0.1",
    )
    single = Assignment.parse({**answer, "gang": None}).protocol_env()
    assert "RANK" not in single and "GPUOPT_NODE_RANK" not in single


def test_the_probe_judges_bus_bandwidth_and_names_the_slow_or_broken_pair() -> None:
    assert ring_pairs(2) == [(0, 1)] and ring_pairs(3) == [(0, 1), (1, 2), (2, 0)]
    algbw, busbw = bus_bandwidth(8_000_000_000, 0.1, 4)
    assert (algbw, busbw) == (80.0, 120.0)  # nccl-tests: busbw = algbw x 2(n-1)/n
    links = [Link(0, 1, 40.0), Link(1, 2, 3.0), Link(2, 0, 45.0)]
    status, reason = judge(40.0, links, expected_gbps=400.0, min_fraction=0.25)
    assert status == "fail"
    assert reason.startswith("slow inter-node link between node 1 and node 2: 3.00 GB/s < 12.50")
    assert judge(40.0, links[:1], expected_gbps=400.0, min_fraction=0.25)[0] == "pass"
    broken = [Link(0, 1, None, "RuntimeError: connection refused")]
    assert judge(None, broken, expected_gbps=400.0, min_fraction=0.25) == (
        "fail",
        "inter-node link between node 0 and node 1 failed: RuntimeError: connection refused",
    )
    assert judge(1.0, links[:1], expected_gbps=None, min_fraction=0.25)[0] == "pass"
    assert judge(1.0, links[:1], expected_gbps=None, min_fraction=0.25, correct=False)[0] == "fail"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
def test_two_processes_meet_and_a_link_below_the_fabrics_figure_fails_naming_the_pair() -> None:
    port = str(_free_port())

    def start(rank: int) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [
                *(sys.executable, "-m", "optimizer.probes.internode", "--rank", str(rank)),
                *("--nodes", "2", "--master-addr", "127.0.0.1", "--master-port", port),
                *("--size-mib", "1", "--timeout-s", "60", "--expected-gbps", "1000000"),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )

    procs = [start(0), start(1)]
    results = [json.loads(p.communicate(timeout=120)[0].splitlines()[-1]) for p in procs]
    for result in results:
        assert (result["backend"], result["correct"], result["status"]) == ("gloo", True, "fail")
        assert result["busbw_gbs"] > 0
        assert result["reason"].startswith("slow inter-node link between node 0 and node 1: ")
    assert [p.returncode for p in procs] == [1, 1]


def test_a_node_that_never_checks_in_tears_the_whole_gang_down_and_relaunches() -> None:
    silent = fold([view(0, job_started=False), view(1, registered=False, job_started=False)])
    assert not silent.registered
    decision = decide(JOB, silent, now=T0 + timedelta(minutes=11))  # past the 10 min timeout
    assert decision.end_attempt == "not_registered"
    # The gang's key: the reconciler terminates every node's instance under it.
    assert any(isinstance(a, Terminate) and a.key == "7-3" for a in decision.actions)
    assert any(isinstance(a, Launch) for a in decision.actions)


def test_a_node_gone_after_its_job_exited_is_not_a_lost_node() -> None:
    finishing = fold([view(0, exit_code=0, instance_gone=True), view(1)])
    assert (finishing.exit_code, finishing.instance_gone) == (None, False)
    assert decide(JOB, finishing, now=T0).state is JobState.RUNNING
