"""Every route of the daemon's API declares its answer, so /openapi.json documents each one
(docs/api.md): a JSON answer is a model's schema, never a bare "any object"."""

from __future__ import annotations

from typing import Any, cast

from fastapi.routing import APIRoute

from optimizer.api import agent
from optimizer.api.app import OPEN, PROTECTED, create_app
from optimizer.api.state import ApiState

# Routes whose answer is not a JSON document, and why.
NOT_JSON = {
    ("GET", "/metrics"): "Prometheus text exposition format",
    ("GET", "/jobs/{name}/logs"): "the job's output as plain text, streamed while it follows",
    ("HEAD", "/code/{sha256}"): "no body: the status and Content-Length say it",
}


def _app() -> Any:
    # The schema needs no state: nothing is served here.
    return create_app(cast(ApiState, object()), routers=[(agent.router, [])])


def _operations(schema: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (method.upper(), path): operation
        for path, item in schema["paths"].items()
        for method, operation in item.items()
    }


def _documented(operation: dict[str, Any], schema: dict[str, Any]) -> bool:
    """The success answer is a named model (a $ref), or a list or union of them."""
    ok = next(code for code in operation["responses"] if code.startswith("2"))
    body = operation["responses"][ok].get("content", {}).get("application/json", {})
    found = body.get("schema", {})
    if found.get("type") == "array":
        found = found.get("items", {})
    refs = [found] if "$ref" in found else found.get("anyOf", [])
    return bool(refs) and all(
        "$ref" in r and r["$ref"].rsplit("/", 1)[-1] in schema["components"]["schemas"]
        for r in refs
    )


def test_every_json_route_declares_its_answer_in_openapi() -> None:
    app = _app()
    schema = app.openapi()
    operations = _operations(schema)
    routes = {
        (method, route.path)
        for router in (*OPEN, *PROTECTED, agent.router)
        for route in router.routes
        if isinstance(route, APIRoute) and route.include_in_schema
        for method in route.methods
    }
    assert routes == set(operations)  # every route is in the schema
    undocumented = sorted(
        f"{method} {path}"
        for (method, path), operation in operations.items()
        if (method, path) not in NOT_JSON and not _documented(operation, schema)
    )
    assert undocumented == []
    assert set(NOT_JSON) <= set(operations)  # the exceptions are still routes


def test_the_agent_answers_are_the_protocols_models() -> None:
    operations = _operations(_app().openapi())
    for path, model in (
        ("/agent/v1/register", "RegisterAnswer"),
        ("/agent/v1/events", "EventsAnswer"),
        ("/agent/v1/logs", "LogsAnswer"),
    ):
        answer = operations[("POST", path)]["responses"]["200"]["content"]["application/json"]
        assert answer["schema"]["$ref"].endswith(f"/{model}")


def test_the_check_catches_an_undocumented_answer() -> None:
    """A route that answers a bare dict fails the check above."""
    from fastapi import APIRouter

    stray = APIRouter()

    @stray.get("/stray")
    def handler() -> dict[str, Any]:
        return {}

    app = create_app(cast(ApiState, object()), routers=[(stray, [])])
    schema = app.openapi()
    assert not _documented(_operations(schema)[("GET", "/stray")], schema)
