"""Multi-node attempts (gangs): pure folds over the nodes of one attempt.

A job with `nodes: N > 1` places each attempt on N instances of one offer, launched together
(launch.py). Each node is an attempt row of its own (its instance, idempotency key, token and
agent reports); `gang` is the number of the rank-0 row and `node_rank` the node's place. The
state machine (machine.decide) sees the gang as one attempt: `fold` makes that view, so any
node's interruption, loss or failed probe ends the whole gang and the next one replaces it.

Before the job starts, every node waits at the fence (`gate`): until every node has
registered and passed its probes, then until the inter-node probe has passed; the agents learn
the rendezvous from the daemon (docs/agent-protocol.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from optimizer.jobs.machine import AttemptView

PASSED = ("pass", "warn")


def gang_key(job_id: int, number: int, rank: int) -> str:
    """The idempotency key of one node: rank 0 keeps the single-node form `<job>-<number>`."""
    return f"{job_id}-{number}" if rank == 0 else f"{job_id}-{number}-n{rank}"


def placement_name(job_id: int, gang: int) -> str:
    """The name of a gang's placement (AWS cluster placement group, GCP compact resource
    policy): the provider makes it with the first node, and gpuopt deletes it once the gang
    is over (placements.py)."""
    return f"gpuopt-{job_id}-{gang}"


@dataclass(frozen=True, slots=True)
class Node:
    """One node of a gang as the fence sees it."""

    rank: int
    registered: bool
    address: str | None  # host:port the node reported at registration
    probe_status: str | None
    internode_status: str | None


@dataclass(frozen=True, slots=True)
class Gate:
    """Why a gang's node must not start its job yet (`why` None: it may), and whether it is
    time to run the inter-node probe."""

    why: str | None
    run_internode: bool = False


def gate(nodes: Sequence[Node], *, probes: str) -> Gate:
    """The gang's fence: every node registered and probed, then the inter-node probe passed."""
    for node in sorted(nodes, key=lambda n: n.rank):
        if not node.registered or not node.address:
            return Gate(f"waiting for node {node.rank} of {len(nodes)} to register")
    if probes == "none":
        return Gate(None)
    for node in sorted(nodes, key=lambda n: n.rank):
        if node.probe_status not in PASSED:
            return Gate(f"waiting for node {node.rank}'s probe")
    if any(n.internode_status is None for n in nodes):
        return Gate("waiting for the inter-node probe", run_internode=True)
    if all(n.internode_status in PASSED for n in nodes):
        return Gate(None)
    return Gate("the inter-node probe failed")


def master(nodes: Sequence[Node]) -> tuple[str, int] | None:
    """Rank 0's (address, port), once it has registered."""
    first = next((n for n in nodes if n.rank == 0), None)
    if first is None or not first.address:
        return None
    host, _, port = first.address.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host, int(port)


def fold(
    nodes: Sequence[AttemptView],
    *,
    internode: Mapping[int, tuple[str | None, str | None]] | None = None,
) -> AttemptView:
    """The gang as one attempt for machine.decide (`nodes` in rank order, rank 0 first).

    Registered once every node is; probed once every node and the inter-node probe passed
    (a failure anywhere fails it, with its reason); started once any node's job started; the
    job's exit is the first failing exit of any node, else rank 0's once every node's job has
    exited; an interruption notice or a lost instance on any node is the gang's."""
    first = nodes[0]
    if len(nodes) == 1 and not internode:
        return first
    statuses = [n.probe_status for n in nodes]
    reason = ""
    inter = dict(internode or {})
    if "fail" in statuses:
        rank = statuses.index("fail")
        probe: str | None = "fail"
        reason = f"GPU probe failed on node {rank}"
    elif any(s == "fail" for s, _ in inter.values()):
        probe = "fail"
        reason = next(r or "inter-node probe failed" for s, r in inter.values() if s == "fail")
    elif (
        all(s in PASSED for s in statuses) and inter and all(s in PASSED for s, _ in inter.values())
    ):
        probe = "warn" if "warn" in statuses else "pass"
    else:
        probe = None
    # A failing exit anywhere is the job's; otherwise the job is over once every node's job
    # has exited (rank 0's code), so no node is cut short while it finishes.
    failing = next((n for n in nodes if n.exit_code not in (None, 0)), None)
    exit_code = failing.exit_code if failing is not None else None
    if exit_code is None and all(n.exit_code is not None for n in nodes):
        exit_code = first.exit_code
    if any(n.instance_gone and n.exit_code is None for n in nodes):
        exit_code = None  # a lost node: the others' jobs fail with it, which is no job failure
    notices = [n.interruption_notice_at for n in nodes if n.interruption_notice_at is not None]
    offs = [n.power_off_at for n in nodes if n.power_off_at is not None]
    return replace(
        first,
        registered=all(n.registered for n in nodes),
        probe_status=probe,
        probe_reason=reason,
        job_started=any(n.job_started for n in nodes),
        exit_code=exit_code,
        interruption_notice_at=min(notices) if notices else None,
        # A node whose job has exited may be gone (its agent ends with it on the local cloud):
        # only a node gone mid-job is a lost one.
        instance_gone=any(n.instance_gone and n.exit_code is None for n in nodes),
        preempted=any(n.preempted for n in nodes),
        stop_sent=all(n.stop_sent for n in nodes),
        power_off_at=min(offs) if offs else None,
        exit_phase=failing.exit_phase if failing is not None else None,
        exit_error=failing.exit_error if failing is not None else None,
    )


def head_number(number: int, gang: int | None) -> int:
    """The attempt number a row belongs to: its gang's, else its own."""
    return gang if gang is not None else number
