"""Checkpoints and code follow the job through object storage, end to end on the local cloud.

A real daemon, real agent processes on the local cloud, the example training job shipped as a
code archive, and real object-storage servers (moto_server for S3, the GCS emulator): the
job is interrupted, its replacement lands in another region, restores the last checkpoint
from the bucket and carries on; the daemon's rows, the checkpoints listing and the ledger's
storage and egress lines agree with what happened.

The agents reach the bucket through the daemon config's `agent.env` (instances on the local
cloud inherit only basic variables); the daemon itself, which asks the bucket's region at
submit, through this process's environment.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import sys
import uuid
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from optimizer.checkpoints import list_checkpoints
from optimizer.clock import Clock, SteadyClock
from optimizer.code import pack
from optimizer.daemon.service import Daemon
from optimizer.storage import open_store
from optimizer.store.records import CheckpointRecord, RestoreRecord
from providers.local import LocalCloud
from tests.helpers import wait_until, write_policy
from tests.helpers.cloud import local_cloud
from tests.helpers.daemon import TOKEN, api, make_config, run_gpuopt, running
from tests.helpers.jobs import MID_MONTH, running_instance, running_instance_id, state_of
from tests.helpers.objstore import GcsServer, S3Server, s3_server

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("daemon_env")]

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
POLICY = """\
apiVersion: gpuopt/v1
kind: Policy
name: ckpt-eu
workload: {{gpus: 1, gpu_memory_gib: 12, gpu_models: [T4]}}
markets: [spot]
placement: {{providers: [local], compliance: eu, regions: {{allow: [{regions}]}}}}
recovery: {{max_restarts: 5, pool_cooldown_minutes: 10, on_demand_after_interruptions: 5}}
"""
REGIONS = ("eu-central-1", "eu-west-1")
# Hand-copied from the rate tables, so the ledger is checked against figures it did not compute:
# policies/storage_rates.csv `aws,*` and `gcp,*` (S3 / GCS Standard, USD per GB-month), and
# policies/egress_rates.csv `aws,other-cloud` / `gcp,other-cloud` (a bucket in AWS or GCP read
# by an instance of the local cloud leaves its cloud: the internet rate, first tier).
STORAGE_USD_PER_GB_MONTH = {"aws": 0.023, "gcp": 0.023}
EGRESS_USD_PER_GB = {"aws": 0.09, "gcp": 0.12}
SECONDS_PER_MONTH = 730 * 3600


def run_command(steps: int) -> str:
    return (
        f"{sys.executable} train_with_checkpoints.py --engine numpy --steps {steps} "
        "--checkpoint-every 5 --step-sleep 0.05 --log-every 100"
    )


@pytest.fixture
def clock() -> Clock:
    return SteadyClock(MID_MONTH)


@pytest.fixture
def cloud(tmp_path: Path, clock: Clock) -> Iterator[LocalCloud]:
    """The local cloud with a power-off 6 s after a notice: time for the job's checkpoint on
    SIGTERM and its upload to a real (local) object store on a loaded machine."""
    with local_cloud(
        tmp_path / "local-cloud",
        grace_s=6.0,
        terminate_grace_s=2.0,
        tick_s=0.05,
        clock=lambda: clock().timestamp(),
    ) as local:
        yield local


@contextlib.contextmanager
def ckpt_daemon(
    tmp_path: Path,
    cloud: LocalCloud,
    clock: Clock,
    agent_env: Mapping[str, str],
    regions: tuple[str, ...] = REGIONS,
) -> Iterator[Daemon]:
    """A running daemon on `cloud` with the `ckpt-eu` policy, its agents given `agent_env`."""
    write_policy(tmp_path / "policies", "ckpt-eu.yaml", POLICY.format(regions=", ".join(regions)))
    config = make_config(
        tmp_path,
        policy_dir=tmp_path / "policies",
        loops={"reconcile_s": 0.25},
        agent={"env": dict(agent_env)},
    )
    with running(config, sources={"local": cloud}, clock=clock) as d:
        for poll in d.polls:  # offers in the store before the first job
            poll.run_once()
        yield d


def use_env(monkeypatch: pytest.MonkeyPatch, env: Mapping[str, str]) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def submit_with_code(tmp_path: Path, daemon: Daemon, name: str, uri: str, steps: int) -> None:
    """`gpuopt jobs submit SPEC --code examples/`: the CLI packs and uploads the folder."""
    spec = tmp_path / "specs" / f"{name}.yaml"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(
        f"name: {name}\npolicy: ckpt-eu\nrun: {run_command(steps)}\n"
        f"checkpoint: {uri}\nprobes: none\n"
    )
    env = {"GPUOPT_API_URL": daemon.url, "GPUOPT_API_TOKEN": TOKEN}
    done = run_gpuopt(
        tmp_path / "cli", "jobs", "submit", str(spec), "--code", str(EXAMPLES), env=env
    )
    assert done.returncode == 0, done.stderr
    assert "code: sha256:" in done.stdout


def submit_through_api(tmp_path: Path, daemon: Daemon, body: dict[str, Any]) -> Any:
    """Pack examples/ here, PUT it to /code/{sha256}, then POST the job naming it."""
    archive = pack(EXAMPLES, tmp_path / "packed")
    with api(daemon) as client:
        put = client.put(f"/code/{archive.sha256}", content=archive.path.read_bytes())
        assert put.status_code == 201, put.text
        body = {**body, "code": {"sha256": archive.sha256, "size": archive.size}}
        return client.post("/jobs", json=body)


def job_id(daemon: Daemon, name: str) -> int:
    return int(state_of(daemon, name)["id"])


def attempt_rows(daemon: Daemon, name: str) -> dict[int, Any]:
    return {a.number: a for a in daemon.store.jobs.attempts(job_id(daemon, name))}


def uploaded_step(daemon: Daemon, name: str, attempt: int) -> int:
    """The highest step attempt `attempt` uploaded to the bucket (0: none yet)."""
    rows = attempt_rows(daemon, name)
    if attempt not in rows:
        return 0
    mine = [
        c.step or 0
        for c in daemon.store.checkpoints.checkpoints(job_id(daemon, name))
        if c.attempt_id == rows[attempt].id
    ]
    return max(mine, default=0)


def region_away(cloud: LocalCloud, region: str) -> None:
    """Take the capacity of every spot pool of `region` away."""
    for offer in cloud.fetch_offers([region]):
        if offer.market.value == "spot":
            cloud.set_capacity(f"{offer.instance_type}@{offer.zone}", available=False)


def interrupt_after_progress(
    daemon: Daemon, cloud: LocalCloud, name: str, attempt: int, beyond: int
) -> None:
    """Wait for attempt `attempt` to run and upload a checkpoint past step `beyond` + 20,
    then interrupt its instance and wait for the power-off."""
    instance = wait_until(
        lambda: running_instance(cloud, name, attempt), 60, f"attempt {attempt} running"
    )
    want = beyond + 20
    wait_until(
        lambda: uploaded_step(daemon, name, attempt) >= want, 60, f"a checkpoint at step {want}"
    )
    cloud.interrupt(instance)
    wait_until(lambda: not running_instance_id(cloud, instance), 60, "the power-off")


def bucket_summary(uri: str) -> dict[str, Any]:
    """The example's run summary, from the newest checkpoint in the bucket."""
    store = open_store(uri)
    newest = list_checkpoints(store)[0]
    return dict(json.loads(store.get_bytes(f"data/{newest.name}/done.json")))


