"""/agent/v1: what agents on managed instances report (docs/agent-protocol.md).

Agents authenticate with their attempt's per-instance token (only its SHA-256 is stored). A
token lives as long as its attempt may still run: once the attempt has ended and its instance
is gone it is refused (403), but by `/logs`, which takes the last chunks of output for
TOKEN_GRACE more. Handlers record facts and wake the reconcile loop; every decision is made
there. Commands ride on the answers: `stop` once the daemon has asked the attempt to stop or
it has ended. So does the fence: why the agent must not start the job yet (null once it may).
"""

from __future__ import annotations

import hmac
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, HTTPException
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from optimizer import hardware
from optimizer.api.state import ApiState, StateDep
from optimizer.jobs.gang import Gate, Node, gate, head_number, master
from optimizer.jobs.handover import FENCE_CLOCK_MARGIN, fence, lifted_on_clock
from optimizer.jobs.machine import MIGRATED, AttemptView
from optimizer.jobs.views import attempt_view, finished_keys, power_off_at
from optimizer.model import EventKind
from optimizer.store.jobs import AttemptRecord, token_sha256
from optimizer.store.logs import NewChunk
from providers import registry

router = APIRouter(prefix="/agent/v1", tags=["agent"])

HEARTBEAT_S = 2  # commands (stop) ride on answers: keep them prompt
STOP_GRACE_S = 30
MAX_EVENTS_PER_CALL = 500
MAX_CHUNKS_PER_CALL = 64
MAX_CHUNK_CHARS = 64 * 1024
# The inter-node probe: a link below this fraction of the fabric's line rate fails the attempt
# (a gpuopt choice, not a published figure: NCCL over a healthy fabric reaches well above it),
# and the probe's own time limit, rendezvous included.
INTERNODE_MIN_FRACTION = 0.25
INTERNODE_TIMEOUT_S = 120  # the agent cuts chunks of at most 64 KiB (optimizer/agent/logship.py)
# How long after its attempt ended and its instance went a token still ships output: what the
# agent sent just before the end may arrive after the daemon saw it (a gpuopt choice).
TOKEN_GRACE = timedelta(minutes=2)


class Register(BaseModel):
    model_config = ConfigDict(extra="ignore")

    attempt_key: str = Field(min_length=1, max_length=200)
    instance_id: str | None = None
    provider: str | None = None
    hostname: str | None = None
    agent_version: str | None = None
    # host:port where the other nodes of a multi-node attempt reach this one (its rendezvous
    # port, free when the agent registered).
    address: str | None = Field(None, max_length=300)


class AgentEventIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str = Field(min_length=1, max_length=100)
    kind: str = Field(min_length=1, max_length=50)
    at: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)


class JobExitedData(BaseModel):
    """A `job_exited` event's `data` (docs/agent-protocol.md): the exit status is folded into
    the attempt row, so it must be a number the store holds; other keys pass as they are."""

    model_config = ConfigDict(extra="allow")

    # The attempt row's exit_code is a 32-bit integer; the daemon stores 128 + signal.
    exit_code: StrictInt | None = Field(None, ge=-(2**31), le=2**31 - 1)
    signal: StrictInt | None = Field(None, ge=1, le=127)
    phase: str | None = Field(None, max_length=20)
    stopped: StrictBool | None = None
    adopted: StrictBool | None = None
    log_chunks: StrictInt | None = Field(None, ge=0, le=2**31 - 1)


# The data of the events whose fields the daemon folds into numbers, checked at the edge.
EVENT_DATA: dict[str, type[BaseModel]] = {"job_exited": JobExitedData}


class Events(BaseModel):
    model_config = ConfigDict(extra="ignore")

    attempt_key: str = Field(min_length=1, max_length=200)
    events: list[AgentEventIn] = Field(default_factory=list, max_length=MAX_EVENTS_PER_CALL)


class LogChunkIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    seq: int = Field(ge=0, le=2**31 - 1)
    stream: Literal["stdout", "stderr"]
    at: str | None = Field(None, max_length=64)
    text: str = Field(max_length=MAX_CHUNK_CHARS)


