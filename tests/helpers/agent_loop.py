"""Shared by the tests: moved from tests/test_agent_loop.py, which uses them too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from optimizer.agent import Notice
from optimizer.agent.reporter import DaemonError
from optimizer.protocol import Command, EventsAnswer
from tests.helpers.agent import counter_job


class ScriptedDaemon:
    """Stands in for DaemonClient: fails registrations and event posts while told to."""

    def __init__(self, answer: dict[str, Any], *, register_failures: int = 0) -> None:
        self.answer = answer
        self.register_failures = register_failures
        self.registrations = 0
        self.down = False
        self.events: list[Any] = []
        self.commands: list[dict[str, Any]] = []
        self.chunks: dict[int, dict[str, Any]] = {}  # seq -> chunk
        self.chunks_at_exit: int | None = None  # chunks held when job_exited arrived
        self.polls = 0  # empty batches (DaemonClient.poll)
        self.polled_commands: list[str] = []  # the kinds of the commands polls carried

    def register(self, body: dict[str, Any]) -> dict[str, Any]:
        self.registrations += 1
        if self.register_failures:
            self.register_failures -= 1
            raise DaemonError("503", retryable=True, status=503)
        return self.answer

    def send(self, events: list[Any]) -> tuple[list[str], list[Command]]:
        if self.down:
            raise DaemonError("connection refused", retryable=True)
        if any(e.kind == "job_exited" for e in events):
            self.chunks_at_exit = len(self.chunks)
        self.events += events
        commands, self.commands = self.commands, []
        return [e.id for e in events], [Command.model_validate(c) for c in commands]

    def poll(self) -> EventsAnswer:
        """An empty batch: the commands waiting, no fence (as DaemonClient.poll)."""
        if self.down:
            raise DaemonError("connection refused", retryable=True)
        self.polls += 1
        commands, self.commands = self.commands, []
        self.polled_commands += [c["kind"] for c in commands]
        return EventsAnswer(commands=[Command.model_validate(c) for c in commands])

    def send_logs(self, chunks: list[dict[str, Any]]) -> list[int]:
        if self.down:
            raise DaemonError("connection refused", retryable=True)
        for chunk in chunks:
            self.chunks.setdefault(chunk["seq"], chunk)
        return [c["seq"] for c in chunks]

    def output(self, stream: str) -> str:
        return "".join(c["text"] for _, c in sorted(self.chunks.items()) if c["stream"] == stream)

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events if e.kind != "heartbeat"]


class ScriptedWatcher:
    interval_s = 0.02
    errors = 0

    def __init__(self) -> None:
        self.notices: list[Notice] = []

    def instance_id(self) -> str:
        return "i-test"

    def check(self) -> list[Notice]:
        found, self.notices = self.notices, []
        return found


def job(tmp_path: Path, total: int, **extra: Any) -> dict[str, Any]:
    return {
        "job": {
            "name": "train",
            "run": counter_job(tmp_path),
            "env": {"TOTAL": str(total), "STEP_S": "0.01"},
            "checkpoint_dir": str(tmp_path / "ckpt"),
            "probes": "none",
            **extra,
        },
        "heartbeat_s": 0.05,
    }
