"""Interruption watchers: AWS IMDSv2 and GCP metadata behind one small interface.

The AWS client follows aws-node-termination-handler's (`pkg/ec2metadata/ec2metadata.go`,
REFERENCE.md §1.7): a session token from `PUT /latest/api/token`, refreshed shortly before
its TTL runs out and at once on a 401; short timeouts; a few retries on transport errors
(jittered back-off from `optimizer.common.retry`); 404 means "no event"; every notice is
reported once, deduplicated by the SHA-256 of its payload. The GCP client hangs on
`instance/preempted?wait_for_change=true` with the last ETag, so no change is missed between
two calls (REFERENCE.md §2.5).

A watcher's `check()` never raises: a metadata endpoint that is down is a reason to try again,
not to stop the job. Errors are counted in `errors` and the last one kept in `last_error`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

import httpx

from optimizer.clock import machine_now, utc_text
from optimizer.common.retry import backoff_delay

log = logging.getLogger(__name__)

DEFAULT_METADATA_URL = "http://169.254.169.254"
TOKEN_TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
TOKEN_TTL_S = 3600  # as NTH asks for
TOKEN_REFRESH_S = 15  # refresh when this little is left (NTH)
HTTP_TIMEOUT_S = 2.0  # NTH's client timeout
# How often the AWS-shaped endpoint is polled. AWS recommends at least every 5 s and NTH polls
# every 2 s; gpuopt polls every 0.5 s: a notice waits 0.25 s on average before the daemon
# launches the replacement, not 1 s, for two loopback GETs to the link-local endpoint a poll
# (the local cloud serves the same shape; a 30 s notice has no second to spare).
AWS_POLL_S = 0.5
RETRY_BASE_S = 0.25  # transport retries: 0.125-0.25 s, then 0.25-0.5 s (optimizer.common.retry)
RETRY_CAP_S = 2.0
SPOT_PATH = "latest/meta-data/spot/instance-action"
REBALANCE_PATH = "latest/meta-data/events/recommendations/rebalance"
GCP_PREEMPTED_PATH = "computeMetadata/v1/instance/preempted"
GCP_WAIT_S = 60
MAX_PAYLOAD_CHARS = 2048


@dataclass(frozen=True, slots=True)
class Notice:
    """One interruption notice, in the protocol's `interruption_notice` terms."""

    source: str  # aws-imds-spot | aws-imds-rebalance | gcp-metadata-preempted | owned-file
    action: str  # terminate | stop | hibernate | rebalance | preempted
    time: str | None  # when the action happens (AWS) or the notice was issued
    payload_sha256: str
    payload: str

    def to_data(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "action": self.action,
            "time": self.time,
            "payload_sha256": self.payload_sha256,
            "payload": self.payload[:MAX_PAYLOAD_CHARS],
        }


class Watcher(Protocol):
    """What the agent needs from a metadata endpoint."""

    interval_s: float  # pause between two checks (0 where the check itself waits)
    errors: int

    def instance_id(self) -> str | None:
        """The instance's id as the cloud names it, or None when the endpoint cannot say."""
        ...

    def check(self) -> list[Notice]:
        """New notices since the last check, each only once; never raises."""
        ...


def _sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def _now_iso() -> str:
    # To the millisecond: GCP's power-off is 30 s after it, and the job's stop is timed from it.
    return utc_text(machine_now(), timespec="milliseconds")


class _Dedupe:
    def __init__(self) -> None:
        self.seen: set[str] = set()

    def fresh(self, digest: str) -> bool:
        if digest in self.seen:
            return False
        self.seen.add(digest)
        return True