class Logs(BaseModel):
    model_config = ConfigDict(extra="ignore")

    attempt_key: str = Field(min_length=1, max_length=200)
    chunks: list[LogChunkIn] = Field(default_factory=list, max_length=MAX_CHUNKS_PER_CALL)


def _authorized(
    state: ApiState, key: str, authorization: str | None, *, output: bool = False
) -> AttemptRecord:
    """The attempt whose token this is; 401 for a missing or wrong token (same answer), 403
    once the token has expired (`expires_at`; `output`: for shipping the job's output, which
    a token may do for TOKEN_GRACE more)."""
    scheme, _, token = (authorization or "").partition(" ")
    attempt = state.store.jobs.attempt(key)
    presented = token_sha256(token.strip()) if scheme.lower() == "bearer" and token else ""
    if attempt is None or not hmac.compare_digest(presented, attempt.token_sha256 or "-"):
        raise HTTPException(
            401, detail="invalid agent token", headers={"WWW-Authenticate": "Bearer"}
        )
    expires = expires_at(attempt)
    if expires is not None and not (output and state.clock() <= expires + TOKEN_GRACE):
        detail = (
            f"attempt {attempt.key} has ended and its instance is gone: "
            "its agent token is no longer accepted"
        )
        if output:
            detail += f" (its last output was taken for {_span(TOKEN_GRACE)} after)"
        raise HTTPException(403, detail=detail)
    return attempt


def expires_at(attempt: AttemptRecord) -> datetime | None:
    """When an attempt's agent token stopped being accepted (None: it still is): once the
    attempt has ended and its instance is gone, at the later of the two times known (the
    provider's termination time, where it reported one)."""
    if attempt.ended_at is None or not attempt.instance_gone:
        return None
    if attempt.terminated_at is not None:
        return max(attempt.ended_at, attempt.terminated_at)
    return attempt.ended_at


