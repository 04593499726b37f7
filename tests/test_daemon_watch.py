"""Policy hot reload: valid edits swap in, bad edits keep the last good version and raise an
alert carrying every located problem, deleted policies in use stay, and restarts remember."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from optimizer.alerts import Emitter, Router
from optimizer.clock import ManualClock
from optimizer.daemon.loops.watch import PolicyWatcher
from optimizer.daemon.policies import ACTIVE, FILE_DELETED, FILE_INVALID, PolicyRegistry
from optimizer.store import Store
from tests.helpers import T0, api, make_config, policy_text, running, wait_until, write_policy

pytestmark = pytest.mark.usefixtures("daemon_env")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


BAD_GPUS = policy_text("small").replace("gpus: 1", "gpus: many")  # line 5, column 9


@pytest.fixture
def store(tmp_path: Path, clock: ManualClock):
    with Store(f"sqlite:///{tmp_path / 'watch.db'}", clock=clock) as db:
        db.create_all()
        yield db


@pytest.fixture
def policy_dir(tmp_path: Path) -> Path:
    return tmp_path / "policies"


def watcher(store: Store, policy_dir: Path, clock: ManualClock) -> PolicyWatcher:
    policy_dir.mkdir(exist_ok=True)
    emitter = Emitter(store.events, Router([], ["ops"]))
    return PolicyWatcher(policy_dir, PolicyRegistry(), store, emitter, clock)


def kinds(store: Store) -> list[str]:
    return [e.kind for e in reversed(store.events.list_events())]


def settle(w: PolicyWatcher) -> list[str]:
    """Two passes: the first sees the change, the second reads the settled file."""
    assert w.run_once() == [] or True
    return w.run_once()


def test_a_valid_edit_is_swapped_in_and_recorded(
    store: Store, policy_dir: Path, clock: ManualClock
) -> None:
    path = write_policy(policy_dir, "small.yaml", policy_text("small", memory=16))
    w = watcher(store, policy_dir, clock)
    assert w.run_once() == ["loaded"]
    first = w.registry.get("small")
    assert first is not None and first.status == ACTIVE

    write_policy(policy_dir, "small.yaml", policy_text("small", memory=40))
    assert w.run_once() == []  # seen, not read: the file may still be being written
    assert w.registry.get("small") is first
    assert w.run_once() == ["loaded"]
    now = w.registry.get("small")
    assert now is not None and now.policy.workload.gpu_memory_gib == 40
    assert kinds(store) == ["policy.loaded", "policy.loaded"]
    assert store.events.list_events()[0].message == f"policy small updated from {path}"
    assert [v.outcome for v in store.policies.policy_versions("small")] == ["loaded", "loaded"]
    assert w.run_once() == []  # nothing changed since


def test_a_bad_edit_keeps_the_last_good_version_and_the_alert_carries_the_line(
    store: Store, policy_dir: Path, clock: ManualClock
) -> None:
    path = write_policy(policy_dir, "small.yaml", policy_text("small", memory=16))
    w = watcher(store, policy_dir, clock)
    w.run_once()
    good = w.registry.get("small")

    write_policy(policy_dir, "small.yaml", BAD_GPUS)
    assert settle(w) == ["rejected"]
    kept = w.registry.get("small")
    assert kept is not None and kept.policy == good.policy and kept.sha256 == good.sha256
    line = f"{path}:5:9: workload.gpus: must be a whole number"
    assert kept.status == FILE_INVALID and kept.problems == (line,)
    [alert] = [a for a in store.events.due_alerts(clock()) if a.event.kind == "policy.rejected"]
    assert alert.event.severity == "warning"
    assert line in alert.event.message
    assert "the last good version of policy small stays in force" in alert.event.message
    assert alert.event.data["problems"] == [line]

    write_policy(policy_dir, "small.yaml", policy_text("small", memory=24))
    assert settle(w) == ["loaded"]
    fixed = w.registry.get("small")
    assert fixed.status == ACTIVE and fixed.policy.workload.gpu_memory_gib == 24
    assert w.registry.rejected() == {}


def test_a_new_broken_file_is_reported_with_nothing_kept(
    store: Store, policy_dir: Path, clock: ManualClock
) -> None:
    w = watcher(store, policy_dir, clock)
    w.run_once()
    path = write_policy(policy_dir, "new.yaml", "apiVersion: gpuopt/v1\nkind: Policy\n")
    assert settle(w) == ["rejected"]
    assert w.registry.snapshot() == {}
    rejected = w.registry.rejected()[str(path)]
    assert rejected.kept is None and rejected.problems == (
        f"{path}:1:1: name: required field is missing",
    )
    assert "no earlier version to keep" in store.events.list_events()[0].message


def test_a_deleted_policy_a_live_job_uses_stays_until_the_job_ends(
    store: Store, policy_dir: Path, clock: ManualClock
) -> None:
    path = write_policy(policy_dir, "small.yaml", policy_text("small"))
    write_policy(policy_dir, "other.yaml", policy_text("other"))
    w = watcher(store, policy_dir, clock)
    w.run_once()
    store.jobs.add_job("train", "small", {"run": "x"})
    path.unlink()
    (policy_dir / "other.yaml").unlink()
    assert sorted(w.run_once()) == ["kept", "removed"]
    kept = w.registry.get("small")
    assert kept is not None and kept.status == FILE_DELETED
    assert w.registry.get("other") is None
    deleted = [a.event for a in store.events.due_alerts(clock()) if a.event.kind == "policy.kept"]
    assert len(deleted) == 1 and deleted[0].severity == "warning"

    assert w.run_once() == []  # still in use: still kept, no new alert
    train = store.jobs.get_job("train")
    assert train is not None
    store.jobs.transition_job(
        train.id, expected="pending", state="cancelled", reason="cancelled", at=clock()
    )
    assert w.run_once() == ["removed"]
    assert w.registry.snapshot() == {}


def test_two_files_cannot_define_one_policy(
    store: Store, policy_dir: Path, clock: ManualClock
) -> None:
    first = write_policy(policy_dir, "a.yaml", policy_text("small"))
    second = write_policy(policy_dir, "b.yaml", policy_text("small", memory=40))
    w = watcher(store, policy_dir, clock)
    assert w.run_once() == ["loaded", "rejected"]
    assert w.registry.get("small").path == str(first)
    assert w.registry.rejected()[str(second)].problems == (
        f"{second}: name: policy 'small' is already defined in {first}",
    )


def test_a_restart_keeps_the_last_good_version_of_a_file_broken_meanwhile(
    store: Store, policy_dir: Path, clock: ManualClock
) -> None:
    write_policy(policy_dir, "small.yaml", policy_text("small", memory=16))
    watcher(store, policy_dir, clock).run_once()
    write_policy(policy_dir, "small.yaml", BAD_GPUS)  # edited while the daemon was down

    restarted = watcher(store, policy_dir, clock)
    assert restarted.run_once() == ["rejected"]
    kept = restarted.registry.get("small")
    assert kept is not None and kept.status == FILE_INVALID
    assert kept.policy.workload.gpu_memory_gib == 16

    again = watcher(store, policy_dir, clock)  # a second restart: nothing new to say
    assert again.run_once() == []
    assert again.registry.get("small").status == FILE_INVALID
    assert kinds(store) == ["policy.loaded", "policy.rejected"]


def test_a_restart_keeps_a_policy_deleted_meanwhile_while_a_job_uses_it(
    store: Store, policy_dir: Path, clock: ManualClock
) -> None:
    path = write_policy(policy_dir, "small.yaml", policy_text("small"))
    watcher(store, policy_dir, clock).run_once()
    store.jobs.add_job("train", "small", {"run": "x"})
    path.unlink()
    restarted = watcher(store, policy_dir, clock)
    assert restarted.run_once() == ["kept"]
    assert restarted.registry.get("small").status == FILE_DELETED


def test_the_running_daemon_reloads_and_alerts_on_a_bad_edit(
    tmp_path: Path, httpserver: HTTPServer
) -> None:
    received: list[dict] = []

    def hook(request: Request) -> Response:
        received.append(json.loads(request.get_data()))
        return Response("ok")

    httpserver.expect_request("/hook").respond_with_handler(hook)
    policy_dir = tmp_path / "policies"
    path = write_policy(policy_dir, "small.yaml", policy_text("small", memory=16))
    config = make_config(
        tmp_path,
        alerts={
            "channels": {
                "hook": {
                    "type": "webhook",
                    "url": httpserver.url_for("/hook"),
                    "secret": "a-long-enough-secret",
                }
            },
            "routes": [{"kinds": ["policy.rejected"], "channels": ["hook"]}],
        },
    )
    with running(config) as daemon, api(daemon) as client:
        write_policy(policy_dir, "small.yaml", policy_text("small", memory=30))
        wait_until(
            lambda: (
                client.get("/policies/small").json()["spec"]["workload"]["gpu_memory_gib"] == 30
            ),
            what="the edit to be in force",
        )
        write_policy(policy_dir, "small.yaml", BAD_GPUS)
        wait_until(lambda: received, what="the policy.rejected alert")
        shown = client.get("/policies").json()
    [alert] = received
    assert alert["kind"] == "policy.rejected"
    assert f"{path}:5:9: workload.gpus: must be a whole number" in alert["message"]
    [policy] = shown["policies"]
    assert policy["status"] == FILE_INVALID and policy["problems"] == alert["data"]["problems"]
    assert shown["rejected_files"][0]["kept"] == "small"


def test_a_new_file_takes_over_a_deleted_policy_kept_for_its_jobs(
    store: Store, policy_dir: Path, clock: ManualClock
) -> None:
    old = write_policy(policy_dir, "small.yaml", policy_text("small", memory=16))
    w = watcher(store, policy_dir, clock)
    w.run_once()
    store.jobs.add_job("train", "small", {"run": "x"})
    old.unlink()
    assert w.run_once() == ["kept"]
    new = write_policy(policy_dir, "renamed.yaml", policy_text("small", memory=32))
    assert settle(w) == ["loaded"]
    now = w.registry.get("small")
    assert now.path == str(new) and now.status == ACTIVE
    assert now.policy.workload.gpu_memory_gib == 32


def test_a_removed_policy_is_not_revived_by_a_broken_file_at_its_old_path(
    store: Store, policy_dir: Path, clock: ManualClock
) -> None:
    path = write_policy(policy_dir, "small.yaml", policy_text("small"))
    w = watcher(store, policy_dir, clock)
    w.run_once()
    path.unlink()
    assert w.run_once() == ["removed"]
    write_policy(policy_dir, "small.yaml", BAD_GPUS)
    assert settle(w) == ["rejected"]
    assert w.registry.snapshot() == {}
    assert watcher(store, policy_dir, clock).run_once() == []  # nor after a restart


def test_a_follower_loads_without_recording_and_records_on_becoming_leader(
    store: Store, policy_dir: Path, clock: ManualClock
) -> None:
    leading = False
    w = watcher(store, policy_dir, clock)
    w.records = lambda: leading
    write_policy(policy_dir, "small.yaml", policy_text("small", memory=16))
    assert w.run_once() == ["loaded"]
    assert w.registry.get("small") is not None  # in force on the follower, for its API
    assert store.policies.latest_policy_versions() == {} and kinds(store) == []  # nothing written

    write_policy(policy_dir, "small.yaml", policy_text("small", memory=40))
    assert settle(w) == ["loaded"]
    assert store.policies.latest_policy_versions() == {}

    leading = True  # promoted: the next pass compares every file with the store's records
    w.resync()
    assert w.run_once() == ["loaded"]
    (version,) = store.policies.latest_policy_versions().values()
    assert version.outcome == "loaded" and "gpu_memory_gib: 40" in (version.text or "")
    assert kinds(store) == ["policy.loaded"]
    w.resync()  # nothing changed since: a second resync records nothing more
    assert w.run_once() == []
    assert kinds(store) == ["policy.loaded"]


def test_a_directory_or_fifo_named_yaml_is_reported_like_any_bad_file(
    store: Store, policy_dir: Path, clock: ManualClock
) -> None:
    w = watcher(store, policy_dir, clock)
    (policy_dir / "folder.yaml").mkdir()
    os.mkfifo(policy_dir / "pipe.yaml")  # no writer: opening it for a read must not block
    assert w.run_once() == ["rejected", "rejected"]
    assert w.registry.snapshot() == {}
    rejected = w.registry.rejected()
    assert rejected[str(policy_dir / "folder.yaml")].problems == (
        f"{policy_dir / 'folder.yaml'}: is a directory, not a policy file",
    )
    assert rejected[str(policy_dir / "pipe.yaml")].problems == (
        f"{policy_dir / 'pipe.yaml'}: is a FIFO, not a policy file",
    )
    assert kinds(store) == ["policy.rejected", "policy.rejected"]
    # Reported once: a later pass (the folder's contents changing included) stays quiet.
    (policy_dir / "folder.yaml" / "inner").write_text("x")
    assert settle(w) == [] and w.run_once() == []
    assert len(store.events.list_events()) == 2
    # Removed: the report goes with it.
    (policy_dir / "pipe.yaml").unlink()
    w.run_once()
    assert list(w.registry.rejected()) == [str(policy_dir / "folder.yaml")]
