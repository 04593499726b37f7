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
from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from optimizer import protocol
from optimizer.api.state import ApiState, StateDep
from optimizer.clock import parse_utc
from optimizer.jobs.checkpoint_reports import KINDS as CHECKPOINT_REPORTS
from optimizer.jobs.checkpoint_reports import record_reports
from optimizer.jobs.fence import fence_for, gang_gate, gang_nodes
from optimizer.jobs.gang import head_number, master
from optimizer.jobs.progress import record_progress
from optimizer.jobs.spec import CodeRef, job_spec
from optimizer.lifecycle import AttemptEnd
from optimizer.protocol import (
    EVENT_DATA,
    PROGRESS_EVENT,
    AgentEvent,
    CheckpointRef,
    CodeArchive,
    Command,
    EventsAnswer,
    Gang,
    Internode,
    Job,
    LogsAnswer,
    RegisterAnswer,
    Wait,
)
from optimizer.store.jobs import AttemptRecord, token_sha256
from optimizer.store.logs import NewChunk
from providers import registry

router = APIRouter(prefix=protocol.PREFIX, tags=["agent"])

# How long after its attempt ended and its instance went a token still ships output: what the
# agent sent just before the end may arrive after the daemon saw it (a gpuopt choice).
TOKEN_GRACE = timedelta(minutes=2)


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


def token_attempt(state: ApiState, authorization: str | None) -> AttemptRecord:
    """The attempt whose agent token the header carries, for a request that names no
    attempt (a GET): 401 for none, 403 once the token has expired."""
    scheme, _, token = (authorization or "").partition(" ")
    found = None
    if scheme.lower() == "bearer" and token.strip():
        found = state.store.jobs.attempt_by_token(token_sha256(token.strip()))
    if found is None:
        raise HTTPException(
            401, detail="invalid agent token", headers={"WWW-Authenticate": "Bearer"}
        )
    return _authorized(state, found.key, authorization)


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


def _check_data(events: list[AgentEvent]) -> None:
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
    """Why the attempt's agent must wait before starting the job (None: it may start it),
    as the jobs layer decides it (optimizer/jobs/fence.py)."""
    return fence_for(state.store, state.emitter, attempt, now=state.clock())


def _rendezvous(state: ApiState, attempt: AttemptRecord) -> dict[str, Any]:
    """A gang node's answer fields: `gang` (its rank, the size and rank 0's address once
    known) and `internode` (run the inter-node probe now, once every node passed its own)."""
    if attempt.nodes <= 1 or attempt.ended:
        return {}
    every = state.store.jobs.attempts(attempt.job_id)
    nodes = gang_nodes(attempt, every)
    found = master(nodes)
    addr, port = found if found is not None else (None, None)
    block = Gang(rank=attempt.node_rank, nodes=attempt.nodes, master_addr=addr, master_port=port)
    out: dict[str, Any] = {"gang": block}
    if (
        found is not None
        and attempt.internode_status is None
        and gang_gate(state.store, attempt, every).run_internode
    ):
        out["internode"] = Internode(
            rank=attempt.node_rank,
            nodes=attempt.nodes,
            master_addr=found[0],
            master_port=found[1],
            expected_gbps=_expected_gbps(attempt),
            min_fraction=protocol.INTERNODE_MIN_FRACTION,
            timeout_s=protocol.INTERNODE_TIMEOUT_S,
        )
    return out


def _expected_gbps(attempt: AttemptRecord) -> float | None:
    """The fabric's line rate per instance (Gbit/s), None where unknown (the local cloud's
    processes share this host's loopback, which no fabric figure describes, and a provider
    no longer installed or declaring no hardware facts)."""
    if registry.on_host(attempt.provider):
        return None
    entry = registry.find(attempt.provider)
    if entry is None or entry.hardware is None:
        return None
    return entry.hardware.fabric(attempt.instance_type).gbps


