"""The uploader: committed checkpoint folders go to the object store on a background thread.

Each pass scans the local folder for committed checkpoints not uploaded yet, uploads the
files of each (a few in parallel, the sha256 of each computed on the way) to
`data/<name>/`, and writes `manifests/<name>.json` last. The names uploaded are recorded in a
state file beside them (`STATE_FILE`), so an agent that restarts does not upload them again.
After each upload the checkpoints beyond the `keep` newest are pruned: their manifests first
(so none is ever restored half-deleted), then their data.

Nothing here raises into the caller's thread: a failed upload is reported through
`on_failed` and retried with the project's back-off, for as long as the uploader runs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optimizer.checkpoints.convention import Committed, committed, folder_files
from optimizer.checkpoints.manifest import (
    DATA,
    FileEntry,
    Manifest,
    data_prefix,
    list_checkpoints,
    manifest_key,
    manifest_names,
    sha256_file,
)
from optimizer.common.retry import Backoff

if TYPE_CHECKING:
    from optimizer.storage import ObjectStore

log = logging.getLogger(__name__)

STATE_FILE = ".gpuopt-uploads.json"
# Files up to this size are read once into memory, hashed and sent as bytes; larger ones are
# hashed, then handed to the store as a file (which sends them in parallel parts).
SMALL_FILE = 8 * 1024 * 1024
MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Commit:
    """One checkpoint uploaded: what `checkpoint_committed` reports."""

    name: str
    step: int | None
    size_bytes: int
    files: int
    seconds: float
    mib_s: float
    final: bool  # uploaded by the flush at the job's end

    def to_data(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "step": self.step,
            "size_bytes": self.size_bytes,
            "files": self.files,
            "seconds": round(self.seconds, 3),
            "mib_s": round(self.mib_s, 2),
            "final": self.final,
        }


def rate(size_bytes: int, seconds: float) -> float:
    return size_bytes / MIB / seconds if seconds > 0 and size_bytes else 0.0


# -- the state file: names uploaded to which location -------------------------------------------


def read_state(local_dir: Path, location: str) -> dict[str, float]:
    """The checkpoints uploaded to `location`: name -> the commit's marker time (a folder
    committed again under the same name has a newer one, and is sent again)."""
    try:
        data = json.loads((local_dir / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("location") != location:
        return {}
    uploaded = data.get("uploaded")
    if not isinstance(uploaded, dict):
        return {}
    return {str(k): float(v) for k, v in uploaded.items() if isinstance(v, (int, float))}


def record_uploaded(local_dir: Path, location: str, done: Mapping[str, float]) -> None:
    """Add `done` (name -> marker time) to what was uploaded to `location` (tmp + rename)."""
    state = {**read_state(local_dir, location), **done}
    path = local_dir / STATE_FILE
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps({"location": location, "uploaded": state}, sort_keys=True))
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("could not record the uploaded checkpoints in %s: %s", path, exc)


def _sent(uploaded: Mapping[str, float], one: Committed) -> bool:
    return uploaded.get(one.name) == one.committed_at


# -- one checkpoint up ---------------------------------------------------------------------------


def upload_one(
    store: ObjectStore,
    one: Committed,
    *,
    workers: int = 4,
    clock: Callable[[], float] = time.time,
    final: bool = False,
) -> Commit:
    """Upload one committed folder: its files in parallel, then its manifest. Raises what the
    store raises."""
    started = time.monotonic()
    prefix = data_prefix(one.name)

    def send(item: tuple[str, Path]) -> FileEntry:
        rel, path = item
        key = prefix + rel
        size = path.stat().st_size
        if size <= SMALL_FILE:
            data = path.read_bytes()
            store.put_bytes(key, data)
            return FileEntry(rel, len(data), hashlib.sha256(data).hexdigest())
        digest = sha256_file(path)
        store.put_file(key, path)
        return FileEntry(rel, size, digest)

    files = folder_files(one.path)
    if files:
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(files)))) as pool:
            entries = tuple(pool.map(send, files))
    else:
        entries = ()
    size = sum(e.size for e in entries)
    manifest = Manifest(one.name, one.step, clock(), size, entries)
    store.put_bytes(manifest_key(one.name), manifest.to_bytes())  # last: now it is complete
    seconds = time.monotonic() - started
    return Commit(one.name, one.step, size, len(entries), seconds, rate(size, seconds), final)


def prune(store: ObjectStore, keep: int, *, orphans: Iterable[str] = ()) -> list[str]:
    """Delete the checkpoints beyond the `keep` newest (manifests first, then data), and the
    data of `orphans` (names without a manifest). Returns the names deleted."""
    old = [m.name for m in list_checkpoints(store)[max(keep, 1) :]]
    if old:
        store.delete([manifest_key(n) for n in old])
    gone = [*old, *(n for n in orphans if n not in old)]
    for name in gone:
        keys = [info.key for info in store.list(data_prefix(name))]
        if keys:
            store.delete(keys)
    return gone


def data_names(store: ObjectStore) -> set[str]:
    """Names that have data under `data/`."""
    return {
        info.key.removeprefix(DATA).split("/", 1)[0]
        for info in store.list(DATA)
        if "/" in info.key.removeprefix(DATA)
    }


class _Failed(Exception):
    """An upload pass that failed, with the checkpoint it was sending ("" for none)."""

    def __init__(self, name: str, cause: BaseException) -> None:
        super().__init__(f"{name or 'checkpoints'}: {type(cause).__name__}: {cause}")
        self.name, self.cause = name, cause


# -- the background thread ------------------------------------------------------------------------


class Uploader:
    """Uploads what the job commits in `local_dir`, keeping the `keep` newest remotely.

    `on_commit` gets each upload (`final` for those of a `flush` and after `finalize`),
    `on_pruned` the names deleted, `on_failed(name, error)` each failed attempt (the first of
    a run of failures and each time the error changes); callbacks are called on the
    uploader's thread.
    """

    def __init__(
        self,
        store: ObjectStore,
        local_dir: Path,
        *,
        keep: int = 3,
        on_commit: Callable[[Commit], object] = lambda commit: None,
        on_pruned: Callable[[list[str]], object] = lambda names: None,
        on_failed: Callable[[str, str], object] = lambda name, error: None,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.time,
        scan_s: float = 2.0,
        workers: int = 4,
    ) -> None:
        self.store = store
        self.local_dir = Path(local_dir)
        self.keep = max(int(keep), 1)
        self.on_commit, self.on_pruned, self.on_failed = on_commit, on_pruned, on_failed
        self.backoff = backoff or Backoff(base=2.0, cap=60.0)
        self.clock = clock
        self.scan_s = scan_s
        self.workers = workers
        self.location = str(store.location)
        self.waits: list[float] = []  # each back-off wait after a failure, in order
        self.failures = 0
        self._uploaded = read_state(self.local_dir, self.location)
        self._orphans_seen: set[str] | None = None  # data without a manifest at the last prune
        self._last_error: str | None = None
        self._cond = threading.Condition()
        self._wake = True  # the first pass runs as soon as the thread starts
        self._stopping = False
        self._requested = 0  # flushes asked for...
        self._served = 0  # ...and the last one whose pass has ended
        self._flushed: dict[int, list[Commit]] = {}
        self._abandoned: set[int] = set()  # flushes that stopped waiting
        self._final = False  # the job has been told to stop
        self._thread: threading.Thread | None = None

    # --- the caller's side ---------------------------------------------------------------------

    def start(self) -> Uploader:
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._main, name="checkpoint-uploader", daemon=True
                )
                self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """End the thread after what it is sending now (waits at most `timeout_s`)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout_s)

    def flush(self, timeout_s: float) -> list[Commit]:
        """Upload every checkpoint committed now; the Commits uploaded from this call on (all
        `final`), those done when `timeout_s` ran out if it did. Never raises."""
        try:
            deadline = time.monotonic() + max(timeout_s, 0.0)
            with self._cond:
                self._requested += 1
                ticket = self._requested
                self._wake = True
                self._cond.notify_all()
            self.start()
            with self._cond:
                while self._served < ticket and not self._stopping:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                if self._served < ticket:
                    self._abandoned.add(ticket)  # gave up waiting: collect no more for it
                return self._flushed.pop(ticket, [])
        except Exception:  # the caller's thread must never see the uploader fail
            log.exception("checkpoint flush failed")
            return []

    def finalize(self) -> None:
        """From now on every upload is `final`: the job has been told to stop, and what it
        commits now is its last checkpoint (uploaded by the thread or by the `flush`)."""
        self._final = True

    @property
    def stopping_job(self) -> bool:
        """Whether the job was told to stop (`finalize`)."""
        return self._final

    def pending(self) -> list[str]:
        """Committed folders not uploaded yet, oldest first."""
        return [c.name for c in committed(self.local_dir) if not _sent(self._uploaded, c)]

    # --- the thread ------------------------------------------------------------------------------

    def _main(self) -> None:
        delay = 0.0
        while True:
            with self._cond:
                if delay > 0 or not self._wake:
                    self._cond.wait_for(lambda: self._wake or self._stopping, delay or self.scan_s)
                if self._stopping:
                    return
                self._wake = False
                ticket = self._requested
                flushing = ticket > self._served
            try:
                self._pass()
            except _Failed as failed:  # reported and retried; the thread goes on
                delay = self.backoff.next()
                self.waits.append(delay)
                self.failures += 1
                self._fail(failed.name, failed.cause)
                log.warning("checkpoint upload failed (%s); retrying in %.1f s", failed, delay)
                continue
            delay = 0.0
            if self.backoff.failures:
                self.backoff.reset()
                self._last_error = None
            if flushing:
                with self._cond:
                    self._served = max(self._served, ticket)
                    self._abandoned = {t for t in self._abandoned if t > self._served}
                    self._cond.notify_all()

    def _pass(self) -> None:
        try:
            todo = [c for c in committed(self.local_dir) if not _sent(self._uploaded, c)]
        except Exception as exc:
            raise _Failed("", exc) from exc
        # Only the `keep` newest are worth sending: older ones would be pruned at once.
        skipped, todo = todo[: -self.keep], todo[-self.keep :]
        if skipped:
            log.info("not uploading superseded checkpoints %s", [c.name for c in skipped])
            self._mark(skipped)
        for one in todo:
            with self._cond:  # asked for by a flush, or after the stop: the last ones
                # Only the newest a flush sends (the job has ended): an older one sent after
                # the stop must not lift a replacement's fence before the last is up.
                final = self._requested > self._served and one is todo[-1]
            try:
                commit = upload_one(
                    self.store, one, workers=self.workers, clock=self.clock, final=final
                )
            except Exception as exc:
                raise _Failed(one.name, exc) from exc
            self._mark([one])
            with self._cond:  # each flush waiting gets it
                for ticket in range(self._served + 1, self._requested + 1):
                    if ticket not in self._abandoned:
                        self._flushed.setdefault(ticket, []).append(commit)
            log.info(
                "checkpoint %s uploaded: %d bytes in %.1f s",
                commit.name,
                commit.size_bytes,
                commit.seconds,
            )
            self._call(self.on_commit, commit)
            self._prune()
        self._prune_local()

    def _prune_local(self) -> None:
        """Delete local folders that are uploaded and older than the `keep` newest: where
        gpuopt ships checkpoints (GPUOPT_CHECKPOINT_URI set) the job leaves pruning to it, so
        the instance's disk holds no more than `keep` of them plus what is being written."""
        try:
            done = [c for c in committed(self.local_dir) if _sent(self._uploaded, c)]
        except OSError:
            return
        newest = {c.name for c in committed(self.local_dir)[-self.keep :]}
        for one in done:
            if one.name not in newest:
                shutil.rmtree(self.local_dir / one.name, ignore_errors=True)

    def _prune(self) -> None:
        try:
            with_manifest = set(manifest_names(self.store))
            without = data_names(self.store) - with_manifest - set(self.pending())
            # Data without a manifest is an upload that never finished (an agent killed while
            # sending); deleted once seen at two prunes in a row, so one in flight elsewhere
            # gets the time of an upload to finish.
            orphans = without & (self._orphans_seen or set())
            self._orphans_seen = without - orphans
            gone = prune(self.store, self.keep, orphans=sorted(orphans))
        except Exception as exc:  # the upload is done; pruning is tried again after the next
            log.warning("pruning old checkpoints failed: %s", exc)
            self._fail("", exc)
            return
        if gone:
            log.info("pruned checkpoints %s", gone)
            self._call(self.on_pruned, gone)

    def _mark(self, done: list[Committed]) -> None:
        self._uploaded.update({c.name: c.committed_at for c in done})
        record_uploaded(self.local_dir, self.location, {c.name: c.committed_at for c in done})

    def _fail(self, name: str, exc: BaseException) -> None:
        error = f"{type(exc).__name__}: {exc}"
        if error == self._last_error:
            return  # said already; the retries go on quietly
        self._last_error = error
        self._call(self.on_failed, name, error)

    def _call(self, callback: Callable[..., object], *args: Any) -> None:
        try:
            callback(*args)
        except Exception:
            log.exception("checkpoint callback %r failed", callback)
