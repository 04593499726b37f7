"""Getting the agent's events to the daemon: an ordered queue and a sender with retries.

Events wait in `EventQueue` until the daemon acknowledges their ids. The queue is bounded and
saved to the agent's directory after every change, so an agent that restarts sends what the
last one could not. Heartbeats and progress reports are coalesced: while one waits unsent, a
newer one of its kind replaces it, so a long daemon outage does not fill the queue with them.
When the queue is full the oldest heartbeat goes first, then the oldest `gpu_telemetry`, and
only then the oldest other event.
`Reporter` sends in order, in batches, on a thread; transport errors and 5xx/401/404/408/429
answers are retried with jittered exponential back-off (`optimizer.common.retry`), other 4xx
answers drop the batch (it would never be taken).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from optimizer import protocol
from optimizer.clock import machine_now, utc_text
from optimizer.common.retry import Backoff
from optimizer.protocol import Command, EventsAnswer, LogsAnswer

log = logging.getLogger(__name__)

HEARTBEAT = "heartbeat"
GPU_TELEMETRY = "gpu_telemetry"
COALESCED = frozenset({HEARTBEAT, protocol.PROGRESS_EVENT})  # only the newest unsent is kept
RETRYABLE_STATUS = frozenset({401, 404, 408, 425, 429})
_A = TypeVar("_A", bound=BaseModel)
MAX_EVENTS = 1000
BATCH = protocol.EVENTS_BATCH


def now_iso() -> str:
    return utc_text(machine_now(), timespec="milliseconds")


@dataclass(frozen=True, slots=True)
class Event:
    kind: str
    data: dict[str, Any] = field(default_factory=dict)
    id: str = field(default_factory=lambda: str(uuid.uuid4()))
    at: str = field(default_factory=now_iso)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def message(self) -> protocol.AgentEvent:
        """The event as the protocol sends it."""
        return protocol.AgentEvent(id=self.id, kind=self.kind, at=self.at, data=self.data)


class EventQueue:
    """Events not yet acknowledged, oldest first; thread-safe; optionally saved to `path`."""

    def __init__(
        self, path: Path | None = None, *, attempt_key: str = "", max_events: int = MAX_EVENTS
    ) -> None:
        self.path = path
        self.attempt_key = attempt_key
        self.max_events = max_events
        self.dropped = 0
        self._events: list[Event] = []
        self._lock = threading.Lock()
        self.changed = threading.Event()  # set on every put
        self._load()

    def _load(self) -> None:
        if self.path is None or not self.path.exists():
            return
        try:
            saved = json.loads(self.path.read_text(encoding="utf-8"))
            if saved.get("attempt_key") != self.attempt_key:
                log.warning(
                    "ignoring saved events of another attempt (%s)", saved.get("attempt_key")
                )
                return
            self._events = [Event(**e) for e in saved.get("events", [])]
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            log.warning("could not read saved events from %s: %s", self.path, exc)

    def _save(self) -> None:
        if self.path is None:
            return
        body = {"attempt_key": self.attempt_key, "events": [e.to_json() for e in self._events]}
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            tmp.write_text(json.dumps(body), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as exc:  # a full disk must not stop the reports themselves
            log.warning("could not save events to %s: %s", self.path, exc)

    def put(self, kind: str, data: Mapping[str, Any] | None = None) -> Event:
        event = Event(kind, dict(data or {}))
        with self._lock:
            if kind in COALESCED:
                self._events = [e for e in self._events if e.kind != kind]
            self._events.append(event)
            while len(self._events) > self.max_events:
                # Drop the oldest heartbeat if any, else the oldest GPU telemetry (a lost
                # minute of readings matters less than a state change), else the oldest.
                index = next(
                    (
                        i
                        for kinds in ((HEARTBEAT,), (GPU_TELEMETRY,))
                        for i, e in enumerate(self._events)
                        if e.kind in kinds
                    ),
                    0,
                )
                gone = self._events.pop(index)
                self.dropped += 1
                log.warning("event queue full: dropped %s %s", gone.kind, gone.id)
            self._save()
        self.changed.set()
        return event

    def pending(self, limit: int = BATCH) -> list[Event]:
        with self._lock:
            return self._events[:limit]

    def ack(self, ids: Iterable[str]) -> int:
        done = set(ids)
        with self._lock:
            before = len(self._events)
            self._events = [e for e in self._events if e.id not in done]
            removed = before - len(self._events)
            if removed:
                self._save()
        return removed

    def has(self, kind: str) -> bool:
        with self._lock:
            return any(e.kind == kind for e in self._events)

    def __len__(self) -> int:
        with self._lock:
            return len(self._events)


class DaemonError(Exception):
    """A call to the daemon failed; `retryable` says whether trying again can help."""

    def __init__(self, message: str, *, retryable: bool, status: int | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.status = status


class DaemonClient:
    """The agent side of the protocol's calls (docs/agent-protocol.md)."""

    def __init__(
        self,
        base_url: str,
        token: str,
        attempt_key: str,
        *,
        client: httpx.Client | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self.base = base_url.rstrip("/")
        self.attempt_key = attempt_key
        self.client = client or httpx.Client(timeout=timeout_s)
        self._headers = {"Authorization": f"Bearer {token}"}

    def _post(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        try:
            response = self.client.post(f"{self.base}{path}", json=body, headers=self._headers)
        except httpx.HTTPError as exc:
            raise DaemonError(f"{path}: {type(exc).__name__}: {exc}", retryable=True) from exc
        status = response.status_code
        if status != 200:
            retryable = status >= 500 or status in RETRYABLE_STATUS
            raise DaemonError(f"{path} answered {status}", retryable=retryable, status=status)
        try:
            value = response.json()
        except ValueError as exc:
            raise DaemonError(f"{path}: answer is not JSON", retryable=True) from exc
        if not isinstance(value, dict):
            raise DaemonError(f"{path}: answer is not a JSON object", retryable=True)
        return value

    def download(self, url: str, dest: Path, *, timeout_s: float = 300.0) -> None:
        """GET `url` (a path is relative to the daemon's address) into the file `dest`,
        streamed; DaemonError as for the other calls (a 403 is not retried)."""
        full = url if "://" in url else f"{self.base}{url}"
        try:
            with (
                self.client.stream("GET", full, headers=self._headers, timeout=timeout_s) as got,
            ):
                status = got.status_code
                if status != 200:
                    got.read()
                    retryable = status >= 500 or status in RETRYABLE_STATUS
                    raise DaemonError(
                        f"{url} answered {status}: {_detail(got)}",
                        retryable=retryable,
                        status=status,
                    )
                with dest.open("wb") as out:
                    for chunk in got.iter_bytes(1 << 20):
                        out.write(chunk)
        except httpx.HTTPError as exc:
            raise DaemonError(f"{url}: {type(exc).__name__}: {exc}", retryable=True) from exc

    def register(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Register (`body`: a `protocol.Register` but the attempt key); the raw answer, which
        `Assignment.parse` reads."""
        return self._post(f"{protocol.PREFIX}/register", {"attempt_key": self.attempt_key, **body})

    def poll(self) -> EventsAnswer:
        """An empty batch: the daemon's answer (commands, fence) without reporting anything."""
        return self._answer(EventsAnswer, "/events", protocol.Events(attempt_key=self.attempt_key))

    def send(self, events: list[Event]) -> tuple[list[str], list[Command]]:
        """Post a batch: (the ids acknowledged, the commands that came back)."""
        body = protocol.Events(attempt_key=self.attempt_key, events=[e.message() for e in events])
        answer = self._answer(EventsAnswer, "/events", body)
        return answer.ack, answer.commands

    def send_logs(self, chunks: list[dict[str, Any]]) -> list[int]:
        """Post chunks of the job's output (`protocol.LogChunk`s); the seqs the daemon holds now."""
        body = protocol.Logs.model_validate({"attempt_key": self.attempt_key, "chunks": chunks})
        return self._answer(LogsAnswer, "/logs", body).ack

    def _answer(self, model: type[_A], call: str, body: BaseModel) -> _A:
        path = f"{protocol.PREFIX}{call}"
        try:
            return model.model_validate(self._post(path, body.model_dump(mode="json")))
        except ValidationError as exc:
            raise DaemonError(f"{path}: unexpected answer: {exc}", retryable=True) from exc


def _detail(response: httpx.Response) -> str:
    """A refusal's reason: the `detail` of its JSON, else its text, on one short line."""
    try:
        found = response.json().get("detail", response.text)
    except (ValueError, AttributeError):
        found = response.text
    return " ".join(str(found).split())[:300]


class Reporter:
    """Sends the queue's events on a thread; hands every command that comes back on."""

    def __init__(
        self,
        queue: EventQueue,
        client: DaemonClient,
        on_commands: Callable[[list[Command]], object],
        *,
        backoff: Backoff | None = None,
        batch: int = BATCH,
    ) -> None:
        self.queue = queue
        self.client = client
        self.on_commands = on_commands
        self.backoff = backoff or Backoff()
        self.batch = batch
        self.failures = 0
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._idle = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="agent-reporter", daemon=True)

    def start(self) -> Reporter:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.queue.changed.set()
        self._thread.join(timeout=15)

    def send_once(self) -> bool:
        """Try the oldest batch once; True when it went through (or there was none)."""
        events = self.queue.pending(self.batch)
        if not events:
            return True
        try:
            acked, commands = self.client.send(events)
        except DaemonError as exc:
            self.failures += 1
            self.last_error = str(exc)
            if exc.retryable:
                log.warning("sending %d event(s) failed, will retry: %s", len(events), exc)
                return False
            log.error(
                "the daemon refused %d event(s) for good, dropping them: %s", len(events), exc
            )
            self.queue.ack(e.id for e in events)
            return True
        if commands:
            self.on_commands(commands)
        if not self.queue.ack(acked):
            # A 200 that takes none of the batch: back off rather than resend in a tight loop.
            self.failures += 1
            self.last_error = "the daemon acknowledged none of the events sent"
            return False
        return True

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.queue.changed.clear()
            if self.send_once():
                self.backoff.reset()
                if len(self.queue) == 0:
                    with self._idle:
                        self._idle.notify_all()
                    self.queue.changed.wait(1.0)
            else:
                self._stop.wait(self.backoff.next())

    def flush(self, timeout: float) -> bool:
        """Wait until every queued event is acknowledged, at most `timeout` s; True if so."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while len(self.queue):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.queue.changed.set()  # wake the sender if it idles
                self._idle.wait(min(left, 0.2))
        return True
