"""The CLI's HTTP client (optimizer/cli/client.py) against a real HTTP server on loopback."""

from __future__ import annotations

import json
import socket

import pytest
from pytest_httpserver import HTTPServer
from typer.testing import CliRunner, Result
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


# -- answers read through their models (optimizer/answers.py) -----------------------------------

UNREADABLE = "gpuopt: error: the daemon answered something this gpuopt cannot read: "


def _job(name: str, **changes: object) -> dict[str, object]:
    job: dict[str, object] = {
        "id": 7,
        "name": name,
        "policy": "train",
        "state": "running",
        "reason": None,
        "restarts": 1,
        "created_at": "2026-03-01T10:00:00Z",
        "updated_at": "2026-03-01T10:05:00Z",
        "cancel_requested_at": None,
        "removed_at": None,
        "spec": {"name": name},
    }
    return {**job, **changes}


def _gpuopt(httpserver: HTTPServer, *args: str) -> Result:
    from optimizer.cli import app

    return CliRunner().invoke(app, [*args, "--api", httpserver.url_for("")])


@pytest.mark.parametrize(
    ("args", "path", "body", "problem"),
    [
        (
            ["jobs", "list"],
            "/jobs",
            {"jobs": [{"name": "a", "state": "running"}]},
            "JobList.jobs.0.id: Field required",
        ),
        (
            ["jobs", "show", "a"],
            "/jobs/a",
            {**_job("a", restarts="many"), "attempts": [], "gpu": None},
            "JobDetail.restarts: Input should be a valid integer",
        ),
        (["jobs", "events", "a"], "/events", [{"id": 1}], "EventList: Input should be"),
        (["probes", "list"], "/probes", {"results": []}, "ProbeList.probes: Field required"),
        (["advise", "a"], "/jobs/a/advice", {"job": "a"}, "AdviceView.policy: Field required"),
        (
            ["prices", "history", "--provider", "local", "--region", "r", "--instance-type", "t"],
            "/prices/history",
            {"points": "none"},
            "PriceHistory.provider: Field required",
        ),
    ],
)
def test_an_answer_that_does_not_fit_its_model_is_one_line_naming_the_field(
    httpserver: HTTPServer,
    token: str,
    args: list[str],
    path: str,
    body: object,
    problem: str,
) -> None:
    httpserver.expect_request(path).respond_with_json(body)
    for extra in ([], ["--json"]):
        done = _gpuopt(httpserver, *args, *extra)
        # exit 1 through typer.Exit, not an exception escaping the command
        assert done.exit_code == 1 and isinstance(done.exception, SystemExit), done.exception
        assert done.stdout == ""
        (line,) = done.stderr.splitlines()
        assert line.startswith(UNREADABLE + problem) and line.endswith(" (versions differ?)")


def test_an_answer_that_is_not_json_is_one_line_too(httpserver: HTTPServer, token: str) -> None:
    httpserver.expect_request("/jobs").respond_with_data("<html>a proxy's page</html>")
    done = _gpuopt(httpserver, "jobs", "list")
    assert done.exit_code == 1 and isinstance(done.exception, SystemExit)
    assert done.stderr == UNREADABLE + "not JSON (versions differ?)\n"


def test_json_prints_what_the_daemon_sent_and_fields_it_does_not_know_pass(
    httpserver: HTTPServer, token: str
) -> None:
    # A newer daemon's extra field, and a number written as the daemon wrote it (2, not 2.0).
    jobs = [_job("b", restarts=2, reason="waiting", queue_position=3), _job("a")]
    httpserver.expect_request("/jobs").respond_with_json({"jobs": jobs})
    done = _gpuopt(httpserver, "jobs", "list", "--json")
    assert done.exit_code == 0, done.output
    assert done.stdout == json.dumps(jobs, indent=2) + "\n"
    done = _gpuopt(httpserver, "jobs", "list")
    assert done.exit_code == 0, done.output
    assert done.stdout.splitlines() == [
        f"{'b':<24} {'running':<13} restarts 2   {'-':<20} waiting",
        f"{'a':<24} {'running':<13} restarts 1   {'-':<20} ",
    ]


