"""The HTTP API on a real uvicorn server (ephemeral port), driven with httpx."""

from __future__ import annotations

import logging
import typing
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from fastapi.routing import APIRoute

from optimizer.api import agent, throttle
from optimizer.api.app import OPEN, PROTECTED, create_app
from optimizer.api.params import Time
from optimizer.api.serve import daemon_state
from optimizer.clock import ManualClock, SteadyClock
from optimizer.model import Market
from optimizer.store import Store
from tests.helpers import (
    TOKEN,
    FakeSource,
    api,
    make_config,
    make_offer,
    policy_text,
    running,
    wait_until,
    write_policy,
)
from tests.helpers.offers import T0 as OFFERS_SEEN

pytestmark = pytest.mark.usefixtures("daemon_env")

SLACK_URL = "http://127.0.0.1:9/services/T000/B000/slack-secret-path-XYZ"
HOOK_URL = "http://127.0.0.1:9/hooks/webhook-secret-path-ABC"
HOOK_SECRET = "hmac-shared-secret-0123456789"
PATHS = ("/alerts", "/events", "/jobs", "/policies", "/metrics", "/readyz", "/openapi.json")


@pytest.fixture
def offers() -> FakeSource:
    return FakeSource(
        [
            make_offer(usd_per_hour=0.40),
            make_offer(zone="use1-az2", usd_per_hour=0.35),
            make_offer(market=Market.ON_DEMAND, zone=None, usd_per_hour=1.01),
            make_offer(instance_type="g4dn.xlarge", gpu_model="T4", gpu_memory_gib=16.0),
            make_offer(region="eu-west-1", zone="euw1-az1", gpu_memory_gib=8, gpu_model="T4G"),
        ]
    )


@pytest.fixture
def daemon(tmp_path: Path, offers: FakeSource):
    write_policy(tmp_path / "policies", "small.yaml", policy_text("small", memory=16))
    config = make_config(
        tmp_path,
        alerts={
            "channels": {
                "ops": {"type": "slack", "url": SLACK_URL},
                "hook": {"type": "webhook", "url": HOOK_URL, "secret": HOOK_SECRET},
            }
        },
        loops={"deliver_s": 3600},
    )
    clock = SteadyClock(OFFERS_SEEN + timedelta(minutes=5))  # the same on any day
    with running(config, sources={"local": offers}, clock=clock) as d, api(d) as client:
        wait_until(lambda: client.get("/readyz").status_code == 200, what="readiness")
        yield d


@pytest.mark.parametrize(
    "path", ["/offers", "/policies", "/jobs", "/events", "/alerts", "/policies/small"]
)
def test_every_operator_endpoint_needs_the_token(daemon, path: str) -> None:
    with api(daemon, token=None) as anonymous, api(daemon, token="wrong-token") as wrong:
        missing = anonymous.get(path)
        bad = wrong.get(path)
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"].startswith("Bearer")
    assert bad.status_code == 401
    with api(daemon) as client:
        assert client.get(path).status_code == 200


def test_wrong_bearer_tokens_are_throttled_per_address_then_every_token_waits(
    tmp_path: Path,
) -> None:
    clock = ManualClock(OFFERS_SEEN + timedelta(minutes=5))
    with running(make_config(tmp_path), clock=clock) as d:
        with api(d, token=None) as anonymous:
            for _ in range(throttle.BURST + 3):  # no token at all is not a guess
                assert anonymous.get("/jobs").status_code == 401
        # a non-ASCII token is only wrong (sent as raw bytes, read as Latin-1)
        weird = {"Authorization": b"Bearer " + "\u00e9\u00e9".encode()}
        with api(d, token=None) as client:
            assert client.get("/jobs", headers=weird).status_code == 401
        with api(d, token="wrong-token") as wrong, api(d) as right:
            for _ in range(throttle.BURST - 2):  # the non-ASCII one was the first
                assert wrong.get("/jobs").status_code == 401
            assert right.get("/jobs").status_code == 200  # not throttled yet: costs nothing
            assert wrong.get("/jobs").status_code == 401  # the BURST-th
            refused = wrong.get("/jobs")
            assert refused.status_code == 429
            wait = int(refused.headers["retry-after"])
            assert 0 < wait <= throttle.REFILL_S
            assert "too many wrong tokens" in refused.json()["detail"]
            # throttled, the right token waits too, so no guess can be told right
            assert right.get("/jobs").status_code == 429
            # another address (a proxy uvicorn trusts on loopback says so) goes on
            other = right.get("/jobs", headers={"X-Forwarded-For": "198.51.100.7"})
            assert other.status_code == 200
            clock.advance(wait)
            assert right.get("/jobs").status_code == 200
            assert wrong.get("/jobs").status_code == 401  # the one failure that refilled
            assert right.get("/jobs").status_code == 429