def events_of(daemon: Daemon, name: str, kind: str) -> list[Any]:
    found = daemon.store.events.recent(job_id=job_id(daemon, name), limit=1000)
    return sorted((e for e in found if e.kind == kind), key=lambda e: e.id)


def expected_storage_usd(checkpoints: list[CheckpointRecord], until: datetime) -> float:
    total = 0.0
    for c in checkpoints:
        end = c.deleted_at if c.deleted_at is not None else until
        seconds = max((end - c.committed_at).total_seconds(), 0.0)
        total += (
            c.size_bytes / 1e9 * seconds / SECONDS_PER_MONTH * STORAGE_USD_PER_GB_MONTH[c.provider]
        )
    return total


def expected_egress_usd(restores: list[RestoreRecord]) -> float:
    return sum(r.fetched_bytes / 1e9 * EGRESS_USD_PER_GB[r.from_provider] for r in restores)


def check_ledger(daemon: Daemon, clock: Clock, name: str) -> None:
    """`GET /costs?by=market` has the job's storage and egress lines, each equal to the hand
    computation from its rows (storage still kept is priced up to the request's time)."""
    jid = job_id(daemon, name)
    checkpoints = daemon.store.checkpoints.checkpoints(jid)
    restores = daemon.store.checkpoints.restores(jid)
    before = clock()
    with api(daemon) as client:
        answer = client.get("/costs", params={"by": "market", "job": name})
    after = clock()
    assert answer.status_code == 200, answer.text
    groups = {g["group"]: g for g in answer.json()}
    storage = groups["checkpoint-storage"]["storage_usd"]
    low, high = (expected_storage_usd(checkpoints, t) for t in (before, after))
    assert 0 < low <= storage * (1 + 1e-9) and storage <= high * (1 + 1e-9), (low, storage, high)
    egress = groups["egress"]["network_usd"]
    assert egress > 0
    assert egress == pytest.approx(expected_egress_usd(restores), rel=1e-9)


