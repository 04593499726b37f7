"""Queue mode: EC2 interruption events that EventBridge routes to an SQS queue.

Rule shape: `{"source": ["aws.ec2"], "detail-type": [the three below]}` → the queue
(REFERENCE.md §1.7; NTH `pkg/monitor/sqsevent/sqs-monitor.go`, Karpenter `pkg/providers/sqs`).
The instance comes from `detail.instance-id`: the warning's `resources` ARN may carry an AZ in
the region slot and no account (NTH#762). A queue consumer that is down loses events after
the queue's retention, so `describe` in the reconcile loop stays the source of truth.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC
from typing import Any

from optimizer.clock import parse_utc
from providers.base import InterruptionEvent, InterruptionKind

DETAIL_TYPES: dict[str, InterruptionKind] = {
    "EC2 Spot Instance Interruption Warning": "spot_interruption",
    "EC2 Instance Rebalance Recommendation": "rebalance",
    "EC2 Instance State-change Notification": "state_change",
}
# ReceiveMessage settings from NTH/Karpenter: 10 messages (the API maximum), a 20 s long poll
# (the maximum), and a visibility timeout long enough to record and delete.
MAX_MESSAGES = 10
WAIT_SECONDS = 20
VISIBILITY_TIMEOUT = 20
MAX_BATCHES = 10  # per poll, so a flooded queue cannot hold the caller forever


class UnreadableEvent(ValueError):
    """A queue message that is not one of the EC2 events above."""


def parse_event(body: str | dict[str, Any]) -> InterruptionEvent:
    """The InterruptionEvent in one EventBridge message body; UnreadableEvent otherwise."""
    try:
        event = json.loads(body) if isinstance(body, str) else body
    except json.JSONDecodeError as exc:
        raise UnreadableEvent(f"not JSON: {exc}") from None
    if not isinstance(event, dict):
        raise UnreadableEvent("not a JSON object")
    kind = DETAIL_TYPES.get(str(event.get("detail-type", "")))
    if kind is None:
        raise UnreadableEvent(f"unexpected detail-type {event.get('detail-type')!r}")
    detail = event.get("detail") or {}
    instance_id = detail.get("instance-id") if isinstance(detail, dict) else None
    if not instance_id:
        raise UnreadableEvent(f"{kind} event without detail.instance-id")
    raw_time = str(event.get("time") or "")
    try:
        at = parse_utc(raw_time)
    except ValueError:
        raise UnreadableEvent(f"bad time {raw_time!r}") from None
    at = at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)
    word = {"spot_interruption": "instance-action", "state_change": "state"}.get(kind)
    return InterruptionEvent(
        instance_id=str(instance_id),
        kind=kind,
        at=at,
        detail=str(detail.get(word) or "") if word else "",
        region=str(event.get("region") or ""),
    )


def poll_queue(
    sqs: Any,
    queue_url: str,
    *,
    wait_seconds: int = WAIT_SECONDS,
    record: Callable[[list[InterruptionEvent]], None] | None = None,
    problems: list[str] | None = None,
) -> list[InterruptionEvent]:
    """Receive, parse and delete a batch of events.

    Each batch is handed to `record` (when given) before its messages are deleted, so a
    crash while recording leaves them on the queue to come back after the visibility
    timeout. Unreadable messages are deleted at once and noted in `problems`.
    """
    events: list[InterruptionEvent] = []
    wait = wait_seconds
    for _ in range(MAX_BATCHES):
        reply = sqs.receive_message(
            QueueUrl=queue_url,
            MaxNumberOfMessages=MAX_MESSAGES,
            WaitTimeSeconds=wait,
            VisibilityTimeout=VISIBILITY_TIMEOUT,
        )
        messages: Sequence[dict[str, Any]] = reply.get("Messages", [])
        batch: list[InterruptionEvent] = []
        for message in messages:
            try:
                batch.append(parse_event(message.get("Body", "")))
            except UnreadableEvent as exc:
                if problems is not None:
                    problems.append(f"queue: dropped message {message.get('MessageId')}: {exc}")
        if record is not None and batch:
            record(batch)
        events.extend(batch)
        for part in range(0, len(messages), MAX_MESSAGES):
            entries = [
                {"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]}
                for n, m in enumerate(messages[part : part + MAX_MESSAGES])
            ]
            if entries:
                reply = sqs.delete_message_batch(QueueUrl=queue_url, Entries=entries)
                for failed in reply.get("Failed", []):
                    if problems is not None:
                        problems.append(f"queue: a message was not deleted: {failed.get('Code')}")
        if len(messages) < MAX_MESSAGES:
            break
        wait = 0  # drain what is already there without waiting again
    return events
