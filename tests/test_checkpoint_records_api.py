"""Checkpoints in a bucket, through the daemon's API on a real loopback server: submit fills
in the bucket's region (or refuses a bucket that cannot be used, naming `checkpoint.uri`),
register hands the agent the bucket, the agents' checkpoint reports become rows and events
(once, however often sent; bad data refused), the final one lifts the replacement's fence,
and `GET /jobs/{name}/checkpoints` and `gpuopt jobs checkpoints` list them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from optimizer.cli import app
from optimizer.clock import ManualClock
from optimizer.daemon.service import Daemon
from optimizer.jobs.state import BucketRefused, BucketUnreachable
from optimizer.model import EventKind
from optimizer.store.jobs import token_sha256
from tests.helpers import make_offer
from tests.helpers.daemon import TOKEN, api, make_config, running
from tests.helpers.offers import T0
from tests.helpers.policies import policy_text, write_policy
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.usefixtures("daemon_env")

BUCKET = "s3://team-ckpt/resnet"
SPEC = {"name": "train", "policy": "small", "run": "python train.py", "checkpoint": BUCKET}


GDPR = (
    policy_text("gdpr")
    + "placement: {compliance: gdpr}\n"
    + "data: {regions: {allow: [eu-central-*, europe-west4]}}\n"
)


class Regions:
    """The storage API as the daemon's submit sees it: each bucket's answer."""

    def __init__(self, answer: str | Exception | None = "us-east-1") -> None:
        self.answer = answer
        self.asked: list[str] = []

    def __call__(self, uri: str) -> str | None:
        self.asked.append(uri)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def regions() -> Regions:
    return Regions()


@pytest.fixture
def daemon(tmp_path: Path, clock: ManualClock, regions: Regions) -> Iterator[Daemon]:
    write_policy(tmp_path / "policies", "small.yaml", policy_text("small"))
    write_policy(tmp_path / "policies", "gdpr.yaml", GDPR)
    with running(make_config(tmp_path), clock=clock) as d:
        d.app.state.gpuopt.bucket_region = regions
        with api(d) as client:
            for name in ("small", "gdpr"):
                wait_until(
                    lambda n=name: client.get(f"/policies/{n}").status_code == 200, what=name
                )
        yield d


def submit(daemon: Daemon, **over: Any) -> httpx.Response:
    with api(daemon) as client:
        return client.post("/jobs", json={**SPEC, **over})


def add(daemon: Daemon, name: str = "train", **spec: Any) -> int:
    """A job as submit stores it, under a policy the daemon has not loaded, so the reconcile
    loop leaves the attempts the test makes alone."""
    stored = {"run": "python train.py", **spec}
    stored.setdefault("checkpoint", {"uri": BUCKET, "keep": 3, "region": "us-east-1"})
    return daemon.store.jobs.add_job(name, "p", stored, at=T0)


def attempt(daemon: Daemon, job: int, number: int, **offer: Any) -> tuple[str, str]:
    key, token = f"{job}-{number}", f"token-{job}-{number}"
    place = make_offer(provider=offer.pop("provider", "aws"), **offer)
    daemon.store.jobs.create_attempt(job, number, key, place, token_sha256(token), T0)
    return key, token


def post(daemon: Daemon, node: tuple[str, str], path: str, **body: Any) -> httpx.Response:
    key, token = node
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        return client.post(
            f"/agent/v1/{path}",
            json={"attempt_key": key, **body},
            headers={"Authorization": f"Bearer {token}"},
        )


def committed(eid: str, name: str, step: int, **over: Any) -> dict[str, Any]:
    data = {
        "name": name,
        "step": step,
        "size_bytes": 3 * 2**30,
        "files": 2,
        "seconds": 6.0,
        "mib_s": 512.0,
        "final": False,
        **over,
    }
    return {"id": eid, "kind": "checkpoint_committed", "data": data}


def restored(eid: str, name: str) -> dict[str, Any]:
    data = {
        "name": name,
        "step": 10,
        "size_bytes": 3 * 2**30,
        "fetched_bytes": 2**30,
        "reused_bytes": 2 * 2**30,
        "seconds": 4.0,
        "mib_s": 256.0,
    }
    return {"id": eid, "kind": "checkpoint_restored", "data": data}


def kinds(daemon: Daemon, kind: EventKind) -> list[dict[str, Any]]:
    """The events of a kind, oldest first."""
    return [e.data or {} for e in reversed(daemon.store.events.list_events(kind=kind))]


# -- submit -------------------------------------------------------------------------------------


def test_submit_stores_the_region_the_storage_api_names(daemon: Daemon, regions: Regions) -> None:
    regions.answer = "EU"  # GCS names multi-regions in capitals
    done = submit(daemon)
    assert done.status_code == 201, done.text
    assert done.json()["spec"]["checkpoint"] == {"uri": BUCKET, "keep": 3, "region": "eu"}
    assert regions.asked == [BUCKET]


def test_a_region_given_is_kept_and_nothing_is_asked(daemon: Daemon, regions: Regions) -> None:
    done = submit(daemon, checkpoint={"uri": BUCKET + "/", "keep": 5, "region": "us-west-2"})
    assert done.status_code == 201, done.text
    assert done.json()["spec"]["checkpoint"] == {"uri": BUCKET, "keep": 5, "region": "us-west-2"}
    assert regions.asked == []


def test_a_bucket_that_cannot_be_used_is_a_422_naming_checkpoint_uri(
    daemon: Daemon, regions: Regions
) -> None:
    regions.answer = BucketRefused(f"{BUCKET}: access denied (AccessDenied)")
    refused = submit(daemon)
    assert refused.status_code == 422
    [problem] = refused.json()["detail"]
    assert problem["loc"] == ["body", "checkpoint", "uri"]
    assert problem["msg"] == (
        f"the checkpoint bucket cannot be used: {BUCKET}: access denied (AccessDenied)"
    )
    assert daemon.store.jobs.get_job("train") is None


def test_an_unreachable_storage_api_accepts_the_job_and_warns(
    daemon: Daemon, regions: Regions
) -> None:
    regions.answer = BucketUnreachable(f"{BUCKET}: unreachable (EndpointConnectionError)")
    done = submit(daemon)
    assert done.status_code == 201, done.text
    assert done.json()["spec"]["checkpoint"]["region"] is None
    [warning] = daemon.store.events.list_events(kind=EventKind.JOB_WARNING)
    assert warning.severity == "warning" and warning.job_id == done.json()["id"]
    assert warning.data == {
        "job": "train",
        "field": "checkpoint.uri",
        "reason": f"{BUCKET}: unreachable (EndpointConnectionError)",
    }


@pytest.mark.parametrize(
    ("region", "why"),
    [
        ("us-east-1", "us-east-1"),  # outside the EU: the compliance preset refuses it
        ("eu-west-1", "region eu-west-1 is not in the policy's data.regions.allow"),
    ],
)
def test_a_bucket_outside_the_policys_residency_is_refused_at_submit(
    daemon: Daemon, regions: Regions, region: str, why: str
) -> None:
    regions.answer = region
    refused = submit(daemon, policy="gdpr")
    assert refused.status_code == 422, refused.text
    [problem] = refused.json()["detail"]
    assert problem["loc"] == ["body", "checkpoint", "uri"]
    assert f"{BUCKET} (aws {region}) breaks policy gdpr's data residency" in problem["msg"]
    assert why in problem["msg"]
    assert daemon.store.jobs.get_job("train") is None  # nothing stored
    regions.answer = "eu-central-1"  # a bucket inside both is accepted
    assert submit(daemon, policy="gdpr").status_code == 201


def test_a_bad_uri_is_refused_before_any_lookup(daemon: Daemon, regions: Regions) -> None:
    refused = submit(daemon, checkpoint="ftp://team-ckpt")
    assert refused.status_code == 422
    assert [p["loc"] for p in refused.json()["detail"]] == [["body", "checkpoint", "uri"]]
    assert regions.asked == []


# -- register and reports -----------------------------------------------------------------------


def test_register_hands_the_bucket_to_the_agent_and_leaves_it_out_without_one(
    daemon: Daemon,
) -> None:
    job = add(daemon)
    answer = post(daemon, attempt(daemon, job, 1), "register", instance_id="i-1").json()
    assert answer["job"]["checkpoint"] == {"uri": BUCKET, "keep": 3}
    assert answer["job"]["checkpoint_dir"] is None
    other = add(daemon, "shared", checkpoint=None, checkpoint_dir="/mnt/c")
    plain = post(daemon, attempt(daemon, other, 1), "register", instance_id="i-2").json()
    assert "job" in plain, plain
    assert "checkpoint" not in plain["job"] and plain["job"]["checkpoint_dir"] == "/mnt/c"


def test_reports_become_rows_and_events_once_and_the_listing_shows_them(
    daemon: Daemon, clock: ManualClock
) -> None:
    job = add(daemon)
    old = attempt(daemon, job, 1)
    new = attempt(daemon, job, 2, provider="gcp", region="europe-west4")
    first = [
        committed("c1", "step-10", 10) | {"at": "2026-01-15T11:59:30Z"},  # the agent's time
        committed("c2", "step-20", 20) | {"at": "1999-01-01T00:00:00Z"},  # before the attempt
    ]
    for _ in range(2):  # a batch sent again adds nothing
        assert post(daemon, old, "events", events=first).json()["ack"] == ["c1", "c2"]
    clock.advance(60)
    error = "s3://team-ckpt/resnet: unreachable " + "x" * 5000
    failed = {"id": "f1", "kind": "checkpoint_failed", "data": {"name": "step-30", "error": error}}
    final = committed("c3", "step-25", 25, final=True)
    assert post(daemon, old, "events", events=[failed, final]).status_code == 200
    clock.advance(60)
    assert post(daemon, new, "events", events=[restored("r1", "step-25")]).status_code == 200
    pruned = {"id": "p1", "kind": "checkpoint_pruned", "data": {"names": ["step-10"]}}
    assert post(daemon, new, "events", events=[pruned]).status_code == 200

    rows = daemon.store.checkpoints.checkpoints(job)
    assert [(c.name, c.final, c.deleted_at is not None) for c in rows] == [
        ("step-25", True, False),
        ("step-20", False, False),
        ("step-10", False, True),
    ]
    assert {(c.uri, c.provider, c.region) for c in rows} == {
        (f"{BUCKET}/data/{n}", "aws", "us-east-1") for n in ("step-10", "step-20", "step-25")
    }
    [restore] = daemon.store.checkpoints.restores(job)
    assert (restore.from_provider, restore.from_region) == ("aws", "us-east-1")
    assert (restore.to_provider, restore.to_region) == ("gcp", "europe-west4")
    assert (restore.size_bytes, restore.fetched_bytes) == (3 * 2**30, 2**30)

    commits = kinds(daemon, EventKind.CHECKPOINT_COMMITTED)
    assert [(e["name"], e["final"], e["attempt"]) for e in commits] == [
        ("step-10", False, 1),
        ("step-20", False, 1),
        ("step-25", True, 1),
    ]
    assert commits[0] | {"uri": None} == {
        "job": "train",
        "attempt": 1,
        "name": "step-10",
        "step": 10,
        "size_bytes": 3 * 2**30,
        "seconds": 6.0,
        "mib_s": 512.0,
        "final": False,
        "uri": None,
    }
    [restore_event] = kinds(daemon, EventKind.CHECKPOINT_RESTORED)
    assert (restore_event["attempt"], restore_event["to_region"]) == (2, "europe-west4")
    [failure] = daemon.store.events.list_events(kind=EventKind.CHECKPOINT_FAILED)
    assert failure.severity == "warning" and failure.data is not None
    assert (failure.data["name"], failure.data["error"]) == ("step-30", error[:2000])

    with api(daemon) as client:
        listed = client.get("/jobs/train/checkpoints").json()
    assert listed["job"] == "train"
    assert [
        (c["name"], c["step"], c["attempt"], c["final"], c["deleted"], c["restored_by"])
        for c in listed["checkpoints"]
    ] == [
        ("step-25", 25, 1, True, False, [2]),
        ("step-20", 20, 1, False, False, []),
        ("step-10", 10, 1, False, True, []),
    ]
    assert [c["committed_at"] for c in listed["checkpoints"]] == [
        "2026-01-15T12:01:00Z",
        "2026-01-15T12:00:00Z",  # its time was before its attempt began: the daemon's
        "2026-01-15T11:59:30Z",
    ]
    assert listed["checkpoints"][0]["uri"] == f"{BUCKET}/data/step-25"

    env = {"GPUOPT_API_TOKEN": TOKEN}
    shown = CliRunner().invoke(app, ["jobs", "checkpoints", "train", "--api", daemon.url], env=env)
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    assert lines[0].split() == ["NAME", "STEP", "SIZE", "WHERE", "WHEN", "RESTORED", "BY"]
    assert lines[1].split() == [
        "step-25",
        "(final)",
        "25",
        "3.0",
        "GiB",
        f"{BUCKET}/data/step-25",
        "(us-east-1)",
        "2026-01-15",
        "12:01:00",
        "UTC",
        "attempt",
        "2",
    ]
    assert lines[3].split()[-5:] == ["[pruned]", "2026-01-15", "11:59:30", "UTC", "-"]
    job_line = CliRunner().invoke(app, ["jobs", "show", "train", "--api", daemon.url], env=env)
    assert f"  checkpoints: {BUCKET} (us-east-1, keeps 3)" in job_line.stdout.splitlines()
    as_json = CliRunner().invoke(
        app, ["jobs", "checkpoints", "train", "--json", "--api", daemon.url], env=env
    )
    assert json.loads(as_json.stdout) == listed


@pytest.mark.parametrize(
    ("event", "field", "message"),
    [
        (committed("b1", "step-1", 1, size_bytes=-1), "size_bytes", "greater than or equal to 0"),
        (committed("b2", "step-1", 1, size_bytes=2**60), "size_bytes", "less than or equal"),
        (committed("b3", "../etc", 1), "name", "should match pattern"),
        (committed("b8", "..", 1), "name", "must not be '.' or '..'"),
        (committed("b4", "step-1", 1, final="yes"), "final", "valid boolean"),
        (committed("b5", "step-1", 1, seconds=float("inf")), "seconds", ""),
        (restored("b6", "step-1") | {"data": {"name": "step-1"}}, "size_bytes", "required"),
        ({"id": "b7", "kind": "checkpoint_pruned", "data": {"names": "step-1"}}, "names", ""),
    ],
)
def test_a_bad_report_is_refused_naming_the_field_and_nothing_is_kept(
    daemon: Daemon, event: dict[str, Any], field: str, message: str
) -> None:
    job = add(daemon)
    node = attempt(daemon, job, 1)
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        refused = client.post(
            "/agent/v1/events",
            content=json.dumps({"attempt_key": node[0], "events": [event]}, allow_nan=True),
            headers={"Authorization": f"Bearer {node[1]}", "Content-Type": "application/json"},
        )
    assert refused.status_code == 422, refused.text
    [problem, *_] = refused.json()["detail"]
    assert problem["loc"][:5] == ["body", "events", 0, "data", field]
    assert problem["msg"].startswith(event["kind"]) and message in problem["msg"]
    assert daemon.store.checkpoints.checkpoints(job) == []
    assert daemon.store.jobs.agent_events(node[0]) == []


def test_the_old_attempts_final_checkpoint_lifts_the_replacements_fence(
    daemon: Daemon, clock: ManualClock
) -> None:
    job = add(daemon)
    old, new = attempt(daemon, job, 1), attempt(daemon, job, 2)
    store = daemon.store
    store.jobs.update_attempt(old[0], registered_at=T0, job_started_at=T0)
    store.jobs.update_attempt(
        old[0], state="ended", ended_at=T0, end_reason="migrated", notice_at=None
    )
    waiting = post(daemon, new, "register", instance_id="i-2").json()
    assert waiting["fence"] == "attempt 1's job has not exited yet"
    clock.advance(30)
    post(daemon, old, "events", events=[committed("c1", "step-5", 5)])
    assert post(daemon, new, "events", events=[]).json()["fence"] is not None
    post(daemon, old, "events", events=[committed("c2", "step-6", 6, final=True)])
    assert post(daemon, new, "events", events=[]).json()["fence"] is None


def test_a_job_without_checkpoints_lists_none_and_an_unknown_job_is_a_404(daemon: Daemon) -> None:
    add(daemon, "shared", checkpoint=None, checkpoint_dir="/mnt/c")
    with api(daemon) as client:
        assert client.get("/jobs/shared/checkpoints").json() == {"job": "shared", "checkpoints": []}
        missing = client.get("/jobs/nope/checkpoints")
    assert missing.status_code == 404 and missing.json()["detail"] == "no job named 'nope'"
    env = {"GPUOPT_API_TOKEN": TOKEN}
    shown = CliRunner().invoke(app, ["jobs", "checkpoints", "shared", "--api", daemon.url], env=env)
    assert (shown.exit_code, shown.stdout) == (0, "shared: no checkpoints uploaded yet\n")
    gone = CliRunner().invoke(app, ["jobs", "checkpoints", "nope", "--api", daemon.url], env=env)
    assert gone.exit_code == 2 and "404: no job named 'nope'" in gone.stderr


def test_a_failure_report_says_what_failed(daemon: Daemon) -> None:
    job = add(daemon)
    node = attempt(daemon, job, 1)
    reports = [
        ("f1", "step-30", "Unreachable: s3://team-ckpt/x: cannot reach"),
        ("f2", "", "restore: Unreachable: s3://team-ckpt/x: cannot reach"),
        ("f3", "step-20", "restore: data/step-20/model.pt: sha256 differs"),
        ("f4", "", "AccessDenied: s3://team-ckpt/x: access denied"),
    ]
    events = [
        {"id": eid, "kind": "checkpoint_failed", "data": {"name": name, "error": error}}
        for eid, name, error in reports
    ]
    assert post(daemon, node, "events", events=events).status_code == 200
    found = daemon.store.events.recent(job_id=job, limit=100)
    messages = sorted(e.message for e in found if e.kind == EventKind.CHECKPOINT_FAILED)
    assert messages == sorted(
        [
            "job train: attempt 1 could not upload checkpoint step-30: Unreachable: "
            "s3://team-ckpt/x: cannot reach",
            "job train: attempt 1 could not restore a checkpoint, the job starts without one: "
            "Unreachable: s3://team-ckpt/x: cannot reach",
            "job train: attempt 1 could not restore checkpoint step-20, restoring an earlier "
            "one: data/step-20/model.pt: sha256 differs",
            "job train: attempt 1 could not use its checkpoint bucket: AccessDenied: "
            "s3://team-ckpt/x: access denied",
        ]
    )