def check_handovers(daemon: Daemon, name: str, attempts: int) -> None:
    """Each attempt after the first restored the checkpoint its predecessor committed last
    (its final one, uploaded on the way out): no step is lost between attempts."""
    jid = job_id(daemon, name)
    rows = attempt_rows(daemon, name)
    checkpoints = daemon.store.checkpoints.checkpoints(jid)
    restores = {r.attempt_id: r for r in daemon.store.checkpoints.restores(jid)}
    for number in range(1, attempts):
        before, after = rows[number], rows[number + 1]
        mine = [c for c in checkpoints if c.attempt_id == before.id]
        last = max(mine, key=lambda c: c.step or 0)
        # Its last checkpoint is the one the next attempt restored. It is marked final when
        # the job committed it after the stop reached the agent; one the job saved under the
        # same step just before (a periodic save) may stay unmarked: no step is lost either way
        # (check_runs), only the fence waits for the old job's exit instead.
        assert after.id in restores, f"attempt {number + 1} restored nothing"
        assert restores[after.id].checkpoint_name == last.name
        assert restores[after.id].to_region == after.region
    # Every checkpoint an attempt uploaded is in the events (final or not: the fence lifts on
    # a final one, else on the old job's exit, and the restores above prove neither came early).
    committed = events_of(daemon, name, "checkpoint.committed")
    assert {e.data["attempt"] for e in committed} >= set(range(1, attempts))


def check_runs(summary: dict[str, Any], steps: int, attempts: int) -> None:
    assert summary["steps"] == steps
    runs = summary["runs"]
    assert len(runs) == attempts
    assert [r["restarts"] for r in runs] == [str(n) for n in range(attempts)]
    assert runs[0]["from_step"] == 0
    for before, after in itertools.pairwise(runs):
        assert after["from_step"] == before["to_step"] > 0  # resumed where it stopped
    assert runs[-1]["to_step"] == steps


# --- S3 -----------------------------------------------------------------------------------------