class AwsImds:
    """IMDSv2 client and watcher (spot instance-action and rebalance recommendation)."""

    interval_s = AWS_POLL_S

    def __init__(
        self,
        base_url: str = DEFAULT_METADATA_URL,
        *,
        client: httpx.Client | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] = time.sleep,
        rng: Callable[[], float] = random.random,
        timeout_s: float = HTTP_TIMEOUT_S,
        tries: int = 3,
        interval_s: float = AWS_POLL_S,
    ) -> None:
        self.base = base_url.rstrip("/")
        self.client = client or httpx.Client(timeout=timeout_s)
        self.clock, self.sleep, self.rng = clock, sleep, rng
        self.tries = max(tries, 1)
        self.interval_s = interval_s
        self._token: str | None = None
        self._token_expires = 0.0
        self._v1 = False  # the token PUT failed: fall back to IMDSv1 GETs, as NTH does
        self._dedupe = _Dedupe()
        self.errors = 0
        self.last_error: str | None = None
        self.token_fetches = 0

    # --- the token ------------------------------------------------------------------

    def _fetch_token(self) -> str | None:
        self.token_fetches += 1
        response = self.client.put(
            f"{self.base}/latest/api/token", headers={TOKEN_TTL_HEADER: str(TOKEN_TTL_S)}
        )
        if response.status_code != 200:
            raise httpx.HTTPStatusError(
                f"token PUT answered {response.status_code}",
                request=response.request,
                response=response,
            )
        try:  # IMDS echoes the TTL it granted
            ttl = int(response.headers.get(TOKEN_TTL_HEADER, TOKEN_TTL_S))
        except ValueError:
            ttl = TOKEN_TTL_S
        self._token_expires = self.clock() + ttl
        return response.text.strip()

    def _headers(self) -> dict[str, str]:
        if self._v1:
            return {}
        if self._token is None or self.clock() >= self._token_expires - TOKEN_REFRESH_S:
            try:
                self._token = self._fetch_token()
            except httpx.HTTPStatusError as exc:
                if exc.response.status_code in (403, 404, 405):
                    log.warning("IMDSv2 token refused (%s); trying IMDSv1", exc)
                    self._v1 = True
                    return {}
                raise
        return {TOKEN_HEADER: self._token or ""}

    # --- requests -------------------------------------------------------------------

    def get(self, path: str) -> httpx.Response:
        """GET `path` (below the base URL) with the token: a 401 refreshes it and retries
        once; transport errors are retried with jittered back-off. Raises when all fail."""
        last: Exception | None = None
        for attempt in range(self.tries):
            if attempt:
                self.sleep(backoff_delay(attempt, base=RETRY_BASE_S, cap=RETRY_CAP_S, rng=self.rng))
            try:
                response = self.client.get(f"{self.base}/{path}", headers=self._headers())
                if response.status_code == 401 and not self._v1:
                    self._token = None  # expired or revoked: a new one, then once more
                    response = self.client.get(f"{self.base}/{path}", headers=self._headers())
                return response
            except httpx.HTTPError as exc:
                last = exc
        assert last is not None
        raise last

    def instance_id(self) -> str | None:
        try:
            response = self.get("latest/meta-data/instance-id")
        except httpx.HTTPError as exc:
            self._failed(exc)
            return None
        return response.text.strip() or None if response.status_code == 200 else None

    def check(self) -> list[Notice]:
        notices = []
        for path, parse in ((SPOT_PATH, _spot_notice), (REBALANCE_PATH, _rebalance_notice)):
            try:
                response = self.get(path)
            except httpx.HTTPError as exc:
                self._failed(exc)
                continue
            if response.status_code == 404:
                continue  # no event
            if response.status_code != 200:
                self._failed(RuntimeError(f"{path} answered {response.status_code}"))
                continue
            notice = parse(response.content)
            if self._dedupe.fresh(notice.payload_sha256):
                notices.append(notice)
        return notices

    def _failed(self, exc: Exception) -> None:
        self.errors += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        log.debug("IMDS: %s", self.last_error)


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _spot_notice(body: bytes) -> Notice:
    data = _json_object(body)
    return Notice(
        source="aws-imds-spot",
        action=str(data.get("action") or "unknown"),
        time=data.get("time"),
        payload_sha256=_sha256(body),
        payload=body.decode(errors="replace"),
    )


def _rebalance_notice(body: bytes) -> Notice:
    data = _json_object(body)
    return Notice(
        source="aws-imds-rebalance",
        action="rebalance",
        time=data.get("noticeTime"),
        payload_sha256=_sha256(body),
        payload=body.decode(errors="replace"),
    )


class GcpMetadata:
    """GCP metadata watcher: a hanging GET on `instance/preempted` that follows the ETag."""

    interval_s = 0.0

    def __init__(
        self,
        base_url: str = DEFAULT_METADATA_URL,
        *,
        client: httpx.Client | None = None,
        wait_s: int = GCP_WAIT_S,
        timeout_s: float = HTTP_TIMEOUT_S,
        now: Callable[[], str] = _now_iso,
    ) -> None:
        self.base = base_url.rstrip("/")
        self.wait_s = wait_s
        self.timeout_s = timeout_s
        self.client = client or httpx.Client(timeout=timeout_s)
        self.now = now
        self._etag: str | None = None
        self._dedupe = _Dedupe()
        self.errors = 0
        self.last_error: str | None = None
        # After an error, wait before asking again (the hanging GET is the usual pause).
        self.retry_s = 1.0
        self.interval_s = 0.0

    def _get(self, path: str, params: dict[str, str] | None = None, timeout: float | None = None):
        return self.client.get(
            f"{self.base}/{path}",
            params=params,
            headers={"Metadata-Flavor": "Google"},
            timeout=timeout or self.timeout_s,
        )

    def instance_id(self) -> str | None:
        for key in ("name", "id"):
            try:
                response = self._get(f"computeMetadata/v1/instance/{key}")
            except httpx.HTTPError as exc:
                self._failed(exc)
                return None
            if response.status_code == 200 and response.text.strip():
                return response.text.strip()
        return None

    def check(self) -> list[Notice]:
        params = {"wait_for_change": "true", "timeout_sec": str(self.wait_s)}
        if self._etag is not None:
            params["last_etag"] = self._etag
        else:  # the first call reads the current value, so a preemption already on is seen
            params = {}
        try:
            response = self._get(GCP_PREEMPTED_PATH, params, timeout=self.wait_s + 5.0)
        except httpx.HTTPError as exc:
            self._failed(exc)
            return []
        if response.status_code != 200:  # 503 while the host is in maintenance: ask again
            self._failed(RuntimeError(f"preempted answered {response.status_code}"))
            return []
        self.interval_s = 0.0
        self._etag = response.headers.get("ETag") or self._etag
        body = response.content
        if body.strip().upper() != b"TRUE" or not self._dedupe.fresh(_sha256(body)):
            return []
        return [
            Notice(
                source="gcp-metadata-preempted",
                action="preempted",
                time=self.now(),
                payload_sha256=_sha256(body),
                payload=body.decode(errors="replace"),
            )
        ]

    def _failed(self, exc: Exception) -> None:
        self.errors += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        self.interval_s = self.retry_s
        log.debug("GCP metadata: %s", self.last_error)


