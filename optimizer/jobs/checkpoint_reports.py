"""What the agents report of a job's checkpoints, turned into rows and daemon events.

The agent API hands each new report here (`record_reports`) after validating its data
(`protocol.EVENT_DATA`):

- `checkpoint_committed` -> a `checkpoint` row (the bucket's provider and region, the
  checkpoint's folder `<uri>/data/<name>`) and a `checkpoint.committed` event; a final one
  (written at the attempt's stop) lifts the replacement's fence (`fence.fence_for`);
- `checkpoint_restored` -> a `checkpoint_restore` row, from the bucket's provider and region
  to the attempt's, and a `checkpoint.restored` event;
- `checkpoint_pruned` -> the named checkpoints marked deleted;
- `checkpoint_failed` -> a `checkpoint.failed` warning (the agent tries again).

A job without a `checkpoint` bucket has nothing synced: its reports are kept as agent events
only. A row and its event are written in one transaction, once per attempt and name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from optimizer.clock import parse_utc
from optimizer.common.units import size_text
from optimizer.jobs.context import EventDrafter
from optimizer.jobs.gang import head_number
from optimizer.jobs.spec import CheckpointSpec, bucket_provider, job_spec
from optimizer.model import EventKind
from optimizer.protocol import MAX_ERROR_CHARS
from optimizer.store import JobRecord, Store
from optimizer.store.jobs import AttemptRecord

KINDS = frozenset(
    {"checkpoint_committed", "checkpoint_restored", "checkpoint_pruned", "checkpoint_failed"}
)
# An agent's clock may disagree with the daemon's; a report timed further ahead than this, or
# this long before its attempt began, takes the daemon's time instead (a gpuopt choice: NTP
# keeps clouds' clocks within a second).
MAX_CLOCK_AHEAD = timedelta(minutes=5)
RESTORE_PREFIX = "restore: "  # a `checkpoint_failed` error of the restore before the job


def checkpoint_uri(bucket: str, name: str) -> str:
    """Where a checkpoint's files are in the job's bucket (docs/checkpoints.md's layout)."""
    return f"{bucket.rstrip('/')}/data/{name}"


def record_reports(
    store: Store,
    emitter: EventDrafter,
    attempt: AttemptRecord,
    job: JobRecord,
    events: Iterable[Mapping[str, Any]],
    *,
    now: datetime,
) -> None:
    """Fold the attempt's new checkpoint reports (`events`: agent events with id, kind, at,
    data, already validated) into rows and daemon events."""
    mine = [e for e in events if e.get("kind") in KINDS]
    if not mine:
        return
    bucket = job_spec(job).checkpoint
    if bucket is None:
        return
    for event in mine:
        at = report_time(event, attempt, now)
        data = dict(event.get("data") or {})
        kind = event["kind"]
        if kind == "checkpoint_committed":
            _committed(store, emitter, attempt, job, bucket, data, at)
        elif kind == "checkpoint_restored":
            _restored(store, emitter, attempt, job, bucket, data, at)
        elif kind == "checkpoint_pruned":
            store.checkpoints.mark_deleted(job.id, data.get("names") or [], at)
        else:
            _failed(store, emitter, attempt, job, data, at)


def report_time(event: Mapping[str, Any], attempt: AttemptRecord, now: datetime) -> datetime:
    """The agent's time for a report (its `at`), where it is a zoned ISO time between the
    attempt's start and now (both give or take MAX_CLOCK_AHEAD); else now."""
    raw, earliest = event.get("at"), attempt.started_at - MAX_CLOCK_AHEAD
    if isinstance(raw, str):
        try:
            parsed = parse_utc(raw)
        except (ValueError, OverflowError):
            return now
        if parsed.tzinfo is not None and earliest <= parsed <= now + MAX_CLOCK_AHEAD:
            return parsed
    return now


def _number(attempt: AttemptRecord) -> int:
    return head_number(attempt.number, attempt.gang)


def _committed(
    store: Store,
    emitter: EventDrafter,
    attempt: AttemptRecord,
    job: JobRecord,
    bucket: CheckpointSpec,
    data: dict[str, Any],
    at: datetime,
) -> None:
    name, final = str(data["name"]), bool(data.get("final", False))
    size, seconds, mib_s = int(data["size_bytes"]), float(data["seconds"]), float(data["mib_s"])
    uri = checkpoint_uri(bucket.uri, name)
    step = data.get("step")
    event = emitter.draft(
        EventKind.CHECKPOINT_COMMITTED,
        f"job {job.given_name}: attempt {_number(attempt)} committed "
        f"{'its final ' if final else ''}checkpoint {name} ({size_text(size)} in {seconds:.1f} s, "
        f"{mib_s:.0f} MiB/s) to {uri}",
        policy=job.policy,
        job_id=job.id,
        data={
            "job": job.given_name,
            "attempt": _number(attempt),
            "name": name,
            "step": step,
            "size_bytes": size,
            "seconds": seconds,
            "mib_s": mib_s,
            "final": final,
            "uri": uri,
        },
    )
    store.checkpoints.add_checkpoint(
        job_id=job.id,
        attempt_id=attempt.id,
        name=name,
        step=step,
        size_bytes=size,
        files=int(data["files"]),
        uri=uri,
        provider=bucket_provider(bucket.uri),
        region=bucket.region,
        committed_at=at,
        upload_s=seconds,
        final=final,
        event=event,
    )


def _restored(
    store: Store,
    emitter: EventDrafter,
    attempt: AttemptRecord,
    job: JobRecord,
    bucket: CheckpointSpec,
    data: dict[str, Any],
    at: datetime,
) -> None:
    name = str(data["name"])
    size, fetched = int(data["size_bytes"]), int(data["fetched_bytes"])
    seconds, mib_s = float(data["seconds"]), float(data["mib_s"])
    source = (bucket_provider(bucket.uri), bucket.region)
    target = (attempt.provider, attempt.region)
    event = emitter.draft(
        EventKind.CHECKPOINT_RESTORED,
        f"job {job.given_name}: attempt {_number(attempt)} restored checkpoint {name} "
        f"({size_text(size)}, {size_text(fetched)} fetched, in {seconds:.1f} s) from "
        f"{source[0]}/{source[1] or 'unknown region'} to {target[0]}/{target[1]}",
        policy=job.policy,
        job_id=job.id,
        data={
            "job": job.given_name,
            "attempt": _number(attempt),
            "name": name,
            "step": data.get("step"),
            "size_bytes": size,
            "fetched_bytes": fetched,
            "reused_bytes": int(data["reused_bytes"]),
            "seconds": seconds,
            "mib_s": mib_s,
            "from_provider": source[0],
            "from_region": source[1],
            "to_provider": target[0],
            "to_region": target[1],
        },
    )
    store.checkpoints.add_restore(
        job_id=job.id,
        attempt_id=attempt.id,
        checkpoint_name=name,
        size_bytes=size,
        fetched_bytes=fetched,
        seconds=seconds,
        from_provider=source[0],
        from_region=source[1],
        to_provider=target[0],
        to_region=target[1],
        at=at,
        event=event,
    )


def _failed(
    store: Store,
    emitter: EventDrafter,
    attempt: AttemptRecord,
    job: JobRecord,
    data: dict[str, Any],
    at: datetime,
) -> None:
    name, error = str(data["name"]), str(data["error"])[:MAX_ERROR_CHARS]
    event = emitter.draft(
        EventKind.CHECKPOINT_FAILED,
        f"job {job.given_name}: attempt {_number(attempt)} {_failure(name, error)}",
        severity="warning",
        policy=job.policy,
        job_id=job.id,
        data={"job": job.given_name, "attempt": _number(attempt), "name": name, "error": error},
    )
    store.events.record_event(event, at=at)


def _failure(name: str, error: str) -> str:
    """What failed, as the agent reports it: the restore before the job (its error starts
    with `restore: `; a named checkpoint was skipped for an earlier one), an upload (the
    checkpoint named), or the bucket itself (no name: it could not be opened, listed or
    pruned)."""
    if error.startswith(RESTORE_PREFIX):
        why = error.removeprefix(RESTORE_PREFIX)
        if name:  # skipped for the one before it
            return f"could not restore checkpoint {name}, restoring an earlier one: {why}"
        return f"could not restore a checkpoint, the job starts without one: {why}"
    if name:
        return f"could not upload checkpoint {name}: {error}"
    return f"could not use its checkpoint bucket: {error}"


__all__ = ["KINDS", "MAX_CLOCK_AHEAD", "checkpoint_uri", "record_reports", "report_time"]