def known_agent(state: ApiState, authorization: str | None) -> bool:
    """True when the header carries some attempt's agent token: checked before the body is
    read (the handler then checks it is the token of the attempt the body names)."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return False
    return state.store.jobs.attempt_by_token(token_sha256(token.strip())) is not None


def _commands(attempt: AttemptRecord) -> list[Command]:
    # An interrupted or migrated attempt's job keeps running until the daemon stops it (a hot
    # handover).
    handing_over = (
        attempt.end_reason == AttemptEnd.PREEMPTED and attempt.notice_at is not None
    ) or attempt.end_reason == AttemptEnd.MIGRATED
    if attempt.stop_sent_at is not None or (attempt.ended and not handing_over):
        reason = attempt.end_reason or "stop requested"
        return [protocol.stop(reason)]
    return []


@router.post("/register")
def register(
    body: protocol.Register,
    state: StateDep,
    authorization: Annotated[str | None, Header()] = None,
) -> RegisterAnswer:
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
    spec = job_spec(job)
    return RegisterAnswer(
        job=Job(
            name=job.name,
            run=spec.run,
            setup=spec.setup,
            workdir=spec.workdir,
            env=dict(spec.env),
            checkpoint_dir=spec.checkpoint_dir,
            probes=spec.probes,
            expected_gpus=spec.expected_gpus,
            checkpoint=(
                None
                if spec.checkpoint is None
                else CheckpointRef(uri=spec.checkpoint.uri, keep=spec.checkpoint.keep)
            ),
            code=_code(spec.code),
            standby=spec.standby,
            checkpoint_allowance_s=spec.checkpoint_allowance_s,
        ),
        attempt=head_number(attempt.number, attempt.gang),  # a gang's: rank 0's number
        restarts=job.restarts,
        heartbeat_s=protocol.HEARTBEAT_S,
        commands=_commands(attempt),
        fence=Wait.of(_fence(state, attempt)),
        **_rendezvous(state, state.store.jobs.attempt(attempt.key) or attempt),
        probe=_probe(state, attempt, spec.probes),
    )


def _probe(state: ApiState, attempt: AttemptRecord, spec_probes: str) -> str:
    """The probe this attempt runs: `handover` for a `quick` job once its instance type has a
    usable full result on its provider, measured on a GPU (on the local cloud, whose instances
    are all this host, any); else the spec's (docs/probes.md, The handover probe)."""
    probed = spec_probes == protocol.QUICK_PROBE and state.store.probes.probed_in_full(
        attempt.provider, attempt.instance_type, any_source=registry.on_host(attempt.provider)
    )
    return protocol.probe_to_run(spec_probes, probed)


def _code(ref: CodeRef | None) -> CodeArchive | None:
    """The code block of the answer: where the agent fetches the job's archive (a path
    relative to the daemon's address, the one the agent reaches it at)."""
    if ref is None:
        return None
    return CodeArchive(sha256=ref.sha256, size=ref.size, url=f"/agent/code/{ref.sha256}")


@router.post("/events")
def events(
    body: protocol.Events,
    state: StateDep,
    authorization: Annotated[str | None, Header()] = None,
) -> EventsAnswer:
    attempt = _authorized(state, body.attempt_key, authorization)
    _check_data(body.events)
    payload = [e.model_dump() for e in body.events]
    folded = CHECKPOINT_REPORTS | {PROGRESS_EVENT}
    reports = list({e["id"]: e for e in payload if e["kind"] in folded}.values())
    if reports:  # the reports not seen before become rows (after the events)
        seen = state.store.jobs.seen_agent_events(e["id"] for e in reports)
        reports = [e for e in reports if e["id"] not in seen]
    now = state.clock()
    acked = state.store.jobs.record_agent_events(
        attempt.key, payload, now, on_host=registry.on_host(attempt.provider)
    )
    job = state.store.jobs.get_job_by_id(attempt.job_id) if reports else None
    if job is not None:
        record_reports(state.store, state.emitter, attempt, job, reports, now=now)
        record_progress(state.store, attempt, reports, now=now)
    if any(e.kind not in ("heartbeat", PROGRESS_EVENT) for e in body.events):
        state.wakeup.set()
    after = state.store.jobs.attempt(attempt.key) or attempt
    return EventsAnswer(
        ack=acked,
        commands=_commands(after),
        fence=Wait.of(_fence(state, after)),
        **_rendezvous(state, after),
    )


@router.post("/logs")
def logs(
    body: protocol.Logs,
    state: StateDep,
    authorization: Annotated[str | None, Header()] = None,
) -> LogsAnswer:
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
    return LogsAnswer(ack=done.acked)


def _chunk_time(raw: str | None) -> datetime | None:
    """The agent's time for a chunk, when it is an ISO time with a zone; else None (the
    store uses the time it arrived)."""
    if raw is None:
        return None
    try:
        parsed = parse_utc(raw)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None