def test_jobs_show_and_events_print_what_they_printed_from_dicts(
    httpserver: HTTPServer, token: str
) -> None:
    gpu = {
        "current_utilization": 0.03,
        "current_at": "2026-03-01T12:04:00Z",
        "average_utilization": 0.05,
        "current_memory_used_gib": 12.0,
        "peak_memory_used_gib": 16,  # an int, as the daemon writes a whole number
        "memory_total_gib": 80.0,
        "peak_memory_used_ratio": 0.2,
        "since": "2026-03-01T11:58:00Z",
        "samples": 7,
        "attempt_id": 3,
        "throttle_reasons": None,
        "xids": [],
        "simulated": True,
    }
    job = {
        **_job("a", reason="relaunching", cancel_requested_at="2026-03-01T12:05:00Z"),
        "attempts": [],
        "gpu": gpu,
    }
    events = [
        {
            "id": i,
            "at": f"2026-03-01T12:0{i}:00Z",
            "kind": kind,
            "severity": "info",
            "job_id": 7,
            "policy": "train",
            "message": f"{kind} happened",
            "data": None,
        }
        for i, kind in ((3, "job.running"), (1, "job.submitted"), (2, "job.launching"))
    ]
    httpserver.expect_request("/jobs/a").respond_with_json(job)
    httpserver.expect_request("/events").respond_with_json({"events": events})
    done = _gpuopt(httpserver, "jobs", "show", "a")
    assert done.exit_code == 0, done.output
    assert done.stdout.splitlines() == [
        "a: running (policy train, restarts 1)",
        "  relaunching",
        "  cancel requested at 2026-03-01T12:05:00Z; the daemon is stopping it",
        "  GPU: utilization 3% now (12:04 UTC), 5% average since 11:58 UTC; peak memory 16.0"
        " of 80.0 GiB (20%) [simulated]",
    ]
    done = _gpuopt(httpserver, "jobs", "events", "a")
    assert done.exit_code == 0, done.output
    assert [line.split()[2] for line in done.stdout.splitlines()] == [
        "job.submitted",
        "job.launching",
        "job.running",
    ]
    done = _gpuopt(httpserver, "jobs", "events", "a", "--json")
    oldest_first = sorted(events, key=lambda e: e["id"])
    assert done.stdout == json.dumps(oldest_first, indent=2) + "\n"


def test_a_401_says_where_the_token_came_from_and_never_the_token(
    httpserver: HTTPServer, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from optimizer.cli import app

    httpserver.expect_request("/jobs").respond_with_json(
        {"detail": "missing or wrong bearer token"}, 401
    )
    runner, url = CliRunner(), httpserver.url_for("/")

    monkeypatch.setenv("GPUOPT_API_TOKEN", "tok-from-the-variable")
    got = runner.invoke(app, ["jobs", "list", "--api", url])
    assert got.exit_code == 2
    assert "401: missing or wrong bearer token: the token came from GPUOPT_API_TOKEN" in (
        got.output
    )
    assert "tok-from-the-variable" not in got.output

    monkeypatch.delenv("GPUOPT_API_TOKEN")
    monkeypatch.setenv("GPUOPT_DATA_DIR", str(tmp_path))
    (tmp_path / "api-token").write_text("tok-from-the-file\n")
    got = runner.invoke(app, ["jobs", "list", "--api", url])
    assert got.exit_code == 2
    assert f"the token came from {tmp_path / 'api-token'} (its folder from GPUOPT_DATA_DIR)" in (
        " ".join(got.output.split())
    )
    assert "tok-from-the-file" not in got.output

    monkeypatch.delenv("GPUOPT_DATA_DIR")
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".local/share/gpuopt").mkdir(parents=True)
    (tmp_path / ".local/share/gpuopt/api-token").write_text("tok-home\n")
    got = runner.invoke(app, ["jobs", "list", "--api", url])
    assert "(the default folder: GPUOPT_DATA_DIR is unset)" in " ".join(got.output.split())
