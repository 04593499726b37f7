"""One HTTP metadata endpoint for every local instance, shaped like AWS IMDSv2 and GCP's.

Each instance sees its own prefix, `http://127.0.0.1:PORT/<instance-id>`, handed to it as
`GPUOPT_METADATA_URL`; below it both shapes are served (REFERENCE.md §1.7, §2.5):

- AWS IMDSv2: `PUT /latest/api/token` with `X-aws-ec2-metadata-token-ttl-seconds: 1..21600`
  (a PUT carrying `X-Forwarded-For` is refused), then `GET /latest/meta-data/...` with
  `X-aws-ec2-metadata-token`; a missing, wrong or expired token gives 401 (IMDSv2 only, like
  amazon-ec2-metadata-mock `-I`). `spot/instance-action` and
  `events/recommendations/rebalance` answer 404 until the instance is interrupted.
- GCP: `GET /computeMetadata/v1/instance/...` with `Metadata-Flavor: Google` (403 without);
  `?wait_for_change=true&timeout_sec=N&last_etag=E` hangs until the value changes.

gpuopt's own `gpuopt/v1/telemetry` gives the simulated GPU readings injected for the instance
(`gpuopt local telemetry`; 404 while there are none): the agent reads them instead of NVML.

Answers are read from the state directory on every request, so an interruption written by
any process (`gpuopt local interrupt`) shows at once.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from optimizer.clock import utc_text
from providers.local.state import InstanceRecord, StateDir

TOKEN_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
MAX_TOKEN_TTL_S = 21600
GCP_DEFAULT_WAIT_S = 60.0
GCP_MAX_WAIT_S = 300.0
WAIT_POLL_S = 0.05
REQUEST_LOG = 1000


def iso(t: float, timespec: str = "seconds") -> str:
    return utc_text(datetime.fromtimestamp(t, UTC), timespec=timespec)


def aws_value(record: InstanceRecord, path: str) -> str | None:
    """The IMDS answer at `meta-data/<path>`, or None for 404."""
    notice = record.interruption
    if path == "spot/instance-action":
        if notice is None:
            return None
        # The power-off to the millisecond (AWS gives whole seconds): the agent and the
        # daemon time the old job's stop from it, and the checkpoint window's bench measures
        # against the instant the local cloud really powers the instance off.
        return json.dumps({"action": notice.action, "time": iso(notice.kill_at, "milliseconds")})
    if path == "spot/termination-time":
        return None if notice is None else iso(notice.kill_at, "milliseconds")
    if path == "events/recommendations/rebalance":
        return None if notice is None else json.dumps({"noticeTime": iso(notice.notice_at)})
    static = {
        "instance-id": record.id,
        "instance-type": record.instance_type,
        "instance-life-cycle": "spot" if record.market == "spot" else "on-demand",
        "placement/availability-zone": record.zone,
        "placement/region": record.region,
        "events/maintenance/scheduled": "[]",
    }
    return static.get(path)


def gcp_value(record: InstanceRecord, path: str) -> str | None:
    """The GCP metadata answer at `instance/<path>`, or None for 404."""
    spot = record.market == "spot"
    static = {
        "id": record.id.rsplit("-", 1)[-1],
        "name": record.id,
        "hostname": f"{record.id}.local",
        "zone": f"projects/0/zones/{record.zone}",
        "machine-type": f"projects/0/machineTypes/{record.instance_type}",
        "preempted": "TRUE" if record.interruption is not None else "FALSE",
        "scheduling/preemptible": "TRUE" if spot else "FALSE",
        "maintenance-event": "NONE",
    }
    return static.get(path)


def etag(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


class MetadataServer:
    """The endpoint, on a thread. `clock` (epoch seconds) ages the IMDSv2 tokens."""

    def __init__(
        self,
        state: StateDir,
        *,
        clock: Callable[[], float] = time.time,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.state = state
        self.clock = clock
        self._tokens: dict[str, tuple[str, float]] = {}  # token -> (instance, expires at)
        self._lock = threading.Lock()
        self.token_puts = 0
        # (method, path, status) of the latest requests, for tests and debugging.
        self.requests: deque[tuple[str, str, int]] = deque(maxlen=REQUEST_LOG)
        try:
            self._server = ThreadingHTTPServer((host, port), self._handler())
        except OSError:
            if port == 0:
                raise
            self._server = ThreadingHTTPServer((host, 0), self._handler())  # port taken
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="local-metadata", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def instance_url(self, instance_id: str) -> str:
        return f"{self.url}/{instance_id}"

    def start(self) -> MetadataServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def expire_tokens(self) -> None:
        """Forget every IMDSv2 token, as if their TTL ran out (the next GET gets 401)."""
        with self._lock:
            self._tokens.clear()

    # --- request handling ------------------------------------------------------------

    def _issue(self, instance_id: str, ttl: int) -> str:
        token = secrets.token_urlsafe(24)
        with self._lock:
            self._tokens[token] = (instance_id, self.clock() + ttl)
            self.token_puts += 1
        return token

    def _valid(self, instance_id: str, token: str | None) -> bool:
        with self._lock:
            found = self._tokens.get(token or "")
        return found is not None and found[0] == instance_id and found[1] > self.clock()

    def _record(self, method: str, path: str, status: int) -> None:
        with self._lock:
            self.requests.append((method, path, status))

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass  # quiet: tests and the daemon log what matters themselves

            def _send(self, status: int, body: str = "", headers: dict[str, str] | None = None):
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)
                server._record(self.command, urlsplit(self.path).path, status)

            def _split(self) -> tuple[str, str, dict[str, list[str]]]:
                parts = urlsplit(self.path)
                instance, _, rest = parts.path.lstrip("/").partition("/")
                return instance, rest, parse_qs(parts.query)

            def do_PUT(self) -> None:
                instance, rest, _ = self._split()
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                if rest != "latest/api/token" or server.state.load(instance) is None:
                    return self._send(404)
                if self.headers.get("X-Forwarded-For") is not None:
                    return self._send(403, "Forbidden")
                try:
                    ttl = int(self.headers.get(TOKEN_TTL_HEADER, ""))
                except ValueError:
                    ttl = 0
                if not 1 <= ttl <= MAX_TOKEN_TTL_S:
                    return self._send(400, "Missing or Invalid Parameters")
                token = server._issue(instance, ttl)
                self._send(200, token, {TOKEN_TTL_HEADER: str(ttl)})

            def do_GET(self) -> None:
                instance, rest, query = self._split()
                record = server.state.load(instance)
                if record is None:
                    return self._send(404)
                if rest.startswith("latest/meta-data/"):
                    if not server._valid(instance, self.headers.get(TOKEN_HEADER)):
                        return self._send(401, "Unauthorized")
                    value = aws_value(record, rest.removeprefix("latest/meta-data/"))
                    return self._send(404) if value is None else self._send(200, value)
                if rest == "gpuopt/v1/telemetry":  # simulated GPU readings (inject_telemetry)
                    injected = record.extra.get("telemetry")
                    if injected is None or record.ended:
                        return self._send(404)
                    return self._send(200, json.dumps(injected))
                if rest.startswith("computeMetadata/v1/instance/"):
                    if self.headers.get("Metadata-Flavor") != "Google":
                        return self._send(403, "Missing Metadata-Flavor:Google header.")
                    return self._gcp(
                        instance, rest.removeprefix("computeMetadata/v1/instance/"), query
                    )
                self._send(404)

            def _gcp(self, instance: str, path: str, query: dict[str, list[str]]) -> None:
                record = server.state.load(instance)
                value = None if record is None else gcp_value(record, path)
                if value is None:
                    return self._send(404)
                if query.get("wait_for_change", [""])[0].lower() == "true":
                    value = self._wait(instance, path, value, query)
                self._send(200, value, {"ETag": etag(value), "Metadata-Flavor": "Google"})

            def _wait(
                self, instance: str, path: str, value: str, query: dict[str, list[str]]
            ) -> str:
                """Hang until the value's ETag differs from last_etag (or from now's)."""
                last = query.get("last_etag", [etag(value)])[0]
                try:
                    wait = float(query.get("timeout_sec", [GCP_DEFAULT_WAIT_S])[0])
                except ValueError:
                    wait = GCP_DEFAULT_WAIT_S
                deadline = time.monotonic() + min(max(wait, 0.0), GCP_MAX_WAIT_S)
                while etag(value) == last and time.monotonic() < deadline:
                    time.sleep(WAIT_POLL_S)
                    record = server.state.load(instance)
                    if record is None or record.ended:
                        break  # nobody is left to answer
                    value = gcp_value(record, path) or value
                return value

        return Handler
