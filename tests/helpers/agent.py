"""For the agent tests: a fake daemon that speaks the agent protocol (FastAPI under uvicorn on
an ephemeral port), a job script that counts steps and checkpoints, and for the agent as a
process on the local cloud the fixtures `cloud` and `daemon` (`cloud, daemon = AGENT_FIXTURES`)
and `launch_on`."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Header, Request
from fastapi.responses import JSONResponse

from optimizer.model import Market
from providers.base import InstanceRef, LaunchSpec
from providers.local import LocalCloud
from tests.helpers.cloud import local_cloud
from tests.helpers.waiting import wait_until

FAST = {
    "GPUOPT_AGENT_POLL_S": "0.2",  # the protocol's 0.5 s, shortened for tests
    "GPUOPT_AGENT_FLUSH_S": "20",
}
"""Agent settings for tests: a fast metadata poll, a short final flush."""

# A job that counts to TOTAL, saving its step every 5 steps and on SIGTERM (then exit 143).
COUNTER_JOB = """
import json, os, signal, sys, time
ckpt_dir = os.environ["GPUOPT_CHECKPOINT_DIR"]
path = os.path.join(ckpt_dir, "state.json")
total = int(os.environ.get("TOTAL", "40"))
pause = float(os.environ.get("STEP_S", "0.02"))
step = json.load(open(path))["step"] if os.path.exists(path) else 0
stopping = False

def on_term(signum, frame):
    global stopping
    stopping = True

def save(n):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"step": n}, f)
    os.replace(tmp, path)

signal.signal(signal.SIGTERM, on_term)
print("start", step, os.environ["GPUOPT_ATTEMPT"], os.environ["GPUOPT_RESTARTS"],
      os.environ.get("GPUOPT_AGENT_TOKEN", "no-token"), os.environ.get("GREETING"), flush=True)
while step < total:
    time.sleep(pause)
    step += 1
    if stopping or step % 5 == 0:
        save(step)
    if stopping:
        print("checkpointed", step, flush=True)
        sys.exit(143)