def _span(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    return f"{seconds // 60} min" if seconds % 60 == 0 else f"{seconds} s"


def _check_data(events: list[AgentEventIn]) -> None:
    """422 naming the field for a known event whose data the daemon could not fold in."""
    errors: list[dict[str, Any]] = []
    for i, event in enumerate(events):
        model = EVENT_DATA.get(event.kind)
        if model is None:
            continue
        try:
            model.model_validate(event.data)
        except ValidationError as exc:
            errors.extend(
                {
                    "loc": ("body", "events", i, "data", *e["loc"]),
                    "msg": f"{event.kind}: {e['msg']}",
                    "type": e["type"],
                }
                for e in exc.errors()
            )
    if errors:
        raise RequestValidationError(errors)


def _fence(state: ApiState, attempt: AttemptRecord) -> str | None:
    """Why the attempt's agent must wait before starting the job (None: it may start it).

    The daemon lifts the fence once every earlier attempt's job has exited or its instance is
    seen gone (`machine.fence`), so two runs never overlap; the announced power-off lifts it
    only well after it has passed, with a `job.fence_lifted` event. It never lifts it for an
    attempt the daemon has ended before its job started (a cancel, or a job that finished on
    an earlier attempt meanwhile): the stop comes with the answers."""
    if attempt.job_started_at is not None:
        return None
    head = head_number(attempt.number, attempt.gang)
    if attempt.ended:
        return f"attempt {head} has ended ({attempt.end_reason or 'ended'})"
    every = state.store.jobs.attempts(attempt.job_id)
    before = [a for a in every if head_number(a.number, a.gang) < head]
    done = finished_keys(state.store, before)
    # Every earlier attempt whose job started: one still running holds the fence, and one that
    # started after an attempt whose job finished takes the job over (`machine.finished_on`).
    # A gang's nodes go by their rank 0's number.
    earlier = [a for a in before if a.key in done or a.job_started_at is not None]
    views = [
        replace(
            attempt_view(a, power_off_at=power_off_at(state.store, a), finished=a.key in done),
            number=head_number(a.number, a.gang),
        )
        for a in earlier
    ]
    now = state.clock()
    why = fence(views, now=now)
    if why is None:
        for old in lifted_on_clock(views, now=now):
            _record_clock_lift(state, attempt, old)
    if why is None and attempt.nodes > 1:
        why = _gang_gate(state, attempt, every).why
    return why


def _record_clock_lift(state: ApiState, attempt: AttemptRecord, old: AttemptView) -> None:
    """Record (once per earlier attempt) that the fence let the job start on the clock
    alone: nothing said that attempt's job had exited, so the runs may overlap."""
    job = state.store.jobs.get_job_by_id(attempt.job_id)
    name = job.given_name if job is not None else str(attempt.job_id)
    off = old.power_off_at.isoformat(timespec="seconds") if old.power_off_at else "?"
    margin = FENCE_CLOCK_MARGIN.total_seconds()
    dedupe = f"attempt:{old.key}:fence-lifted-on-clock"
    event = state.emitter.draft(
        EventKind.JOB_FENCE_LIFTED,
        f"job {name}: attempt {head_number(attempt.number, attempt.gang)} starts the job on the "
        f"clock: attempt {old.number}'s job never reported its exit and its instance was never "
        f"seen gone, {margin:.0f} s after the power-off announced for {off}",
        severity="warning",
        policy=job.policy if job is not None else None,
        job_id=attempt.job_id,
        data={
            "job": name,
            "attempt": head_number(attempt.number, attempt.gang),
            "earlier_attempt": old.number,
            "power_off_at": None if old.power_off_at is None else old.power_off_at.isoformat(),
            "margin_s": margin,
        },
        dedupe_key=dedupe,
    )
    state.store.events.record_once(
        event,
        since=old.power_off_at or state.clock(),
        same=lambda e: (
            (e.data or {}).get("earlier_attempt") == old.number and e.job_id == attempt.job_id
        ),
    )


def _gang_nodes(attempt: AttemptRecord, every: list[AttemptRecord]) -> list[Node]:
    return [
        Node(
            rank=a.node_rank,
            registered=a.registered_at is not None,
            address=a.address,
            probe_status=a.probe_status,
            internode_status=a.internode_status,
        )
        for a in every
        if a.gang == attempt.gang
    ]


def _gang_gate(state: ApiState, attempt: AttemptRecord, every: list[AttemptRecord]) -> Gate:
    job = state.store.jobs.get_job_by_id(attempt.job_id)
    probes = str((job.spec if job is not None else {}).get("probes", "quick"))
    return gate(_gang_nodes(attempt, every), probes=probes)


def _rendezvous(state: ApiState, attempt: AttemptRecord) -> dict[str, Any]:
    """A gang node's answer fields: `gang` (its rank, the size and rank 0's address once
    known) and `internode` (run the inter-node probe now, once every node passed its own)."""
    if attempt.nodes <= 1 or attempt.ended:
        return {}
    every = state.store.jobs.attempts(attempt.job_id)
    nodes = _gang_nodes(attempt, every)
    found = master(nodes)
    block: dict[str, Any] = {"rank": attempt.node_rank, "nodes": attempt.nodes}
    if found is not None:
        block.update(master_addr=found[0], master_port=found[1])
    out: dict[str, Any] = {"gang": block}
    if (
        found is not None
        and attempt.internode_status is None
        and _gang_gate(state, attempt, every).run_internode
    ):
        out["internode"] = {
            **block,
            "expected_gbps": _expected_gbps(attempt),
            "min_fraction": INTERNODE_MIN_FRACTION,
            "timeout_s": INTERNODE_TIMEOUT_S,
        }
    return out


def _expected_gbps(attempt: AttemptRecord) -> float | None:
    """The fabric's line rate per instance (Gbit/s), None where unknown (the local cloud's
    processes share this host's loopback, which no fabric figure describes)."""
    if _on_host(attempt.provider):
        return None
    return hardware.instance_fabric(attempt.provider, attempt.instance_type).gbps


def known_agent(state: ApiState, authorization: str | None) -> bool:
    """True when the header carries some attempt's agent token: checked before the body is
    read (the handler then checks it is the token of the attempt the body names)."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return False
    return state.store.jobs.attempt_by_token(token_sha256(token.strip())) is not None


def _commands(attempt: AttemptRecord) -> list[dict[str, Any]]:
    # An interrupted or migrated attempt's job keeps running until the daemon stops it (a hot
    # handover).
    handing_over = (
        attempt.end_reason == "preempted" and attempt.notice_at is not None
    ) or attempt.end_reason == MIGRATED
    if attempt.stop_sent_at is not None or (attempt.ended and not handing_over):
        reason = attempt.end_reason or "stop requested"
        return [{"kind": "stop", "reason": reason, "grace_s": STOP_GRACE_S}]
    return []


@router.post("/register")
def register(
    body: Register,
    state: StateDep,
    authorization: Annotated[str | None, Header()] = None,
) -> dict[str, Any]:
    attempt = _authorized(state, body.attempt_key, authorization)
    job = state.store.jobs.get_job_by_id(attempt.job_id)
    if job is None:
        raise HTTPException(404, detail="the attempt's job is gone")
    if job.removed_at is not None:  # its spec (and env) are not handed out again
        raise HTTPException(403, detail=f"attempt {attempt.key}'s job was removed")
    if attempt.registered_at is None:
        values: dict[str, Any] = {"registered_at": state.clock()}
        if body.instance_id and not attempt.instance_id:
            values["instance_id"] = body.instance_id
        if body.address and attempt.nodes > 1:
            values["address"] = body.address
        state.store.jobs.update_attempt(attempt.key, **values)
        state.wakeup.set()
    spec = job.spec
    return {
        "job": {
            "name": job.name,
            "run": spec["run"],
            "setup": spec.get("setup"),
            "workdir": spec.get("workdir"),
            "env": spec.get("env") or {},
            "checkpoint_dir": spec["checkpoint_dir"],
            "probes": spec.get("probes", "quick"),
            "expected_gpus": spec.get("expected_gpus"),
        },
        "attempt": head_number(attempt.number, attempt.gang),  # a gang's: rank 0's number
        "restarts": job.restarts,
        "heartbeat_s": HEARTBEAT_S,
        "commands": _commands(attempt),
        "fence": _fence(state, attempt),
        **_rendezvous(state, state.store.jobs.attempt(attempt.key) or attempt),
    }


def _on_host(provider: str) -> bool:
    """Whether the provider's instances run on this host (their probes measure the host)."""
    entry = registry.find(provider)
    return entry is not None and entry.capabilities.agent_on_host


@router.post("/events")
def events(
    body: Events,
    state: StateDep,
    authorization: Annotated[str | None, Header()] = None,
) -> dict[str, Any]:
    attempt = _authorized(state, body.attempt_key, authorization)
    _check_data(body.events)
    payload = [e.model_dump() for e in body.events]
    acked = state.store.jobs.record_agent_events(
        attempt.key, payload, state.clock(), on_host=_on_host(attempt.provider)
    )
    if any(e.kind != "heartbeat" for e in body.events):
        state.wakeup.set()
    after = state.store.jobs.attempt(attempt.key) or attempt
    return {
        "ack": acked,
        "commands": _commands(after),
        "fence": _fence(state, after),
        **_rendezvous(state, after),
    }


@router.post("/logs")
def logs(
    body: Logs,
    state: StateDep,
    authorization: Annotated[str | None, Header()] = None,
) -> dict[str, Any]:
    """Chunks of the job's output: stored once per (attempt, seq), under the per-job cap."""
    attempt = _authorized(state, body.attempt_key, authorization, output=True)
    chunks = [NewChunk(c.seq, c.stream, c.text, _chunk_time(c.at)) for c in body.chunks]
    done = state.store.logs.append(
        job_id=attempt.job_id,
        attempt_id=attempt.id,
        chunks=chunks,
        max_bytes_per_job=state.max_log_bytes_per_job,
        at=state.clock(),
    )
    if done.stored:
        state.log_changes.bump(attempt.job_id)
    return {"ack": done.acked}


def _chunk_time(raw: str | None) -> datetime | None:
    """The agent's time for a chunk, when it is an ISO time with a zone; else None (the
    store uses the time it arrived)."""
    if raw is None:
        return None
    try:
        parsed = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None