class OwnedFileError(ValueError):
    """An `owned-file` watcher URL that is not `file:///absolute/path`."""


def owned_file_path(url: str) -> Path:
    """The notice file a `file:///abs/path/notice.json` URL names; OwnedFileError otherwise."""
    parts = urlsplit(url)
    if parts.scheme != "file" or parts.netloc not in ("", "localhost"):
        raise OwnedFileError(f"{url!r} is not a file:///absolute/path URL")
    path = unquote(parts.path)
    if not path.startswith("/") or path.endswith("/"):
        raise OwnedFileError(f"{url!r} does not name a file by its absolute path")
    return Path(path)


class OwnedFile:
    """Watcher for a machine the team owns: no cloud tells it of its end, so the daemon
    writes `{"action": "terminate", "time": ..., "reason": "drain"}` into a local file over
    SSH when it drains the machine, and this watcher reads that file. A rewritten file (say,
    another time) is a new notice; the same content is reported once, as on AWS."""

    interval_s = AWS_POLL_S

    def __init__(self, base_url: str, *, interval_s: float = AWS_POLL_S) -> None:
        self.path = owned_file_path(base_url)
        self.interval_s = interval_s
        self._dedupe = _Dedupe()
        self.errors = 0
        self.last_error: str | None = None

    def instance_id(self) -> str | None:
        """The id the daemon gave this machine (GPUOPT_INSTANCE_ID); the file cannot say."""
        return os.environ.get("GPUOPT_INSTANCE_ID") or None

    def check(self) -> list[Notice]:
        try:
            body = self.path.read_bytes()
        except FileNotFoundError:
            return []  # no drain asked for
        except OSError as exc:
            self._failed(f"{self.path}: cannot read: {exc.strerror or exc}")
            return []
        try:
            data = json.loads(body)
        except ValueError as exc:
            self._failed(f"{self.path}: not JSON: {exc}")
            return []
        if not isinstance(data, dict) or not isinstance(data.get("action"), str):
            self._failed(f"{self.path}: expected a JSON object with a string 'action'")
            return []
        time_text = data.get("time")
        digest = _sha256(body)
        if not self._dedupe.fresh(digest):
            return []
        return [
            Notice(
                source="owned-file",
                action=data["action"],
                time=time_text if isinstance(time_text, str) else None,
                payload_sha256=digest,
                payload=body.decode(errors="replace"),
            )
        ]

    def _failed(self, message: str) -> None:
        self.errors += 1
        self.last_error = message
        log.debug("owned-file: %s", message)


# Metadata watcher kinds: the provider registry (providers/registry.py) names one per
# provider, and the bootstrap hands it to the agent as GPUOPT_METADATA_KIND.
WATCHERS: dict[str, Callable[[str, float], Watcher]] = {
    "aws-imds": lambda url, interval_s: AwsImds(url, interval_s=interval_s),  # also local
    "gcp-metadata": lambda url, interval_s: GcpMetadata(url),
    "owned-file": lambda url, interval_s: OwnedFile(url, interval_s=interval_s),  # over SSH
}


class UnknownWatcherKind(ValueError):
    """A metadata watcher kind this agent has no watcher for, or none at all."""


def check_watcher_kind(kind: str | None) -> str:
    """`kind` when this agent has a watcher of that kind; UnknownWatcherKind otherwise."""
    expected = f"expected one of {', '.join(WATCHERS)}"
    if not kind:
        raise UnknownWatcherKind(f"no metadata watcher kind given; {expected}")
    if kind not in WATCHERS:
        raise UnknownWatcherKind(f"unknown metadata watcher kind {kind!r}; {expected}")
    return kind


def make_watcher(kind: str, base_url: str, *, interval_s: float = AWS_POLL_S) -> Watcher:
    """The watcher of `kind` (`aws-imds`: IMDSv2 on AWS and the local cloud's endpoint;
    `gcp-metadata`: the GCP metadata server; `owned-file`: a notice file on an owned machine);
    UnknownWatcherKind for any other, OwnedFileError for an `owned-file` URL that is no file."""
    return WATCHERS[check_watcher_kind(kind)](base_url, interval_s)


def watch(
    watcher: Watcher,
    emit: Callable[[Notice], object],
    stop: threading.Event,
) -> None:
    """Check until `stop` is set, handing each new notice to `emit` at once."""
    while not stop.is_set():
        for notice in watcher.check():
            emit(notice)
        stop.wait(watcher.interval_s)
