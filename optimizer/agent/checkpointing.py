"""The agent's side of checkpoints that follow the job (docs/checkpoints.md).

For a job with a `checkpoint` location: before the job starts, the newest complete
checkpoint is restored into the instance's checkpoint folder (`checkpoint_restored`); while it
runs, the uploader sends what it commits (`checkpoint_committed`, `checkpoint_pruned`,
`checkpoint_failed`); when it has ended, `finish` uploads what is left (the final
checkpoint). While the agent waits at a fence, the newest checkpoint is prefetched into a
staging folder, so the restore after the fence fetches only the files that changed since.

Nothing here stops the agent: a store that cannot be reached is reported, and the job runs.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from optimizer.agent.config import AgentConfig
from optimizer.agent.reporter import EventQueue
from optimizer.checkpoints import (
    Commit,
    NoSpace,
    Uploader,
    list_checkpoints,
    prefetch,
    restore,
)
from optimizer.common.files import private_dir
from optimizer.common.retry import Backoff
from optimizer.protocol import CheckpointRef

if TYPE_CHECKING:
    from optimizer.storage import ObjectStore

log = logging.getLogger(__name__)

COMMITTED = "checkpoint_committed"
RESTORED = "checkpoint_restored"
PRUNED = "checkpoint_pruned"
FAILED = "checkpoint_failed"

StoreFactory = Callable[[str], "ObjectStore"]


def open_checkpoint_store(uri: str) -> ObjectStore:
    """The job's checkpoint location opened through optimizer.storage (imported here, so
    an agent without a checkpoint location never loads the cloud SDKs)."""
    from optimizer.storage import open_store

    return open_store(uri)


class CheckpointSync:
    """Restore, uploads and prefetch for one job's checkpoint location."""

    def __init__(
        self,
        ref: CheckpointRef,
        config: AgentConfig,
        queue: EventQueue,
        *,
        store_factory: StoreFactory = open_checkpoint_store,
        restore_backoff: Backoff | None = None,
    ) -> None:
        self.ref = ref
        self.config = config
        self.queue = queue
        self.store_factory = store_factory
        # Bytes the prefetch brought over the network: the restore reuses them from the
        # staging folder, but they crossed the network for this attempt all the same.
        self.prefetched_bytes = 0
        self.newest: Commit | None = None  # the newest checkpoint uploaded by this attempt
        self.restore_backoff = restore_backoff or Backoff(base=1.0, cap=10.0)
        self.local_dir = config.checkpoints_dir
        self.staging_dir = config.staging_dir
        self.uploader: Uploader | None = None
        self._store: ObjectStore | None = None
        self._unusable = False  # the store could not be opened (reported once)
        self._lock = threading.Lock()
        self._prefetch: tuple[threading.Thread, threading.Event] | None = None

    def _failed(self, name: str, error: object) -> None:
        self.queue.put(FAILED, {"name": name, "error": str(error)[:2000]})

    def store(self) -> ObjectStore | None:
        """The store, opened once; None (reported) when it cannot be opened."""
        with self._lock:
            if self._store is None and not self._unusable:
                try:
                    self._store = self.store_factory(self.ref.uri)
                except Exception as exc:
                    log.error("cannot open the checkpoint location %s: %s", self.ref.uri, exc)
                    self._failed("", f"{type(exc).__name__}: {exc}")
                    self._unusable = True
                    return None
            return self._store

    # --- at the fence ------------------------------------------------------------------------

    def start_prefetch(self) -> None:
        """Prefetch the newest checkpoint into the staging folder on a thread, again whenever
        a newer one appears, until `end_prefetch`."""
        if self._prefetch is not None:
            return
        cancel = threading.Event()
        thread = threading.Thread(
            target=self._prefetching, args=(cancel,), name="checkpoint-prefetch", daemon=True
        )
        self._prefetch = (thread, cancel)
        thread.start()

    def _prefetching(self, cancel: threading.Event) -> None:
        store = self.store()
        staged: str | None = None
        while store is not None and not cancel.is_set():
            try:
                newest = list_checkpoints(store)
                if newest and newest[0].name != staged:
                    private_dir(self.staging_dir)
                    done = prefetch(store, self.staging_dir)
                    staged = done.name if done is not None else None
                    if done is not None:
                        self.prefetched_bytes += done.fetched_bytes
                        log.info(
                            "prefetched checkpoint %s (%d bytes fetched)",
                            done.name,
                            done.fetched_bytes,
                        )
            except Exception as exc:  # the restore after the fence fetches what is missing
                log.warning("prefetching the checkpoint failed: %s", exc)
            cancel.wait(self.config.checkpoint_prefetch_s)

    def end_prefetch(self, timeout_s: float | None = None) -> None:
        """Stop prefetching; waits for the file transfers under way (at most `timeout_s`)."""
        if self._prefetch is None:
            return
        thread, cancel = self._prefetch
        cancel.set()
        thread.join(timeout_s)
        self._prefetch = None

    # --- before and while the job runs ---------------------------------------------------------

    def restore(self) -> None:
        """Restore the newest complete checkpoint into the local folder, trying again on the
        store's errors; the staging folder is used, then removed."""
        private_dir(self.local_dir)
        store = self.store()
        if store is None:
            return
        tries = max(self.config.checkpoint_restore_tries, 1)
        for attempt in range(1, tries + 1):
            try:
                done = restore(
                    store,
                    self.local_dir,
                    staging=self.staging_dir,
                    on_skipped=lambda name, why: self._failed(name, f"restore: {why}"),
                )
                break
            except NoSpace as exc:  # waiting will not free the disk: the attempt cannot start
                self._failed("", f"restore: {exc}")
                raise
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                if attempt == tries:
                    log.error("restoring the checkpoint failed %d times (%s)", tries, error)
                    self._failed("", f"restore: {error}")
                    return
                delay = self.restore_backoff.next()
                log.warning("restoring the checkpoint failed (%s); again in %.1f s", error, delay)
                time.sleep(delay)
        shutil.rmtree(self.staging_dir, ignore_errors=True)
        if done is None:
            log.info("no checkpoint to restore at %s", self.ref.uri)
            return
        data = done.to_data()
        # What crossed the network for this attempt (egress, in the ledger): the restore's
        # own fetches and the prefetch's before it; `prefetched_bytes` says how much of it
        # came early.
        data["fetched_bytes"] = done.fetched_bytes + self.prefetched_bytes
        data["prefetched_bytes"] = self.prefetched_bytes
        self.queue.put(RESTORED, data)

    def start_uploads(self) -> None:
        private_dir(self.local_dir)
        store = self.store()
        if store is None:
            return
        self.uploader = Uploader(
            store,
            self.local_dir,
            keep=self.ref.keep,
            on_commit=self._committed,
            on_pruned=lambda names: self.queue.put(PRUNED, {"names": names}),
            on_failed=self._failed,
            scan_s=self.config.checkpoint_scan_s,
        ).start()

    def _committed(self, commit: Commit) -> None:
        self.queue.put(COMMITTED, commit.to_data())
        newest = self.newest
        if newest is None or (commit.step or 0) >= (newest.step or 0):
            self.newest = commit

    def finish(self, timeout_s: float) -> list[Commit]:
        """Upload what the job committed and is not sent yet (its final checkpoint), then
        stop the uploader; the Commits of that last pass."""
        if self.uploader is None:
            return []
        timeout_s = max(timeout_s, self.config.checkpoint_min_flush_s)
        commits = self.uploader.flush(timeout_s)
        left = self.uploader.pending()
        newest = self.newest
        stopped = self.uploader.stopping_job
        if stopped and newest is not None and not any(c.final for c in commits) and not left:
            # The job's last checkpoint went up before it ended (the background pass took it):
            # say now that it is the last, so a replacement's fence may lift on it.
            self.queue.put(COMMITTED, {**newest.to_data(), "final": True})
        self.uploader.stop(timeout_s=0)  # a transfer still under way is given up with the agent
        if left:
            log.error("checkpoints %s were not uploaded within %.0f s", left, timeout_s)
        return commits