def test_s3_checkpoints_follow_the_job_across_two_interruptions_and_regions(
    tmp_path: Path,
    cloud: LocalCloud,
    clock: Clock,
    object_s3: S3Server,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    use_env(monkeypatch, object_s3.env)
    bucket = object_s3.make_bucket(unique("ckpt"), region="eu-central-1")
    uri = f"{bucket}/train"
    name, steps = "train-s3", 300
    with ckpt_daemon(tmp_path, cloud, clock, object_s3.env) as daemon:
        submit_with_code(tmp_path, daemon, name, uri, steps)
        job = state_of(daemon, name)
        assert job["spec"]["checkpoint"]["region"] == "eu-central-1"  # asked of the bucket
        assert job["spec"]["code"]["sha256"]

        interrupt_after_progress(daemon, cloud, name, 1, 0)
        # the second replacement must land in another region than the second attempt's
        second = wait_until(lambda: attempt_rows(daemon, name).get(2), 60, "attempt 2")
        region_away(cloud, second.region)
        interrupt_after_progress(daemon, cloud, name, 2, uploaded_step(daemon, name, 1))
        wait_until(lambda: state_of(daemon, name)["state"] == "succeeded", 120, "the job to end")

        rows = attempt_rows(daemon, name)
        assert sorted(rows) == [1, 2, 3]
        assert rows[3].region != rows[2].region
        assert {rows[n].region for n in rows} <= set(REGIONS)
        check_runs(bucket_summary(uri), steps, 3)
        check_handovers(daemon, name, 3)

        jid = job_id(daemon, name)
        restores = daemon.store.checkpoints.restores(jid)
        assert sorted(rows_by_id(rows)[r.attempt_id] for r in restores) == [2, 3]
        for r in restores:
            assert (r.from_provider, r.from_region) == ("aws", "eu-central-1")
            assert r.to_provider == "local" and r.fetched_bytes > 0
        assert [e.data["attempt"] for e in events_of(daemon, name, "checkpoint.restored")] == [
            2,
            3,
        ]

        # the bucket holds what the rows say is kept: the newest `keep` (3), manifests last
        kept = [c for c in daemon.store.checkpoints.checkpoints(jid) if c.deleted_at is None]
        keys = {o["Key"] for o in object_s3.client().list_objects_v2(Bucket=bucket[5:])["Contents"]}
        manifests = {k for k in keys if k.startswith("train/manifests/")}
        assert manifests == {f"train/manifests/{c.name}.json" for c in kept}
        assert len(manifests) == 3
        assert all(any(k.startswith(f"train/data/{c.name}/") for k in keys) for c in kept)

        listed = run_gpuopt(
            tmp_path / "cli",
            "jobs",
            "checkpoints",
            name,
            "--json",
            env={"GPUOPT_API_URL": daemon.url, "GPUOPT_API_TOKEN": TOKEN},
        )
        assert listed.returncode == 0, listed.stderr
        shown = json.loads(listed.stdout)["checkpoints"]
        assert {c["name"] for c in shown if not c["deleted"]} == {c.name for c in kept}
        assert sorted(n for c in shown for n in c["restored_by"]) == [2, 3]
        assert all(c["uri"].startswith(f"{uri}/data/") for c in shown)

        check_ledger(daemon, clock, name)


def rows_by_id(rows: dict[int, Any]) -> dict[int, int]:
    return {a.id: number for number, a in rows.items()}


# --- GCS ----------------------------------------------------------------------------------------


def test_gcs_checkpoints_follow_the_job_across_an_interruption(
    tmp_path: Path,
    cloud: LocalCloud,
    clock: Clock,
    object_gcs: GcsServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    use_env(monkeypatch, object_gcs.env)
    bucket = object_gcs.make_bucket(unique("ckpt"), location="EUROPE-WEST4")
    uri = f"{bucket}/train"
    name, steps = "train-gs", 300
    with ckpt_daemon(tmp_path, cloud, clock, object_gcs.env) as daemon:
        body = {
            "name": name,
            "policy": "ckpt-eu",
            "run": run_command(steps),
            "checkpoint": {"uri": uri, "keep": 2},
            "probes": "none",
        }
        answer = submit_through_api(tmp_path, daemon, body)
        assert answer.status_code == 201, answer.text
        assert answer.json()["spec"]["checkpoint"]["region"] == "europe-west4"

        interrupt_after_progress(daemon, cloud, name, 1, 0)
        wait_until(lambda: state_of(daemon, name)["state"] == "succeeded", 120, "the job to end")

        check_runs(bucket_summary(uri), steps, 2)
        check_handovers(daemon, name, 2)
        (restore,) = daemon.store.checkpoints.restores(job_id(daemon, name))
        assert (restore.from_provider, restore.from_region) == ("gcp", "europe-west4")
        assert len(list_checkpoints(open_store(uri))) == 2  # keep: 2
        check_ledger(daemon, clock, name)


# --- faults -------------------------------------------------------------------------------------


def test_a_missing_bucket_and_one_outside_the_residency_are_refused_naming_the_field(
    tmp_path: Path,
    cloud: LocalCloud,
    clock: Clock,
    object_s3: S3Server,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    use_env(monkeypatch, object_s3.env)
    far = object_s3.make_bucket(unique("far"), region="us-east-1")
    body = {"policy": "ckpt-eu", "run": "true", "probes": "none"}
    with ckpt_daemon(tmp_path, cloud, clock, object_s3.env) as daemon, api(daemon) as client:
        missing = client.post(
            "/jobs", json={**body, "name": "gone", "checkpoint": f"s3://{unique('none')}/x"}
        )
        assert missing.status_code == 422, missing.text
        (problem,) = missing.json()["detail"]
        assert problem["loc"] == ["body", "checkpoint", "uri"]
        assert "cannot be used" in problem["msg"] and "NoSuchBucket" in problem["msg"]

        abroad = client.post("/jobs", json={**body, "name": "abroad", "checkpoint": f"{far}/x"})
        assert abroad.status_code == 422, abroad.text
        (problem,) = abroad.json()["detail"]
        assert problem["loc"] == ["body", "checkpoint", "uri"]
        assert "us-east-1" in problem["msg"] and "data residency" in problem["msg"]
        for refused in ("gone", "abroad"):
            assert client.get(f"/jobs/{refused}").status_code == 404


def test_a_bucket_gone_during_a_handover_leaves_the_job_running_and_says_so(
    tmp_path: Path, cloud: LocalCloud, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/checkpoints.md, "When things fail": uploads that fail are reported and retried
    while the job runs; the final upload that cannot finish is tried until the stop's grace
    or the power-off ends it; the replacement's restore is tried three times, then its job
    starts without a checkpoint, and `checkpoint_failed` says why; the last checkpoint of a
    job that ends on its own is tried for GPUOPT_AGENT_FLUSH_S before its exit is reported."""
    # long enough (0.05 s a step) that the first attempt is still training when its
    # interruption comes, after the outage and the failed upload, on a loaded host
    name, steps = "orphaned", 600
    with contextlib.ExitStack() as outage:
        s3 = outage.enter_context(s3_server())
        use_env(monkeypatch, s3.env)
        bucket = s3.make_bucket(unique("ckpt"), region="eu-central-1")
        # the agent tries the upload of a job's last checkpoint this long (120 s by default)
        agent_env = {**s3.env, "GPUOPT_AGENT_FLUSH_S": "10"}
        with ckpt_daemon(tmp_path, cloud, clock, agent_env) as daemon:
            submit_with_code(tmp_path, daemon, name, f"{bucket}/train", steps)
            instance = wait_until(lambda: running_instance(cloud, name, 1), 60, "attempt 1")
            wait_until(lambda: uploaded_step(daemon, name, 1) >= 5, 60, "a first checkpoint")
            outage.close()  # the store is gone from here on
            wait_until(
                lambda: events_of(daemon, name, "checkpoint.failed"), 60, "the upload's failure"
            )
            cloud.interrupt(instance)
            wait_until(lambda: not running_instance_id(cloud, instance), 60, "the power-off")
            wait_until(lambda: state_of(daemon, name)["state"] == "succeeded", 120, "the end")

            rows = attempt_rows(daemon, name)
            assert sorted(rows) == [1, 2]
            # The stop's grace (30 s) outlasts the power-off (6 s here, GCP's 30 s): the final
            # upload is still being tried when the instance ends, so the job's exit is never
            # reported; the daemon learns it from the instance's end, and the replacement's
            # job starts only then.
            assert rows[1].end_reason == "preempted" and rows[1].exit_code is None
            assert rows[2].job_started_at is not None and rows[1].ended_at is not None
            assert rows[2].job_started_at >= rows[1].ended_at
            failed = events_of(daemon, name, "checkpoint.failed")
            uploads = [e for e in failed if not e.data["error"].startswith("restore: ")]
            assert {e.data["attempt"] for e in uploads} == {1, 2}  # tried while each ran
            assert any("Unreachable" in e.data["error"] for e in uploads)
            restore = [e for e in failed if e.data["error"].startswith("restore: ")]
            assert [e.data["attempt"] for e in restore] == [2]
            assert "Unreachable" in restore[0].data["error"]
            assert "could not restore a checkpoint, the job starts without one" in (
                restore[0].message
            )
            assert any(
                f"could not upload checkpoint {e.data['name']}: Unreachable" in e.message
                for e in uploads
                if e.data["name"]
            )
            assert daemon.store.checkpoints.restores(job_id(daemon, name)) == []
            # the replacement's job found no checkpoint and ran from the start
            (done,) = (tmp_path / "local-cloud").rglob("checkpoints/done.json")
            summary = json.loads(done.read_text())
            assert summary["steps"] == steps
            assert [(r["restarts"], r["from_step"]) for r in summary["runs"]] == [("1", 0)]
