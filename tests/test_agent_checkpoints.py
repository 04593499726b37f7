"""The agent with a job whose checkpoints follow it (docs/checkpoints.md), in-process with a
scripted daemon and a fake object store: uploads while the job runs, the restore before the
next attempt's job starts, the final upload at a stop, the prefetch at a fence."""

from __future__ import annotations

import importlib
import json
import os
import threading
from pathlib import Path

import pytest

from optimizer.agent import Agent, AgentConfig
from optimizer.checkpoints import Uploader, commit, list_checkpoints
from optimizer.common.retry import Backoff
from tests.helpers import wait_until
from tests.helpers.agent_checkpoints import URI, FencedDaemon, agent_on, answer, data_of
from tests.helpers.agent_loop import ScriptedDaemon, ScriptedWatcher
from tests.helpers.fake_store import FakeStore


def test_committed_checkpoints_reach_the_store_and_the_next_attempt_starts_from_the_newest(
    tmp_path: Path,
) -> None:
    store = FakeStore(tmp_path / "bucket")
    first = ScriptedDaemon(answer(tmp_path, STEPS="2"))
    assert agent_on(tmp_path / "i-1", first, store).run() == 0
    assert [m.name for m in list_checkpoints(store)] == ["step-2", "step-1"]
    committed = data_of(first, "checkpoint_committed")
    assert sorted(c["name"] for c in committed) == ["step-1", "step-2"]
    assert {c["size_bytes"] for c in committed} == {len("weights 1")}
    assert first.kinds().index("job_exited") > max(
        i for i, k in enumerate(first.kinds()) if k == "checkpoint_committed"
    )
    # A second attempt on a fresh instance: step-2 is back before the job starts.
    second = ScriptedDaemon(answer(tmp_path, STEPS="0"))
    assert agent_on(tmp_path / "i-2", second, store).run() == 0
    kinds = second.kinds()
    assert kinds.index("checkpoint_restored") < kinds.index("job_started")
    [restored] = data_of(second, "checkpoint_restored")
    assert restored["name"] == "step-2" and restored["step"] == 2
    assert restored["fetched_bytes"] == restored["size_bytes"] == len("weights 2")
    log = (tmp_path / "i-2" / "agent" / "job.log").read_text()
    assert "found step-2 weights 2" in log and "found step-1" not in log
    local = tmp_path / "i-2" / "checkpoints"
    assert json.loads((local / "step-2" / ".gpuopt-committed").read_text()) == {"step": 2}
    # Nothing restored was sent back up.
    assert data_of(second, "checkpoint_committed") == []


def test_a_corrupt_newest_checkpoint_is_reported_and_the_one_before_restored(
    tmp_path: Path,
) -> None:
    store = FakeStore(tmp_path / "bucket")
    assert agent_on(tmp_path / "i-1", ScriptedDaemon(answer(tmp_path, STEPS="2")), store).run() == 0
    store.corrupt("data/step-2/model.txt")
    second = ScriptedDaemon(answer(tmp_path, STEPS="0"))
    assert agent_on(tmp_path / "i-2", second, store).run() == 0
    [failed] = data_of(second, "checkpoint_failed")
    assert failed["name"] == "step-2" and "sha256" in failed["error"]
    [restored] = data_of(second, "checkpoint_restored")
    assert restored["name"] == "step-1"
    assert "found step-1 weights 1" in (tmp_path / "i-2" / "agent" / "job.log").read_text()


def test_a_stop_uploads_the_final_checkpoint_before_the_exit_is_reported(tmp_path: Path) -> None:
    store = FakeStore(tmp_path / "bucket")
    daemon = ScriptedDaemon(answer(tmp_path, STEPS="1", FOREVER="1"))
    agent = agent_on(tmp_path / "i-1", daemon, store)
    result: dict[str, int] = {}
    threading.Thread(target=lambda: result.setdefault("code", agent.run()), daemon=True).start()
    wait_until(lambda: "checkpoint_committed" in daemon.kinds(), what="the first upload")
    daemon.commands.append({"kind": "stop", "reason": "interrupted", "grace_s": 10})
    wait_until(lambda: "code" in result, timeout=20, what="the agent to finish")
    kinds = daemon.kinds()
    final = [c for c in data_of(daemon, "checkpoint_committed") if c["final"]]
    assert [c["name"] for c in final] == ["step-99"]
    last_commit = max(i for i, k in enumerate(kinds) if k == "checkpoint_committed")
    assert last_commit < kinds.index("job_exited") < kinds.index("stopped")
    assert list_checkpoints(store)[0].name == "step-99"