def test_health_readiness_and_metrics_are_open_and_the_docs_need_the_token(daemon) -> None:
    with api(daemon, token=None) as anonymous:
        assert anonymous.get("/healthz").json()["status"] == "ok"
        ready = anonymous.get("/readyz").json()
        assert ready["ready"] is True and ready["checks"]["store"] == "ok"
        metrics = anonymous.get("/metrics").text
        assert anonymous.get("/docs").status_code == 401
        assert anonymous.get("/openapi.json").status_code == 401
    with api(daemon) as client:
        docs = client.get("/docs")
        schema = client.get("/openapi.json").json()
    assert docs.status_code == 200 and "/jobs" in docs.text and "/openapi.json" in docs.text
    assert "<script" not in docs.text and "http" not in docs.text.replace("http-equiv", "")
    assert "gpuopt_info{" in metrics and "torch_loaded=" in metrics  # the process check: bench
    assert 'gpuopt_offers{market="spot",provider="aws"} 4.0' in metrics
    assert (
        'gpuopt_poll_last_success_timestamp_seconds{market="spot",provider="local",region="*"}'
        in metrics
    )
    assert "gpuopt_loop_runs_total" in metrics
    assert {"/jobs", "/offers", "/policies", "/events", "/healthz"} <= set(schema["paths"])


def test_offers_with_a_policy_is_the_engines_ranking_with_rejections(daemon) -> None:
    with api(daemon) as client:
        ranked = client.get("/offers", params={"policy": "small"}).json()
        limited = client.get("/offers", params={"policy": "small", "limit": 1}).json()
        unknown = client.get("/offers", params={"policy": "nope"})
        plain = client.get("/offers", params={"market": "on_demand"}).json()
    assert ranked["policy"] == "small"
    assert [c["offer"]["usd_per_hour"] for c in ranked["candidates"]] == [0.35, 0.40, 1.01]
    assert ranked["rejected_by_rule"] == {"gpu_memory": 2}
    assert {r["rule"] for r in ranked["rejections"]} == {"gpu_memory"}
    assert len(limited["candidates"]) == 1 and limited["rejected_by_rule"] == {"gpu_memory": 2}
    assert unknown.status_code == 404 and "small" in unknown.json()["detail"]
    assert plain["count"] == 1 and plain["offers"][0]["market"] == "on_demand"


def test_offers_under_a_policy_leave_out_pools_in_cooldown_as_a_launch_does(daemon) -> None:
    cooled = ("aws", "us-east-1", "use1-az2", "g5.xlarge", "spot")  # the $0.35 offer
    until = daemon.clock() + timedelta(hours=1)
    daemon.store.jobs.add_cooldown(cooled, until, "interrupted")
    with api(daemon) as client:
        ranked = client.get("/offers", params={"policy": "small"}).json()
        second = client.get("/offers", params={"policy": "small", "limit": 1, "offset": 1})
        mixed = client.get("/offers", params={"policy": "small", "market": "spot"})
    assert [c["offer"]["usd_per_hour"] for c in ranked["candidates"]] == [0.40, 1.01]
    counts = ranked["cooling_down"], ranked["candidate_count"], ranked["rejection_count"]
    assert counts == (1, 2, 2)
    page = second.json()
    assert [c["rank"] for c in page["candidates"]] == [2]
    assert page["rejections"] == ranked["rejections"][1:]
    assert page["rejected_by_rule"] == {"gpu_memory": 2}  # counts stay whole
    assert mixed.status_code == 422 and "without a policy" in mixed.json()["detail"]


