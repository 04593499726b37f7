"""Checkpoints that follow the job: the convention, the upload (manifest last, keep, state,
retries), the restore (sha256 checked, reuse) and the prefetch, against a fake object store."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from optimizer.checkpoints import (
    MARKER,
    CheckpointError,
    Commit,
    Manifest,
    Uploader,
    commit,
    list_checkpoints,
    prefetch,
    restore,
)
from optimizer.cli import app
from optimizer.common.retry import Backoff
from tests.helpers import wait_until
from tests.helpers.fake_store import FakeStore


def write(local: Path, name: str, files: dict[str, bytes], step: int | None = None) -> Path:
    folder = local / name
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    commit(folder, step)
    return folder


def uploader(store: FakeStore, local: Path, **options: object) -> Uploader:
    """An uploader with a quick back-off without jitter; it scans only when flushed unless
    given a `scan_s`, so what each flush sends is known."""
    options.setdefault("backoff", Backoff(base=0.01, cap=0.04, rng=lambda: 0.0))
    options.setdefault("scan_s", 3600.0)
    return Uploader(store, local, **options)  # type: ignore[arg-type]


@pytest.fixture
def store(tmp_path: Path) -> FakeStore:
    return FakeStore(tmp_path / "bucket")


# -- the convention -------------------------------------------------------------------------------


def test_commit_writes_the_marker_with_the_step(tmp_path: Path) -> None:
    folder = tmp_path / "step-000500"
    folder.mkdir()
    (folder / "model.pt").write_bytes(b"weights")
    marker = commit(folder, step=500)
    assert marker == folder / MARKER and json.loads(marker.read_text()) == {"step": 500}
    assert not (folder / f"{MARKER}.tmp").exists()
    commit(folder)  # again without a step: an empty marker
    assert marker.read_text() == ""


@pytest.mark.parametrize(
    ("name", "step", "message"),
    [
        ("missing", None, "not a folder"),
        ("has space", None, "letters, digits"),
        ("ok", -1, "whole number"),
    ],
)
def test_commit_refuses_what_it_cannot_commit(
    tmp_path: Path, name: str, step: int | None, message: str
) -> None:
    if name != "missing":
        (tmp_path / name).mkdir()
    with pytest.raises(CheckpointError, match=message):
        commit(tmp_path / name, step)


def test_the_cli_commits_a_folder_and_names_a_bad_one(tmp_path: Path) -> None:
    folder = tmp_path / "step-500"
    folder.mkdir()
    done = CliRunner().invoke(app, ["checkpoint", "commit", str(folder), "--step", "500"])
    assert done.exit_code == 0, done.output
    assert json.loads((folder / MARKER).read_text()) == {"step": 500}
    bad = CliRunner().invoke(app, ["checkpoint", "commit", str(tmp_path / "nope")])
    assert bad.exit_code == 2 and "nope: not a folder" in bad.output


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"version": 2}, "version 2, expected 1"),
        ({"name": "../x"}, "letters, digits"),
        ({"size": 5}, "not the sum"),
        ({"files": [{"path": "../etc/passwd", "size": 0, "sha256": "0" * 64}]}, "relative path"),
        ({"files": [{"path": "a", "size": 0, "sha256": "xyz"}]}, "sha256"),
    ],
)
def test_a_bad_manifest_is_refused_naming_the_problem(change: dict, message: str) -> None:
    good = {"version": 1, "name": "s1", "step": 1, "committed_at": 1.0, "size": 0, "files": []}
    Manifest.parse(json.dumps(good))
    if "files" in change and "size" not in change:
        change = {**change, "size": change["files"][0]["size"]}
    with pytest.raises(CheckpointError, match=message):
        Manifest.parse(json.dumps({**good, **change}), where="s3://b/manifests/s1.json")


# -- upload ----------------------------------------------------------------------------------------


def test_flush_uploads_data_then_the_manifest_and_returns_final_commits(
    store: FakeStore, tmp_path: Path
) -> None:
    local = tmp_path / "local"
    write(local, "step-1", {"model.pt": b"m" * 1000, "opt/state.bin": b"o" * 10}, step=1)
    seen: list[Commit] = []
    up = uploader(store, local, on_commit=seen.append, clock=lambda: 1234.5)
    commits = up.flush(10)
    up.stop()
    assert [(c.name, c.step, c.size_bytes, c.files, c.final) for c in commits] == [
        ("step-1", 1, 1010, 2, True)
    ]
    assert seen == commits
    assert store.keys_put[-1] == "manifests/step-1.json"  # after every data file
    assert sorted(store.keys_put[:-1]) == ["data/step-1/model.pt", "data/step-1/opt/state.bin"]
    [manifest] = list_checkpoints(store)
    assert manifest.committed_at == 1234.5 and manifest.size == 1010
    sums = {f.path: f.sha256 for f in manifest.files}
    assert sums["model.pt"] == hashlib.sha256(b"m" * 1000).hexdigest()


def test_the_background_thread_uploads_what_the_job_commits(
    store: FakeStore, tmp_path: Path
) -> None:
    local = tmp_path / "local"
    local.mkdir()
    seen: list[Commit] = []
    up = uploader(store, local, on_commit=seen.append, scan_s=0.02).start()
    (local / "step-2").mkdir()
    (local / "step-2" / "a").write_bytes(b"half")  # not committed: never sent
    (local / "step-1").mkdir()
    (local / "step-1" / "a").write_bytes(b"whole")
    commit(local / "step-1", 1)
    wait_until(lambda: seen, what="the upload")
    up.stop()
    assert store.names() == ["data/step-1/a", "manifests/step-1.json"]
    assert seen[0].name == "step-1" and seen[0].final is False


@pytest.mark.parametrize("cut", ["after one file", "inside the second file"])
def test_a_kill_mid_upload_leaves_the_previous_checkpoint_the_one_restored(
    store: FakeStore, tmp_path: Path, cut: str
) -> None:
    local = tmp_path / "local"
    write(local, "step-1", {"a.bin": b"1" * 100, "b.bin": b"1" * 100}, step=1)
    first = uploader(store, local, workers=1)
    assert [c.name for c in first.flush(10)] == ["step-1"]
    if cut == "after one file":  # one data file goes up, then the agent dies
        store.fail_after_files = store.files_put + 1
    else:
        store.fail_after_bytes = store.bytes_put + 150
    write(local, "step-2", {"a.bin": b"2" * 100, "b.bin": b"2" * 100}, step=2)
    assert first.flush(0.3) == []
    first.stop()
    assert store.names("data/step-2/") == ["data/step-2/a.bin"]
    assert "manifests/step-2.json" not in store.names()
    done = restore(store, tmp_path / "elsewhere")
    assert done is not None and done.name == "step-1"
    assert (tmp_path / "elsewhere" / "step-1" / "a.bin").read_bytes() == b"1" * 100
    # The next agent on this disk sends step-2 in full; now it is the one restored.
    store.fail_after_files = store.fail_after_bytes = None
    second = uploader(store, local)
    assert [c.name for c in second.flush(10)] == ["step-2"]
    again = restore(store, tmp_path / "later")
    assert again is not None and again.name == "step-2"


def test_keep_prunes_the_oldest_manifest_first_then_data(store: FakeStore, tmp_path: Path) -> None:
    local = tmp_path / "local"
    pruned: list[list[str]] = []
    up = uploader(store, local, keep=2, on_pruned=pruned.append)
    for step in (1, 2, 3, 4):
        write(local, f"step-{step}", {"w": bytes([step]) * 50}, step=step)
        up.flush(10)
    up.stop()
    assert [m.name for m in list_checkpoints(store)] == ["step-4", "step-3"]
    assert pruned == [["step-1"], ["step-2"]]
    assert sorted({k.split("/")[1] for k in store.names("data/")}) == ["step-3", "step-4"]
    # The instance's disk keeps no more: uploaded folders past the `keep` newest are deleted.
    assert sorted(p.name for p in local.iterdir() if p.is_dir()) == ["step-3", "step-4"]


def test_a_folder_not_uploaded_yet_is_never_deleted_from_the_disk(
    store: FakeStore, tmp_path: Path
) -> None:
    local = tmp_path / "local"
    up = uploader(store, local, keep=1)
    write(local, "step-1", {"w": b"1"}, step=1)
    up.flush(10)
    store.fail_after_files = store.files_put  # the bucket fails from here on
    write(local, "step-2", {"w": b"2"}, step=2)
    assert up.flush(0.3) == []
    up.stop()
    # step-2 never reached the bucket: both stay on the disk (step-1 is the bucket's newest).
    assert sorted(p.name for p in local.iterdir() if p.is_dir()) == ["step-1", "step-2"]


def test_data_left_by_a_killed_upload_is_pruned_after_being_seen_twice(
    store: FakeStore, tmp_path: Path
) -> None:
    store.put_bytes("data/step-0/w", b"orphan")  # no manifest: an upload that died
    local = tmp_path / "local"
    up = uploader(store, local, keep=5)
    write(local, "step-1", {"w": b"1"}, step=1)
    up.flush(10)
    assert store.names("data/step-0/") == ["data/step-0/w"]  # seen once: may be in flight
    write(local, "step-2", {"w": b"2"}, step=2)
    up.flush(10)
    up.stop()
    assert store.names("data/step-0/") == []


def test_a_restarted_uploader_does_not_upload_again(store: FakeStore, tmp_path: Path) -> None:
    local = tmp_path / "local"
    write(local, "step-1", {"w": b"x" * 10}, step=1)
    uploader(store, local).flush(10)
    sent = store.files_put
    again = uploader(store, local)
    assert again.flush(10) == [] and again.pending() == []
    assert store.files_put == sent


def test_a_folder_committed_again_under_its_name_is_sent_again(
    store: FakeStore, tmp_path: Path
) -> None:
    local = tmp_path / "local"
    write(local, "latest", {"w": b"one"}, step=1)
    up = uploader(store, local)
    assert [c.step for c in up.flush(10)] == [1]
    (local / "latest" / "w").write_bytes(b"two")
    marker = commit(local / "latest", 2)
    stamp = marker.stat().st_mtime_ns + 1_000_000  # a later commit, whatever the clock's grain
    os.utime(marker, ns=(stamp, stamp))
    assert [c.step for c in up.flush(10)] == [2]
    done = restore(store, tmp_path / "fresh")
    assert done is not None and (tmp_path / "fresh" / "latest" / "w").read_bytes() == b"two"


def test_only_the_newest_keep_of_a_backlog_are_sent(store: FakeStore, tmp_path: Path) -> None:
    local = tmp_path / "local"
    for step in (1, 2, 3, 4, 5):
        write(local, f"s{step}", {"w": b"x"}, step=step)
    commits = uploader(store, local, keep=2).flush(10)
    assert [c.name for c in commits] == ["s4", "s5"]
    assert sorted(k.split("/")[1] for k in store.names("data/")) == ["s4", "s5"]


def test_an_unreachable_store_is_retried_and_reported_never_raised(
    store: FakeStore, tmp_path: Path
) -> None:
    local = tmp_path / "local"
    write(local, "step-1", {"w": b"x"}, step=1)
    failed: list[tuple[str, str]] = []
    seen: list[Commit] = []
    store.unreachable = True
    up = uploader(
        store, local, on_failed=lambda n, e: failed.append((n, e)), on_commit=seen.append
    ).start()
    wait_until(lambda: len(up.waits) >= 4, what="a few retries")
    # Back-off with no jitter: base/2, then doubling up to the cap (optimizer.common.retry).
    assert up.waits[:4] == [0.005, 0.01, 0.02, 0.02]
    assert failed == [("step-1", "FakeUnreachable: " + str(store.location) + ": could not connect")]
    assert up.flush(0.1) == []  # gives up waiting, does not raise
    store.unreachable = False
    wait_until(lambda: seen, what="the upload once the store is back")
    up.stop()
    assert seen[0].name == "step-1"


def test_a_failing_callback_does_not_stop_the_uploader(store: FakeStore, tmp_path: Path) -> None:
    local = tmp_path / "local"
    write(local, "step-1", {"w": b"x"}, step=1)

    calls: list[str] = []

    def broken(commit: Commit) -> None:
        calls.append(commit.name)
        raise RuntimeError("boom")

    up = uploader(store, local, on_commit=broken)
    assert [c.name for c in up.flush(10)] == ["step-1"]
    write(local, "step-2", {"w": b"y"}, step=2)
    assert [c.name for c in up.flush(10)] == ["step-2"]
    up.stop()
    assert calls == ["step-1", "step-2"]


# -- restore and prefetch --------------------------------------------------------------------------


def test_newest_is_by_step_then_time(store: FakeStore, tmp_path: Path) -> None:
    local = tmp_path / "local"
    times = iter([3.0, 1.0, 2.0, 4.0])
    up = uploader(store, local, clock=lambda: next(times), keep=10)
    for name, step in (("b", 10), ("a", 10), ("c", 2), ("plain", None)):
        write(local, name, {"w": name.encode()}, step=step)
        up.flush(10)
    assert [m.name for m in list_checkpoints(store)] == ["b", "a", "c", "plain"]


def test_restore_refuses_a_corrupted_file_and_falls_back_saying_so(
    store: FakeStore, tmp_path: Path
) -> None:
    local = tmp_path / "local"
    up = uploader(store, local)
    write(local, "step-1", {"w.bin": b"1" * 64}, step=1)
    up.flush(10)
    write(local, "step-2", {"w.bin": b"2" * 64, "x": b"2"}, step=2)
    up.flush(10)
    store.corrupt("data/step-2/w.bin")
    skipped: list[tuple[str, str]] = []
    target = tmp_path / "fresh"
    done = restore(store, target, on_skipped=lambda n, why: skipped.append((n, why)))
    assert done is not None and done.name == "step-1"
    assert [n for n, _ in skipped] == ["step-2"] and "sha256" in skipped[0][1]
    assert done.skipped and done.skipped[0].startswith("step-2: data/step-2/w.bin: sha256")
    assert not (target / "step-2").exists()  # nothing half-written is left to the job
    assert json.loads((target / "step-1" / MARKER).read_text()) == {"step": 1}


def test_restore_skips_a_checkpoint_whose_data_is_gone(store: FakeStore, tmp_path: Path) -> None:
    local = tmp_path / "local"
    up = uploader(store, local)
    write(local, "step-1", {"w": b"1"}, step=1)
    write(local, "step-2", {"w": b"2"}, step=2)
    up.flush(10)
    store.delete(["data/step-2/w"])
    done = restore(store, tmp_path / "fresh")
    assert done is not None and done.name == "step-1"
    assert "data/step-2/w is missing" in done.skipped[0]


def test_restore_with_nothing_remote_is_none(store: FakeStore, tmp_path: Path) -> None:
    store.put_bytes("data/step-9/w", b"no manifest")
    assert restore(store, tmp_path / "fresh") is None


def test_prefetch_then_restore_fetches_only_the_differing_files(
    store: FakeStore, tmp_path: Path
) -> None:
    local = tmp_path / "old-instance"
    big, tokenizer = os.urandom(256 * 1024), b"vocab" * 100
    up = uploader(store, local)
    write(local, "step-1", {"model.bin": big, "tok.json": tokenizer, "opt": b"a" * 3000}, step=1)
    up.flush(10)
    staging = tmp_path / "new-instance" / "staging"
    staged = prefetch(store, staging)
    assert staged is not None and staged.fetched_bytes == len(big) + len(tokenizer) + 3000
    # Meanwhile the old job writes its final checkpoint: the optimizer state changed.
    write(local, "step-2", {"model.bin": big, "tok.json": tokenizer, "opt": b"b" * 5000}, step=2)
    up.flush(10)
    store.reset_counts()
    target = tmp_path / "new-instance" / "checkpoints"
    done = restore(store, target, staging=staging)
    assert done is not None and done.name == "step-2"
    assert (done.fetched_bytes, done.reused_bytes) == (5000, len(big) + len(tokenizer))
    data_got = [k for k in store.keys_got if k.startswith("data/")]
    assert data_got == ["data/step-2/opt"]
    assert (target / "step-2" / "model.bin").read_bytes() == big
    assert (target / "step-2" / "opt").read_bytes() == b"b" * 5000


def test_a_second_restore_reuses_what_is_already_there(store: FakeStore, tmp_path: Path) -> None:
    local = tmp_path / "local"
    write(local, "step-1", {"w": b"w" * 500}, step=1)
    uploader(store, local).flush(10)
    target = tmp_path / "fresh"
    restore(store, target)
    (target / "step-1" / "stray").write_bytes(b"left by an earlier try")
    store.reset_counts()
    again = restore(store, target)
    assert again is not None and (again.fetched_bytes, again.reused_bytes) == (0, 500)
    assert sorted(p.name for p in (target / "step-1").iterdir()) == [MARKER, "w"]
    # A restored checkpoint is not uploaded back.
    assert uploader(store, target).flush(10) == [] and store.files_put == 0
