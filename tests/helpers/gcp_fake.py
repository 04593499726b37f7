"""A local fake of the Compute Engine and Cloud Billing REST APIs, for tests, benches and demos.

It speaks the real wire format (paths, camelCase JSON, page tokens, Operation and error
bodies), so the real google-cloud clients talk to it with REST transport, an
`http://127.0.0.1:PORT` endpoint and anonymous credentials. It serves (`_ROUTES`) the
aggregated accelerator- and machine-type lists, instance insert/get/list/delete (requestId
deduplicated, `labels.KEY:*` filter), zone operations list/get/wait (`operationType="…"`
filter), regional resource policies insert/get/delete (a delete refused while a VM names the
policy) and the Cloud Billing SKU list, all paged like the real APIs.

Every request is recorded (`requests`); failures are injected with `fail_next` (an HTTP error
body) and `fail_next_insert` (a finished Operation carrying `error.errors[]`).
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from optimizer.clock import utc_now, utc_text

_BASE = "https://www.googleapis.com/compute/v1"
COMPUTE_SERVICE_ID = "6F81-5844-456A"  # Compute Engine in the billing catalog
_COMPUTE = r"/compute/v1/projects/(?P<project>[^/]+)"
_ZONE = _COMPUTE + r"/zones/(?P<zone>[^/]+)"
_ROUTES = [  # (method, full-path regex, handler)
    ("GET", _COMPUTE + r"/aggregated/acceleratorTypes", "_aggregated_accelerators"),
    ("GET", _COMPUTE + r"/aggregated/machineTypes", "_aggregated_machines"),
    ("GET", _ZONE + r"/instances", "_list_instances"),
    ("POST", _ZONE + r"/instances", "_insert"),
    ("GET", _ZONE + r"/instances/(?P<name>[^/]+)", "_get"),
    ("DELETE", _ZONE + r"/instances/(?P<name>[^/]+)", "_delete"),
    ("GET", _ZONE + r"/operations", "_list_operations"),
    ("GET", _ZONE + r"/operations/(?P<op>[^/]+)", "_operation"),
    ("POST", _ZONE + r"/operations/(?P<op>[^/]+)/wait", "_operation"),
    ("GET", r"/v1/services/(?P<service>[^/]+)/skus", "_skus"),
    ("POST", _COMPUTE + r"/regions/(?P<region>[^/]+)/resourcePolicies", "_insert_policy"),
    ("GET", _COMPUTE + r"/regions/(?P<region>[^/]+)/resourcePolicies/(?P<name>[^/]+)", "_policy"),
    (
        "DELETE",
        _COMPUTE + r"/regions/(?P<region>[^/]+)/resourcePolicies/(?P<name>[^/]+)",
        "_delete_policy",
    ),
]
_LABEL_FILTER = re.compile(r"labels\.([a-z0-9_-]+):\*")
_OPERATION_FILTER = re.compile(r'operationType\s*=\s*"([^"]+)"')


def error_body(status: int, message: str, reason: str, domain: str = "global") -> dict[str, Any]:
    """The JSON error body Google APIs return for an HTTP error."""
    return {
        "error": {
            "code": status,
            "message": message,
            "errors": [{"message": message, "domain": domain, "reason": reason}],
        }
    }


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    body: Any


@dataclass
class _Failure:
    method: str
    path: re.Pattern[str]
    status: int
    body: dict[str, Any]


FAKE_NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)


@dataclass
class FakeGcp:
    """State plus a threaded HTTP server on 127.0.0.1 (start it, or use it as a context)."""

    accelerator_types: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # by zone
    machine_types: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # by zone
    skus: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # by service id
    page_size: int = 500  # most items per aggregated-list page, whatever maxResults asks
    sku_page_size: int = 5000
    latency_s: float = 0.0  # added to every response (benches)
    hold_operations: bool = False  # inserts answer RUNNING; `…/wait` or a get finishes them
    # The time the fake stamps on operations: a fixed instant unless a test or `main` (a
    # server for people, on the wall clock) hands it a clock.
    clock: Callable[[], datetime] = field(default=lambda: FAKE_NOW)
    instances: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    operations: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # by zone
    requests: list[Recorded] = field(default_factory=list)
    resource_policies: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._lock = threading.RLock()
        self._ids = itertools.count(1000)
        self._by_request_id: dict[str, dict[str, Any]] = {}
        self._failures: list[_Failure] = []
        self._insert_errors: list[list[dict[str, Any]]] = []
        self._server: ThreadingHTTPServer | None = None

    @classmethod
    def from_recorded(cls, directory: str | Path, **kwargs: Any) -> FakeGcp:
        """A fake serving recorded responses: `accelerator_types.json` and `machine_types.json`
        (aggregatedList bodies) and `skus.json` (a ListSkus body for Compute Engine)."""
        folder = Path(directory)

        def by_zone(name: str, key: str) -> dict[str, list[dict[str, Any]]]:
            body = json.loads((folder / name).read_text(encoding="utf-8"))
            return {
                scope.removeprefix("zones/"): scoped[key]
                for scope, scoped in body.get("items", {}).items()
                if key in scoped  # scopes with only a NO_RESULTS_ON_PAGE warning
            }

        skus = json.loads((folder / "skus.json").read_text(encoding="utf-8"))["skus"]
        return cls(
            accelerator_types=by_zone("accelerator_types.json", "acceleratorTypes"),
            machine_types=by_zone("machine_types.json", "machineTypes"),
            skus={COMPUTE_SERVICE_ID: skus},
            **kwargs,
        )

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self, port: int = 0) -> FakeGcp:
        """Serve on 127.0.0.1:`port` (0: any free port) from a background thread."""
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                fake._handle(self, "GET")

            def do_POST(self) -> None:
                fake._handle(self, "POST")

            def do_DELETE(self) -> None:
                fake._handle(self, "DELETE")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        ).start()
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeGcp:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def url(self) -> str:
        assert self._server is not None, "start() the fake first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    # --- scripting ----------------------------------------------------------------------------

    def fail_next(self, method: str, path: str, status: int, body: dict[str, Any]) -> None:
        """The next request matching `method` and the `path` regex gets this error."""
        with self._lock:
            self._failures.append(_Failure(method, re.compile(path), status, body))

    def fail_next_insert(self, errors: list[dict[str, Any]]) -> None:
        """The next new insert finishes as an Operation with these `error.errors[]`."""
        with self._lock:
            self._insert_errors.append(errors)

    def preempt(self, zone: str, name: str, *, delete: bool = True) -> dict[str, Any]:
        """GCP takes a Spot VM back: a preempted operation; the VM deleted (or TERMINATED)."""
        with self._lock:
            instance = self.instances.get((zone, name))
            project = instance["_project"] if instance else "project"
            if delete:
                self.instances.pop((zone, name), None)
            elif instance is not None:
                instance["status"] = "TERMINATED"
                instance["lastStopTimestamp"] = self._now()
            op = self._operation_record(
                project, zone, name, "compute.instances.preempted", user="system"
            )
            op["statusMessage"] = "Instance was preempted."
            return op

    def calls(self, method: str | None = None, contains: str = "") -> list[Recorded]:
        with self._lock:
            return [
                r
                for r in self.requests
                if (method is None or r.method == method) and contains in r.path
            ]

    # --- plumbing -----------------------------------------------------------------------------

    def _handle(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        parts = urlsplit(handler.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        if self.latency_s:
            time.sleep(self.latency_s)
        with self._lock:
            self.requests.append(Recorded(method, parts.path, query, body))
            status, payload = self._dispatch(method, parts.path, query, body)
        data = json.dumps(payload).encode("utf-8")
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json; charset=UTF-8")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _dispatch(
        self, method: str, path: str, query: dict[str, str], body: Any
    ) -> tuple[int, dict[str, Any]]:
        for failure in self._failures:
            if failure.method == method and failure.path.search(path):
                self._failures.remove(failure)
                return failure.status, failure.body
        for route_method, pattern, handler_name in _ROUTES:
            match = re.fullmatch(pattern, path)
            if match and route_method == method:
                result: tuple[int, dict[str, Any]] = getattr(self, handler_name)(
                    query, body, **match.groupdict()
                )
                return result
        return 404, error_body(404, f"no such method: {method} {path}", "notFound")

    def _now(self) -> str:
        return utc_text(self.clock(), timespec="milliseconds")

    def _page(self, items: list[Any], query: dict[str, str], limit: int) -> tuple[list[Any], str]:
        asked = int(query.get("maxResults") or query.get("pageSize") or limit)
        size = max(1, min(asked, limit))
        start = int(query.get("pageToken") or 0)
        end = start + size
        return items[start:end], (str(end) if end < len(items) else "")

    def _aggregated(
        self, kind: str, key: str, by_zone: dict[str, list[dict[str, Any]]], query: dict[str, str]
    ) -> tuple[int, dict[str, Any]]:
        flat = [(zone, item) for zone in sorted(by_zone) for item in by_zone[zone]]
        page, token = self._page(flat, query, self.page_size)
        items: dict[str, dict[str, Any]] = {}
        for zone, item in page:
            items.setdefault(f"zones/{zone}", {key: []})[key].append(item)
        out: dict[str, Any] = {"kind": f"compute#{kind}AggregatedList", "items": items}
        if token:
            out["nextPageToken"] = token
        return 200, out

    def _aggregated_accelerators(self, query: dict[str, str], body: Any, project: str) -> Any:
        return self._aggregated(
            "acceleratorType", "acceleratorTypes", self.accelerator_types, query
        )

    def _aggregated_machines(self, query: dict[str, str], body: Any, project: str) -> Any:
        return self._aggregated("machineType", "machineTypes", self.machine_types, query)

    def _skus(self, query: dict[str, str], body: Any, service: str) -> Any:
        if service not in self.skus:
            return 404, error_body(404, f"Service services/{service} not found", "notFound")
        page, token = self._page(self.skus[service], query, self.sku_page_size)
        return 200, {"skus": page, "nextPageToken": token}

    def _operation_record(
        self,
        project: str,
        zone: str,
        target: str,
        kind: str,
        *,
        errors: list[dict[str, Any]] | None = None,
        user: str = "gpuopt@fake.iam.gserviceaccount.com",
    ) -> dict[str, Any]:
        number = next(self._ids)
        now = self._now()
        zone_link = f"{_BASE}/projects/{project}/zones/{zone}"
        op: dict[str, Any] = {
            "kind": "compute#operation",
            "id": str(number),
            "name": f"operation-{number}-fake",
            "zone": zone_link,
            "operationType": kind,
            "targetLink": f"{zone_link}/instances/{target}",
            "targetId": str(number + 1),
            "status": "DONE",
            "user": user,
            "progress": 100,
            "insertTime": now,
            "startTime": now,
            "endTime": now,
            "selfLink": f"{zone_link}/operations/operation-{number}-fake",
        }
        if errors:
            op["_errors"] = errors
        if self.hold_operations and kind == "insert":
            op["status"] = "RUNNING"
            op["progress"] = 0
            del op["endTime"]
        else:
            self._finish(op)
        self.operations.setdefault(zone, []).append(op)
        return op

    def _finish(self, op: dict[str, Any]) -> dict[str, Any]:
        op.update(status="DONE", progress=100, endTime=op.get("endTime") or self._now())
        errors = op.pop("_errors", None)
        if errors:
            op["error"] = {"errors": errors}
            op["httpErrorStatusCode"] = 503
            op["httpErrorMessage"] = "SERVICE UNAVAILABLE"
        return op

    def _insert(self, query: dict[str, str], body: Any, project: str, zone: str) -> Any:
        request_id = query.get("requestId")
        if request_id and request_id in self._by_request_id:
            # The API answers a repeated requestId with the first request's operation.
            return 200, self._public(self._by_request_id[request_id])
        name = body["name"]
        if (zone, name) in self.instances:
            where = f"projects/{project}/zones/{zone}/instances/{name}"
            return 409, error_body(409, f"The resource '{where}' already exists", "alreadyExists")
        errors = self._insert_errors.pop(0) if self._insert_errors else None
        op = self._operation_record(project, zone, name, "insert", errors=errors)
        if not errors:
            instance = dict(body)
            instance.update(
                {
                    "kind": "compute#instance",
                    "id": op["targetId"],
                    "status": "RUNNING",
                    "zone": op["zone"],
                    "selfLink": op["targetLink"],
                    "creationTimestamp": op["insertTime"],
                    "lastStartTimestamp": op["insertTime"],  # RUNNING at once, here
                    "_project": project,
                }
            )
            self.instances[(zone, name)] = instance
        if request_id:
            self._by_request_id[request_id] = op
        return 200, self._public(op)

    def _insert_policy(self, query: dict[str, str], body: Any, project: str, region: str) -> Any:
        """resourcePolicies.insert: a regional Operation, DONE at once; a name already used
        is 409 alreadyExists, as the API answers."""
        name = body["name"]
        where = f"projects/{project}/regions/{region}/resourcePolicies/{name}"
        if (region, name) in self.resource_policies:
            return 409, error_body(409, f"The resource '{where}' already exists", "alreadyExists")
        self.resource_policies[(region, name)] = {
            **body,
            "kind": "compute#resourcePolicy",
            "region": f"{_BASE}/projects/{project}/regions/{region}",
            "selfLink": f"{_BASE}/{where}",
            "status": "READY",
        }
        number = next(self._ids)
        now = self._now()
        return 200, {
            "kind": "compute#operation",
            "id": str(number),
            "name": f"operation-{number}-fake",
            "region": f"{_BASE}/projects/{project}/regions/{region}",
            "operationType": "insert",
            "targetLink": f"{_BASE}/{where}",
            "status": "DONE",
            "progress": 100,
            "insertTime": now,
            "startTime": now,
            "endTime": now,
        }

    def _policy(
        self, query: dict[str, str], body: Any, project: str, region: str, name: str
    ) -> Any:
        found = self.resource_policies.get((region, name))
        if found is None:
            where = f"projects/{project}/regions/{region}/resourcePolicies/{name}"
            return 404, error_body(404, f"The resource '{where}' was not found", "notFound")
        return 200, found

    def _delete_policy(
        self, query: dict[str, str], body: Any, project: str, region: str, name: str
    ) -> Any:
        """resourcePolicies.delete: 404 notFound for a name not made; 400
        resourceInUseByAnotherResource while a VM names the policy, as the API answers;
        else a regional Operation, DONE at once."""
        where = f"projects/{project}/regions/{region}/resourcePolicies/{name}"
        if (region, name) not in self.resource_policies:
            return 404, error_body(404, f"The resource '{where}' was not found", "notFound")
        users = [
            f"projects/{i['_project']}/zones/{zone}/instances/{vm}"
            for (zone, vm), i in sorted(self.instances.items())
            if any(str(p).endswith(where) for p in i.get("resourcePolicies", ()))
        ]
        if users:
            message = (
                f"The resource_policy resource '{where}' is already being used by '{users[0]}'"
            )
            return 400, error_body(400, message, "resourceInUseByAnotherResource")
        del self.resource_policies[(region, name)]
        number = next(self._ids)
        now = self._now()
        return 200, {
            "kind": "compute#operation",
            "id": str(number),
            "name": f"operation-{number}-fake",
            "region": f"{_BASE}/projects/{project}/regions/{region}",
            "operationType": "delete",
            "targetLink": f"{_BASE}/{where}",
            "status": "DONE",
            "progress": 100,
            "insertTime": now,
            "startTime": now,
            "endTime": now,
        }

    def _public(self, instance: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in instance.items() if not k.startswith("_")}

    def _get(self, query: dict[str, str], body: Any, project: str, zone: str, name: str) -> Any:
        instance = self.instances.get((zone, name))
        if instance is None:
            where = f"projects/{project}/zones/{zone}/instances/{name}"
            return 404, error_body(404, f"The resource '{where}' was not found", "notFound")
        return 200, self._public(instance)

    def _delete(self, query: dict[str, str], body: Any, project: str, zone: str, name: str) -> Any:
        request_id = query.get("requestId")
        if request_id and request_id in self._by_request_id:
            return 200, self._public(self._by_request_id[request_id])
        if (zone, name) not in self.instances:
            return self._get(query, body, project, zone, name)
        del self.instances[(zone, name)]
        op = self._operation_record(project, zone, name, "delete")
        if request_id:
            self._by_request_id[request_id] = op
        return 200, self._public(op)

    def _list_instances(self, query: dict[str, str], body: Any, project: str, zone: str) -> Any:
        wanted = _LABEL_FILTER.findall(query.get("filter", ""))
        items = [
            self._public(i)
            for (z, _), i in sorted(self.instances.items())
            if z == zone and all(k in i.get("labels", {}) for k in wanted)
        ]
        return 200, {"kind": "compute#instanceList", "items": items}

    def _list_operations(self, query: dict[str, str], body: Any, project: str, zone: str) -> Any:
        kinds = _OPERATION_FILTER.findall(query.get("filter", ""))
        items = [
            self._public(o)
            for o in self.operations.get(zone, [])
            if not kinds or o["operationType"] in kinds
        ]
        return 200, {"kind": "compute#operationList", "items": items}

    def _operation(self, query: dict[str, str], body: Any, project: str, zone: str, op: str) -> Any:
        for record in self.operations.get(zone, []):
            if record["name"] == op:
                return 200, self._public(self._finish(record))
        return 404, error_body(404, f"The resource 'operations/{op}' was not found", "notFound")


def main() -> None:
    """`python -m tests.helpers.gcp_fake [DIR] [--port N]`: serve recorded responses until ^C."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("directory", nargs="?", default="tests/data/gcp")
    parser.add_argument("--port", type=int, default=8089)
    args = parser.parse_args()
    fake = FakeGcp.from_recorded(args.directory, clock=utc_now).start(args.port)
    print(f"fake Compute + Billing APIs on {fake.url} (Ctrl-C stops)", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        fake.close()


if __name__ == "__main__":
    main()