def test_offers_come_a_hundred_a_page_cheapest_first_and_page_by_offset(tmp_path: Path) -> None:
    # 250 pools, four to a price: pages must not repeat or skip one of a tie.
    offers = FakeSource(
        [
            make_offer(zone=f"use1-az{n % 4}", instance_type=f"g{n}.x", usd_per_hour=1 + n // 4)
            for n in range(250)
        ]
    )
    with running(make_config(tmp_path), sources={"local": offers}) as d, api(d) as client:
        wait_until(lambda: client.get("/readyz").status_code == 200, what="readiness")
        first = client.get("/offers").json()
        pages = [
            client.get("/offers", params={"offset": start, "limit": 100}).json()
            for start in (0, 100, 200)
        ]
        bounds = [client.get("/offers", params={"limit": n}).status_code for n in (0, 1001)]
    assert first["count"] == 250 and first["offers"] == pages[0]["offers"]
    assert [len(p["offers"]) for p in pages] == [100, 100, 50]
    rows = [o for p in pages for o in p["offers"]]
    assert len({(o["zone"], o["instance_type"]) for o in rows}) == 250
    assert [o["usd_per_hour"] for o in rows] == sorted(o.usd_per_hour for o in offers.offers)
    assert bounds == [422, 422]


def test_policies_list_and_show(daemon, tmp_path: Path) -> None:
    with api(daemon) as client:
        listed = client.get("/policies").json()
        shown = client.get("/policies/small").json()
        missing = client.get("/policies/none")
    assert [p["name"] for p in listed["policies"]] == ["small"]
    assert listed["policies"][0]["path"] == str(tmp_path / "policies" / "small.yaml")
    assert listed["rejected_files"] == []
    assert shown["spec"]["apiVersion"] == "gpuopt/v1" and shown["status"] == "active"
    assert shown["versions"][0]["outcome"] == "loaded"
    assert missing.status_code == 404


def test_a_policy_cannot_read_the_daemons_environment(
    daemon, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The daemon's environment holds its secrets; a policy's text comes back through the API.
    monkeypatch.setenv("LEAKED_TOKEN", "daemon-secret-value-0123")
    text = policy_text("leaky", memory=16) + 'description: "token ${LEAKED_TOKEN}"\n'
    path = write_policy(tmp_path / "policies", "leaky.yaml", text)
    line = text.count("\n")  # the description is the last line

    def rejected(client) -> list[dict]:
        return client.get("/policies").json()["rejected_files"]

    with api(daemon) as client:
        wait_until(lambda: rejected(client), what="the leaky policy is rejected")
        listed = client.get("/policies")
        shown = client.get("/policies/leaky")
    assert "daemon-secret-value" not in listed.text
    assert [p["name"] for p in listed.json()["policies"]] == ["small"]
    (bad,) = listed.json()["rejected_files"]
    assert bad["problems"] == [
        f"{path}:{line}:21: description: '${{' is not allowed in a policy: values are never "
        "taken from the environment"
    ]
    assert shown.status_code == 404


def test_a_job_spec_sent_to_the_api_is_taken_as_written(
    daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEAKED_TOKEN", "daemon-secret-value-0123")
    with api(daemon) as client:
        created = client.post("/jobs", json={**JOB, "env": {"T": "${LEAKED_TOKEN}"}})
    assert created.status_code == 201, created.text
    assert created.json()["spec"]["env"] == {"T": "${LEAKED_TOKEN}"}


JOB = {
    "name": "train-1",
    "policy": "small",
    "run": "python train.py",
    "checkpoint_dir": "/tmp/ckpt",
    "env": {"EPOCHS": "3"},
    "probes": "none",
    "max_restarts": 2,
}


def test_job_specs_that_could_never_run_are_refused(daemon) -> None:
    bad = {
        "must not contain a NUL byte": {**JOB, "env": {"T": "a\u0000b"}},
        "at most 65536 (64 KiB)": {**JOB, "run": "x" * (64 * 1024 + 1)},
        "at most 256 are allowed": {**JOB, "env": {f"V{i}": "x" for i in range(257)}},
    }
    with api(daemon) as client:
        answers = {why: client.post("/jobs", json=spec) for why, spec in bad.items()}
        listed = client.get("/jobs").json()
    for why, answer in answers.items():
        assert answer.status_code == 422, (why, answer.status_code)
        assert why in answer.text, (why, answer.text[:300])
    assert listed["jobs"] == []


def test_jobs_submit_list_show_and_cancel(daemon) -> None:
    seen: list[list[str]] = []
    daemon.reconcile.add(lambda ctx: seen.append([j.name for j in ctx.jobs]))
    with api(daemon) as client:
        created = client.post("/jobs", json=JOB)
        assert created.status_code == 201, created.text
        job = created.json()
        assert job["state"] == "pending" and job["spec"]["run"] == "python train.py"
        assert job["spec"]["max_restarts"] == 2 and "name" not in job["spec"]
        wait_until(lambda: ["train-1"] in seen, what="the reconcile pass the submit woke")
        assert client.post("/jobs", json=JOB).status_code == 409
        assert [j["name"] for j in client.get("/jobs").json()["jobs"]] == ["train-1"]
        assert client.get("/jobs", params={"state": "running"}).json()["jobs"] == []
        assert client.get("/jobs/train-1").json()["id"] == job["id"]
        assert client.get("/jobs/nope").status_code == 404
        assert client.get("/jobs/train-1").json()["cancel_requested_at"] is None
        requested = client.post("/jobs/train-1/cancel")
        # A cancel is a request: the answer is the job as it is, with the request recorded;
        # the reconcile pass the request woke decides it.
        assert requested.status_code == 200, requested.text
        assert requested.json()["state"] == "pending"
        assert requested.json()["cancel_requested_at"] is not None
        wait_until(
            lambda: client.get("/jobs/train-1").json()["state"] == "cancelled",
            what="the reconcile pass that decides the cancel",
        )
        again = client.post("/jobs/train-1/cancel")
        events = client.get("/events", params={"job": "train-1"}).json()["events"]
    assert again.status_code == 409 and "cancelled" in again.json()["detail"]
    kinds = [e["kind"] for e in events if e["kind"] in ("job.cancelled", "job.submitted")]
    assert kinds == ["job.cancelled", "job.submitted"]
    cancelled = next(e for e in events if e["kind"] == "job.cancelled")
    assert cancelled["data"] == {"job": "train-1", "state_before": "pending"}


def test_an_ended_job_is_removed_and_its_name_taken_again(daemon) -> None:
    with api(daemon) as client:
        first = client.post("/jobs", json=JOB).json()
        live = client.delete("/jobs/train-1")
        taken_live = client.post("/jobs", json=JOB)
        client.post("/jobs/train-1/cancel")
        wait_until(
            lambda: client.get("/jobs/train-1").json()["state"] == "cancelled",
            what="the reconcile pass that decides the cancel",
        )
        taken_ended = client.post("/jobs", json=JOB)
        removed = client.delete("/jobs/train-1")
        again = client.delete("/jobs/train-1")
        listed = client.get("/jobs").json()["jobs"]
        shown = client.get("/jobs/train-1")
        rerun = client.post("/jobs", json=JOB)
        old_events = client.get("/events", params={"kind": "job.removed"}).json()["events"]
        new_events = client.get("/events", params={"job": "train-1"}).json()["events"]
    # Not ended: refused, naming the state and the way out.
    assert live.status_code == 409
    assert live.json()["detail"] == (
        "job 'train-1' is pending: only an ended job can be removed; cancel it first "
        "(`gpuopt jobs cancel train-1`) and remove it once it has ended"
    )
    assert taken_live.status_code == 409
    assert taken_live.json()["detail"].startswith(
        "a job named 'train-1' already exists (pending): submit it under another name "
        "(`gpuopt jobs submit FILE --name NEW`), or cancel it"
    )
    assert taken_ended.status_code == 409
    assert taken_ended.json()["detail"].endswith(
        "or remove the ended job first (`gpuopt jobs rm train-1`)"
    )
    # Ended: removed, off the lists, its name free, its events under its id.
    assert removed.status_code == 200, removed.text
    gone = removed.json()
    assert (gone["id"], gone["name"], gone["state"]) == (first["id"], "train-1", "cancelled")
    assert gone["removed_at"] is not None
    assert again.status_code == 404 and listed == [] and shown.status_code == 404
    assert rerun.status_code == 201 and rerun.json()["id"] != first["id"]
    [event] = old_events
    assert event["job_id"] == first["id"]
    assert event["data"] == {"job": "train-1", "state": "cancelled"}
    # The name now finds the re-run's events only.
    assert {e["job_id"] for e in new_events} == {rerun.json()["id"]}
    assert "job.submitted" in [e["kind"] for e in new_events]


def test_job_submit_is_validated(daemon) -> None:
    with api(daemon) as client:
        unknown_policy = client.post("/jobs", json={**JOB, "policy": "huge"})
        bad_probe = client.post("/jobs", json={**JOB, "probes": "thorough"})
        extra = client.post("/jobs", json={**JOB, "gpus": 8})
        reserved = client.post("/jobs", json={**JOB, "env": {"GPUOPT_ATTEMPT": "1"}})
    assert unknown_policy.status_code == 422
    assert "no policy named 'huge'" in unknown_policy.json()["detail"][0]["msg"]
    for response in (bad_probe, extra, reserved):
        assert response.status_code == 422


def test_events_are_listed_newest_first_and_shown_one_by_one(daemon) -> None:
    with api(daemon) as client:
        client.post("/jobs", json=JOB)
        client.post("/jobs", json={**JOB, "name": "train-2"})
        events = client.get("/events", params={"kind": "job.submitted"}).json()["events"]
        spelled_before = client.get("/events", params={"kind": "job_submitted"}).json()
        older = client.get("/events", params={"before": events[0]["id"]}).json()["events"]
        one = client.get(f"/events/{events[0]['id']}").json()
        alerts = client.get("/alerts").json()
    assert [e["data"]["job"] for e in events] == ["train-2", "train-1"]
    assert spelled_before["events"] == events  # the earlier spelling finds them too
    assert all(e["id"] < events[0]["id"] for e in older)
    assert one["kind"] == "job.submitted" and one["policy"] == "small"
    assert alerts["counts"]["pending"] >= 4  # each job.submitted to both channels
    assert {a["channel"] for a in alerts["alerts"]} == {"ops", "hook"}


def test_secrets_never_appear_in_logs_or_api_output(
    tmp_path: Path, offers: FakeSource, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    write_policy(tmp_path / "policies", "small.yaml", policy_text("small", memory=16))
    config = make_config(
        tmp_path,
        alerts={
            "channels": {
                "ops": {"type": "slack", "url": SLACK_URL},
                "hook": {"type": "webhook", "url": HOOK_URL, "secret": HOOK_SECRET},
            },
            "retry": {"timeout_s": 1},
        },
    )
    bodies: list[str] = [repr(config), str(config), repr(config.alerts)]
    with running(config, sources={"local": offers}) as daemon, api(daemon) as client:
        client.post("/jobs", json=JOB)
        # Port 9 (discard) refuses connections: each channel's first delivery fails and is
        # retried (holding back that channel's later alerts).
        wait_until(
            lambda: (
                {a["channel"] for a in client.get("/alerts").json()["alerts"] if a["attempts"] >= 1}
                == {"ops", "hook"}
            ),
            what="failed deliveries to the unreachable receivers",
        )
        for path in (*PATHS, "/offers?policy=small"):
            bodies.append(client.get(path).text)
        bodies.append(repr(daemon.deliver.notifiers))
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "connection failed" in "\n".join(bodies)  # the failures are visible…
    for secret in (SLACK_URL, HOOK_URL, HOOK_SECRET, TOKEN, "slack-secret-path", "webhook-secret"):
        assert secret not in logged
        for body in bodies:
            assert secret not in body  # …but never the URLs, secrets or the token


BIG = 2**70


@pytest.mark.parametrize(
    "path",
    [f"/jobs?before={BIG}", f"/events?before={BIG}", f"/events/{BIG}", f"/events/-{BIG}"],
)
def test_integers_past_64_bits_are_a_422_not_a_500(daemon, path: str) -> None:
    with api(daemon) as client:
        answer = client.get(path)
    assert answer.status_code == 422, answer.text
    assert str(BIG) not in answer.text


def test_a_body_over_the_limit_is_refused_with_413_before_it_is_read(daemon) -> None:
    big = b"x" * (2 << 20)  # 2 MiB, over the 1 MiB default
    with api(daemon) as client, api(daemon, token=None) as anonymous:
        declared = client.post("/jobs", content=big, headers={"content-type": "application/json"})
        streamed = client.post(
            "/jobs",
            content=iter([big[i : i + 65536] for i in range(0, len(big), 65536)]),
            headers={"content-type": "application/json"},
        )
        agent = anonymous.post("/agent/v1/register", content=big)
        unauthenticated = anonymous.post("/jobs", content=big)
    assert declared.status_code == 413, declared.text
    assert "limit" in declared.json()["detail"]
    assert "content-length" not in streamed.request.headers  # chunked: counted as it came
    assert streamed.status_code == 413, streamed.text
    assert len(declared.content) < 200 and len(streamed.content) < 200
    # without a token the answer is 401, whatever the body
    assert agent.status_code == 401 and unauthenticated.status_code == 401
    assert len(agent.content) < 200


def test_the_body_limit_is_a_config_key(tmp_path: Path) -> None:
    write_policy(tmp_path / "policies", "small.yaml", policy_text("small", memory=16))
    config = make_config(tmp_path, api={"max_body_bytes": 4096})
    with running(config) as d, api(d) as client:
        over = client.post("/jobs", json={"name": "a", "policy": "small", "run": "x" * 5000})
        under = client.post("/jobs", json={"name": "a", "policy": "small", "run": "x" * 100})
    assert over.status_code == 413
    assert under.status_code != 413


def test_agent_endpoints_authenticate_before_parsing(daemon) -> None:
    with api(daemon, token=None) as anonymous, api(daemon, token="not-an-agent-token") as wrong:
        bad_json = anonymous.post("/agent/v1/register", content=b"{not json")
        invalid = wrong.post("/agent/v1/register", json={"attempt_key": ""})
        events = wrong.post("/agent/v1/events", json={"events": "nope"})
    # a request without a valid agent token never reaches the parser: 401, not 422
    for answer in (bad_json, invalid, events):
        assert answer.status_code == 401, answer.text
        assert answer.json() == {"detail": "invalid agent token"}


def test_validation_errors_never_echo_the_submitted_values(daemon) -> None:
    marker = "ECHO-ME-" + "q" * 5000
    with api(daemon) as client:
        answer = client.post(
            "/jobs",
            json={"name": marker, "policy": 12345678987654321, "run": [marker], "x": marker},
        )
        query = client.get("/jobs", params={"limit": marker})
    assert answer.status_code == 422 and query.status_code == 422
    for reply in (answer, query):
        assert "ECHO-ME" not in reply.text and "12345678987654321" not in reply.text
        for item in reply.json()["detail"]:
            assert set(item) == {"loc", "msg", "type"}
    assert len(answer.content) < 4000


# The calendar's edges with the widest offsets (no UTC time exists for them), and the first
# instants past either bound of the span gpuopt reads (1970 to 2200).
EDGE_TIMES = (
    "0001-01-01T00:00:00+14:00",
    "9999-12-31T23:59:59-14:00",
    "0001-01-01T00:00:00Z",
    "9999-12-31T23:59:59Z",
    "1969-12-31T23:59:59Z",
    "2200-01-01T00:00:00Z",
)
HISTORY = "/prices/history?provider=aws&region=us-east-1&instance_type=g5.xlarge"
OUT_OF_RANGE = [
    ("GET", f"/offers?offset={2**63}", "offset"),
    ("GET", f"/offers?offset={2**31}", "offset"),
    *[("GET", f"/offers?policy=small&at={quote(t)}", "at") for t in EDGE_TIMES],
    *[("GET", f"{HISTORY}&since={quote(t)}", "since") for t in EDGE_TIMES],
    *[("GET", f"{HISTORY}&until={quote(t)}", "until") for t in EDGE_TIMES],
    *[("GET", f"/costs?since={quote(t)}", "since") for t in EDGE_TIMES],
    *[("GET", f"/costs?until={quote(t)}", "until") for t in EDGE_TIMES],
    ("GET", "/costs?since=0001-01", "since"),
    ("POST", f"/costs/notify?since={quote(EDGE_TIMES[0])}", "since"),
]


def _names_field(answer: Any, field: str) -> bool:
    """FastAPI's shape (a list with the query parameter's loc) or a message led by it."""
    detail = answer.json()["detail"]
    if isinstance(detail, str):
        return detail.startswith(f"{field}:")
    return any(item["loc"] == ["query", field] for item in detail)


@pytest.mark.parametrize(("method", "path", "field"), OUT_OF_RANGE)
def test_times_at_the_calendars_edge_and_huge_offsets_are_a_422_naming_the_field(
    daemon, method: str, path: str, field: str
) -> None:
    with api(daemon) as client:
        answer = client.request(method, path)
    assert answer.status_code == 422, answer.text
    assert _names_field(answer, field), answer.text


def test_a_time_with_a_fourteen_hour_offset_inside_the_span_is_read_in_utc(daemon) -> None:
    with api(daemon) as client:
        ahead = client.get("/offers", params={"policy": "small", "at": "2026-12-02T09:00:00+14:00"})
        behind = client.get(f"{HISTORY}&since={quote('2026-11-30T19:00:00-14:00')}")
        costs = client.get("/costs", params={"since": "2026-12-01T09:00:00-14:00"})
    assert ahead.status_code == 200 and ahead.json()["at"] == "2026-12-01T19:00:00Z"
    assert behind.status_code == 200 and behind.json()["since"] == "2026-12-01T09:00:00Z"
    assert costs.status_code == 200, costs.text


def _unreachable_store_face(daemon: Any) -> Any:
    """The daemon's own app, but reading a PostgreSQL store nothing answers for (port 9)."""
    state = daemon_state(daemon)
    state.store = Store("postgresql://postgres@127.0.0.1:9/gone")
    return create_app(state, routers=[(agent.router, [])])


def test_requests_get_a_503_with_retry_after_while_the_database_is_unreachable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_policy(tmp_path / "policies", "small.yaml", policy_text("small", memory=16))
    config = make_config(tmp_path)
    with (
        caplog.at_level(logging.WARNING),
        running(config, face=_unreachable_store_face) as d,
        api(d) as client,
        api(d, token="some-agent-token") as agent_client,
    ):
        answers = [
            client.get("/jobs"),
            client.get("/offers"),
            client.get("/events"),
            client.get("/costs"),
            client.post("/jobs", json=JOB),
            agent_client.post("/agent/v1/register", json={"attempt_key": "k"}),
        ]
    for answer in answers:
        assert answer.status_code == 503, (answer.request.url, answer.text)
        assert answer.headers["retry-after"] == "5"
        assert answer.json() == {"detail": "the database is unavailable; try again shortly"}
    assert "Traceback" not in caplog.text
    assert "answered 503" in caplog.text


def test_every_integer_and_time_parameter_is_bounded_by_one_definition(daemon) -> None:
    """Every integer in a path or query has both bounds, and every time is `params.Time`: one
    definition of what a route takes, so no route can meet an overflow further in."""
    unbounded, bare_times = [], []
    routes = [r for router in (*OPEN, *PROTECTED, agent.router) for r in router.routes]
    assert len(routes) > 20
    for route in routes:
        assert isinstance(route, APIRoute)
        for param in [*route.dependant.query_params, *route.dependant.path_params]:
            annotation = param.field_info.annotation
            kinds = typing.get_args(annotation) or (annotation,)  # X | None: X and None
            for kind in kinds:
                is_time = kind is datetime or typing.get_args(kind)[:1] == (datetime,)
                if is_time and kind != Time:
                    bare_times.append(f"{route.path} {param.name}")
    for path, operations in daemon.app.openapi()["paths"].items():
        for operation in operations.values():
            for param in operation.get("parameters", []):
                schemas = param["schema"].get("anyOf", [param["schema"]])
                for schema in schemas:
                    if schema.get("type") == "integer" and not {"minimum", "maximum"} <= set(
                        schema
                    ):
                        unbounded.append(f"{path} {param['name']}")
    assert (unbounded, bare_times) == ([], [])