def test_a_fenced_agent_prefetches_so_the_restore_fetches_only_what_changed(
    tmp_path: Path,
) -> None:
    store = FakeStore(tmp_path / "bucket")
    old = tmp_path / "old-instance"
    big = os.urandom(128 * 1024)
    up = Uploader(store, old)
    (old / "step-1").mkdir(parents=True)
    (old / "step-1" / "weights.bin").write_bytes(big)
    (old / "step-1" / "model.txt").write_text("weights 1")
    commit(old / "step-1", 1)
    up.flush(10)
    daemon = FencedDaemon(answer(tmp_path, STEPS="0"))
    instance = tmp_path / "i-2"
    agent = agent_on(instance, daemon, store)
    result: dict[str, int] = {}
    threading.Thread(target=lambda: result.setdefault("code", agent.run()), daemon=True).start()
    staged = instance / "checkpoint-staging" / "step-1" / ".gpuopt-committed"
    wait_until(staged.exists, what="the prefetch at the fence")
    assert agent.state == "fenced" and "job_started" not in daemon.kinds()
    # The old job's final checkpoint: the same weights, a new small file.
    (old / "step-2").mkdir()
    (old / "step-2" / "weights.bin").write_bytes(big)
    (old / "step-2" / "model.txt").write_text("weights 2")
    commit(old / "step-2", 2)
    up.flush(10)
    daemon.fenced.clear()
    wait_until(lambda: "code" in result, timeout=20, what="the agent to finish")
    [restored] = data_of(daemon, "checkpoint_restored")
    assert restored["name"] == "step-2"
    # The restore fetched only the changed file; the weights came with the prefetch, which
    # counts in the bytes that crossed the network for this attempt (the ledger's egress).
    prefetched = len(big) + len("weights 1")
    assert restored["prefetched_bytes"] == prefetched
    assert restored["fetched_bytes"] == len("weights 2") + prefetched
    assert restored["reused_bytes"] == len(big)
    assert "found step-2 weights 2" in (instance / "agent" / "job.log").read_text()
    assert not (instance / "checkpoint-staging").exists()


def test_an_unreachable_store_is_retried_reported_and_the_job_runs_anyway(
    tmp_path: Path,
) -> None:
    store = FakeStore(tmp_path / "bucket")
    store.unreachable = True
    daemon = ScriptedDaemon(answer(tmp_path, STEPS="1"))
    agent = agent_on(tmp_path / "i-1", daemon, store, checkpoint_min_flush_s=0.2, flush_s=0.2)
    assert agent.run() == 0
    assert "done" in (tmp_path / "i-1" / "agent" / "job.log").read_text()
    failed = data_of(daemon, "checkpoint_failed")
    assert failed[0]["name"] == "" and failed[0]["error"].startswith("restore: FakeUnreachable")
    assert failed[1]["name"] == "step-1" and "could not connect" in failed[1]["error"]
    assert len(failed) == 2  # the retries go on quietly
    assert data_of(daemon, "checkpoint_committed") == []
    # The checkpoint is still on the disk for an agent that comes back to it.
    assert (tmp_path / "i-1" / "checkpoints" / "step-1" / ".gpuopt-committed").exists()


def test_an_unopenable_store_is_reported_and_the_job_runs(tmp_path: Path) -> None:
    daemon = ScriptedDaemon(answer(tmp_path, STEPS="1"))
    config = AgentConfig(
        daemon_url="http://d",
        token="t",
        attempt_key="train/1",
        metadata_kind="aws-imds",
        cloud="local",
        agent_dir=tmp_path / "i-1" / "agent",
    )

    def broken(uri: str) -> FakeStore:
        raise ValueError(f"{uri}: no credentials")

    agent = Agent(
        config,
        client=daemon,  # type: ignore[arg-type]
        watcher=ScriptedWatcher(),
        send_backoff=Backoff(base=0.01, cap=0.05),
        telemetry_source=lambda: None,
        store_factory=broken,
    )
    assert agent.run() == 0
    [failed] = data_of(daemon, "checkpoint_failed")
    assert failed == {"name": "", "error": f"ValueError: {URI}: no credentials"}
    assert "done" in (tmp_path / "i-1" / "agent" / "job.log").read_text()


def test_without_a_checkpoint_location_the_old_checkpoint_dir_is_handed_on(
    tmp_path: Path,
) -> None:
    plain = answer(tmp_path, STEPS="1")
    del plain["job"]["checkpoint"]
    plain["job"]["checkpoint_dir"] = str(tmp_path / "shared")
    daemon = ScriptedDaemon(plain)

    def never(uri: str) -> FakeStore:
        raise AssertionError("no store without a checkpoint location")

    agent = agent_on(tmp_path / "i-1", daemon, FakeStore(tmp_path / "bucket"))
    agent.store_factory = never
    assert agent.run() == 0
    assert (tmp_path / "shared" / "step-1" / ".gpuopt-committed").exists()
    assert not [k for k in daemon.kinds() if k.startswith("checkpoint_")]


def test_a_checkpoint_larger_than_the_disk_stops_the_attempt_before_the_job_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FakeStore(tmp_path / "bucket")
    assert agent_on(tmp_path / "i-1", ScriptedDaemon(answer(tmp_path, STEPS="2")), store).run() == 0
    # The next instance's disk has 5 bytes free; step-2 holds 9 ("weights 2").
    restore_module = importlib.import_module("optimizer.checkpoints.restore")  # not the function
    monkeypatch.setattr(restore_module, "free_bytes", lambda path: 5)
    second = ScriptedDaemon(answer(tmp_path, STEPS="0"))
    assert agent_on(tmp_path / "i-2", second, store).run() == 1
    kinds = second.kinds()
    assert "job_started" not in kinds  # an older checkpoint would quietly lose work
    [failed] = data_of(second, "checkpoint_failed")
    assert "checkpoint step-2 needs 9 B more on the instance's disk" in failed["error"]
    assert "which has 5 B free" in failed["error"]
    [exited] = data_of(second, "job_exited")
    assert exited["phase"] == "restore" and exited["exit_code"] == 1
    assert "needs 9 B more" in exited["error"]
    assert not (tmp_path / "i-2" / "checkpoints" / "step-1").exists()
    err = (tmp_path / "i-2" / "agent" / "job.err.log").read_text()
    assert "[gpuopt agent] checkpoint step-2 needs 9 B more" in err