print("done", step, flush=True)
"""


def counter_job(tmp_path: Path) -> str:
    """The `run` command of the counting job (its script written under tmp_path)."""
    script = tmp_path / "counter.py"
    script.write_text(COUNTER_JOB)
    return f"{sys.executable} {script}"


class FakeDaemon:
    """The daemon side of docs/agent-protocol.md, recording everything, steerable by tests."""

    def __init__(self) -> None:
        self.attempts: dict[str, dict[str, Any]] = {}  # key -> {"token", "answer"}
        self.registrations: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []  # every distinct event, in arrival order
        self.posts = 0
        self.commands: dict[str, list[dict[str, Any]]] = {}
        self.fail_register = 0  # answer 503 to this many registrations
        self.fail_events = 0  # answer 503 to this many event posts
        self.fail_logs = 0  # answer 503 to this many log posts
        self.logs: dict[str, dict[int, dict[str, Any]]] = {}  # key -> seq -> chunk, stored once
        self.log_posts = 0
        self.log_conflicts: list[tuple[str, int]] = []  # a seq sent again with other text
        self.down = False  # answer 503 to everything
        self.react: Callable[[str, dict[str, Any]], None] | None = None
        self._lock = threading.Lock()
        self._server: Any = None
        self.url = ""

    # --- steering ----------------------------------------------------------------------

    def add_attempt(self, key: str, token: str, job: dict[str, Any], **answer: Any) -> None:
        body = {"job": job, "attempt": 1, "restarts": 0, "heartbeat_s": 0.5, **answer}
        self.attempts[key] = {"token": token, "answer": body}

    def command(self, key: str, command: dict[str, Any]) -> None:
        with self._lock:
            self.commands.setdefault(key, []).append(command)

    def stop_on_failed_probe(self) -> None:
        """From now on answer a failed probe as the daemon does: a stop command."""

        def react(key: str, event: dict[str, Any]) -> None:
            if event["kind"] == "probe_result" and event["data"]["status"] == "fail":
                self.command(key, {"kind": "stop", "reason": "probe failed"})

        self.react = react

    def kinds(self, key: str | None = None) -> list[str]:
        with self._lock:
            return [e["kind"] for e in self.events if key is None or e["attempt_key"] == key]

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.events if e["kind"] == kind]

    def output(self, key: str, stream: str | None = None) -> str:
        """The attempt's shipped output in seq order (one stream, or both)."""
        with self._lock:
            chunks = sorted(self.logs.get(key, {}).items())
        return "".join(c["text"] for _, c in chunks if stream is None or c["stream"] == stream)

    # --- the app -----------------------------------------------------------------------

    def app(self) -> Any:
        app = FastAPI()

        def authorized(key: str, authorization: str | None) -> bool:
            found = self.attempts.get(key)
            return found is not None and authorization == f"Bearer {found['token']}"

        @app.post("/agent/v1/register")
        async def register(request: Request, authorization: str | None = Header(None)) -> Any:
            body = await request.json()
            with self._lock:
                if self.down or self.fail_register > 0:
                    self.fail_register = max(self.fail_register - 1, 0)
                    return JSONResponse({"error": "unavailable"}, status_code=503)
            if not authorized(body.get("attempt_key", ""), authorization):
                return JSONResponse({"error": "unauthorized"}, status_code=401)
            with self._lock:
                self.registrations.append(body)
            return self.attempts[body["attempt_key"]]["answer"]

        @app.post("/agent/v1/events")
        async def events(request: Request, authorization: str | None = Header(None)) -> Any:
            body = await request.json()
            key = body.get("attempt_key", "")
            with self._lock:
                self.posts += 1
                if self.down or self.fail_events > 0:
                    self.fail_events = max(self.fail_events - 1, 0)
                    return JSONResponse({"error": "unavailable"}, status_code=503)
            if not authorized(key, authorization):
                return JSONResponse({"error": "unauthorized"}, status_code=401)
            fresh = []
            with self._lock:
                seen = {e["id"] for e in self.events}
                for event in body["events"]:
                    if event["id"] not in seen:
                        seen.add(event["id"])
                        stored = {**event, "attempt_key": key}
                        self.events.append(stored)
                        fresh.append(stored)
            for event in fresh:
                if self.react is not None:
                    self.react(key, event)
            with self._lock:
                commands = self.commands.pop(key, [])
            return {"ack": [e["id"] for e in body["events"]], "commands": commands}

        @app.post("/agent/v1/logs")
        async def logs(request: Request, authorization: str | None = Header(None)) -> Any:
            body = await request.json()
            key = body.get("attempt_key", "")
            with self._lock:
                self.log_posts += 1
                if self.down or self.fail_logs > 0:
                    self.fail_logs = max(self.fail_logs - 1, 0)
                    return JSONResponse({"error": "unavailable"}, status_code=503)
            if not authorized(key, authorization):
                return JSONResponse({"error": "unauthorized"}, status_code=401)
            with self._lock:
                held = self.logs.setdefault(key, {})
                for chunk in body["chunks"]:
                    seen = held.setdefault(chunk["seq"], chunk)
                    if seen["text"] != chunk["text"] or seen["stream"] != chunk["stream"]:
                        self.log_conflicts.append((key, chunk["seq"]))
            return {"ack": [c["seq"] for c in body["chunks"]]}

        return app

    def start(self) -> FakeDaemon:
        import uvicorn

        config = uvicorn.Config(
            self.app(), host="127.0.0.1", port=0, log_level="warning", lifespan="off"
        )
        self._server = uvicorn.Server(config)
        threading.Thread(target=self._server.run, name="fake-daemon", daemon=True).start()
        wait_until(lambda: self._server.started, what="the fake daemon to start")
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


# -- the agent as a process on the local cloud --------------------------------------------------


@pytest.fixture
def _cloud(tmp_path: Path) -> Iterator[LocalCloud]:
    with local_cloud(tmp_path / "cloud", grace_s=30, tick_s=0.05) as local:
        yield local


@pytest.fixture
def _daemon() -> Iterator[FakeDaemon]:
    fake = FakeDaemon().start()
    yield fake
    fake.stop()


AGENT_FIXTURES = (_cloud, _daemon)
"""`cloud` (a local cloud, 30 s interruption grace) and `daemon` (a started FakeDaemon), for a
module to bind under those names: pytest names a fixture after the module attribute."""


def launch_on(cloud: LocalCloud, script: str, key: str) -> InstanceRef:
    """A g5.xlarge spot instance in eu-west-1 on `cloud` that runs `script` first (job train,
    attempt 1, idempotency key `key`)."""
    offer = next(
        o
        for o in cloud.fetch_offers(["eu-west-1"])
        if o.market is Market.SPOT and o.instance_type == "g5.xlarge"
    )
    return cloud.launch(offer, LaunchSpec(job="train", attempt=1, bootstrap=script), key)
