"""The CLI's HTTP client (optimizer/cli/client.py) against a real HTTP server on loopback."""

from __future__ import annotations

import json
import socket

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from optimizer.cli import client


@pytest.fixture
def token(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("GPUOPT_API_TOKEN", "tok-0123456789")
    return "tok-0123456789"


def test_a_request_sends_the_token_the_query_and_the_json_body(
    httpserver: HTTPServer, token: str
) -> None:
    seen: list[Request] = []

    def answer(request: Request) -> Response:
        seen.append(request)
        return Response(json.dumps({"ok": "é"}), content_type="application/json; charset=utf-8")

    httpserver.expect_request("/jobs", method="POST").respond_with_handler(answer)
    got = client.request(
        "POST", "/jobs", httpserver.url_for("/"), params={"a": "1 2", "b": 3}, json={"x": [1]}
    )
    assert (got.status_code, got.json()) == (200, {"ok": "é"})
    (sent,) = seen
    assert sent.headers["Authorization"] == f"Bearer {token}"
    assert sent.args.to_dict() == {"a": "1 2", "b": "3"}
    assert json.loads(sent.get_data()) == {"x": [1]} and sent.content_type == "application/json"


def test_a_refusal_keeps_its_status_and_reason(httpserver: HTTPServer, token: str) -> None:
    httpserver.expect_request("/jobs/x").respond_with_json({"detail": "no job named 'x'"}, 404)
    got = client.request("GET", "/jobs/x", httpserver.url_for("/"))
    assert got.status_code == 404 and client.detail(got) == "no job named 'x'"


def test_a_streamed_answer_arrives_in_pieces_decoded_across_their_edges(
    httpserver: HTTPServer,
) -> None:
    text = "ü" * 70_000  # two bytes each: pieces of 64 KiB cut characters in half
    httpserver.expect_request("/logs").respond_with_data(
        text.encode(), content_type="text/plain; charset=utf-8"
    )
    with client.stream("GET", httpserver.url_for("/logs"), {}, read_timeout=None) as answer:
        pieces = list(answer.pieces())
    assert answer.status == 200 and len(pieces) >= 2 and "".join(pieces) == text


def test_no_daemon_says_why_in_words(token: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    nobody = f"http://127.0.0.1:{port}"
    with pytest.raises(client.NoDaemon, match="connection refused"):
        client.request("GET", "/healthz", nobody)
    with pytest.raises(client.NoDaemon, match="not an http"):
        client.request("GET", "/healthz", "ftp://127.0.0.1:1")
