"""Restoring the newest complete checkpoint into the local folder, and prefetching it.

`restore` takes the newest manifest whose files are all there and match their sha256, and
writes the checkpoint into `<local_dir>/<name>/`, marker last. A file already on the disk
with the same sha256 (in the local folder or the staging folder a `prefetch` filled) is
reused, not fetched again; the others are fetched in parallel, each checked before it takes
its place. A checkpoint whose data is missing or corrupt is skipped, with a warning and an
`on_skipped` call, for the one before it.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optimizer.checkpoints.convention import MARKER, CheckpointError, commit, read_marker
from optimizer.checkpoints.manifest import (
    FileEntry,
    Manifest,
    data_prefix,
    list_checkpoints,
    sha256_file,
)
from optimizer.checkpoints.upload import STATE_FILE, rate, record_uploaded
from optimizer.common.units import size_text

if TYPE_CHECKING:
    from optimizer.storage import ObjectStore

log = logging.getLogger(__name__)

PART = ".gpuopt-part"


@dataclass(frozen=True, slots=True)
class Restore:
    """One checkpoint restored: what `checkpoint_restored` reports."""

    name: str
    step: int | None
    size_bytes: int
    fetched_bytes: int
    reused_bytes: int
    seconds: float
    mib_s: float  # of the bytes fetched
    skipped: tuple[str, ...] = ()  # newer checkpoints that could not be used, and why

    def to_data(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "step": self.step,
            "size_bytes": self.size_bytes,
            "fetched_bytes": self.fetched_bytes,
            "reused_bytes": self.reused_bytes,
            "seconds": round(self.seconds, 3),
            "mib_s": round(self.mib_s, 2),
        }


class Unusable(CheckpointError):
    """A remote checkpoint that cannot be restored: data missing or not matching its sha256."""


class NoSpace(CheckpointError):
    """The newest checkpoint does not fit on the instance's disk: restoring an older one
    would quietly lose work, so the restore stops here and says what it needs."""


def free_bytes(path: Path) -> int:
    """Bytes free to an unprivileged writer on the file system that holds `path`."""
    return shutil.disk_usage(path).free


class _Copies:
    """Files already on the disk, found by size and then by sha256 (each hashed once)."""

    def __init__(self, folders: list[tuple[Path, bool]]) -> None:
        self.by_size: dict[int, list[tuple[Path, bool]]] = {}
        self._sha: dict[tuple[Path, int, int], str] = {}
        for folder, linkable in folders:
            for root, _dirs, files in os.walk(folder):
                for name in files:
                    path = Path(root) / name
                    if name in (MARKER, STATE_FILE) or name.endswith(PART):
                        continue
                    try:
                        st = path.lstat()
                    except OSError:
                        continue
                    if path.is_file() and not path.is_symlink():
                        self.by_size.setdefault(st.st_size, []).append((path, linkable))

    def sha256(self, path: Path) -> str | None:
        try:
            st = path.stat()
            key = (path, st.st_size, st.st_mtime_ns)
            if key not in self._sha:
                self._sha[key] = sha256_file(path)
            return self._sha[key]
        except OSError:
            return None

    def find(self, entry: FileEntry, dest: Path) -> tuple[Path, bool] | None:
        for path, linkable in self.by_size.get(entry.size, []):
            if path != dest and self.sha256(path) == entry.sha256:
                return path, linkable
        return None


def _place(source: Path, dest: Path, *, link: bool) -> None:
    """A copy of `source` at `dest` (a hard link where allowed and possible)."""
    part = dest.with_name(dest.name + PART)
    part.unlink(missing_ok=True)
    try:
        if not link:
            raise OSError("copy")
        os.link(source, part)
    except OSError:
        shutil.copyfile(source, part)
    os.replace(part, dest)


def _restore_one(
    store: ObjectStore, manifest: Manifest, local_dir: Path, copies: _Copies, workers: int
) -> tuple[int, int]:
    """Write `manifest`'s checkpoint into local_dir; (fetched bytes, reused bytes)."""
    prefix = data_prefix(manifest.name)
    remote = {info.key: info.size for info in store.list(prefix)}
    for entry in manifest.files:
        size = remote.get(prefix + entry.path)
        if size is None:
            raise Unusable(f"{prefix}{entry.path} is missing")
        if size != entry.size:
            raise Unusable(
                f"{prefix}{entry.path} holds {size} bytes, the manifest says {entry.size}"
            )
    target = local_dir / manifest.name
    existed = target.exists()
    target.mkdir(parents=True, exist_ok=True)
    try:
        return _write(store, manifest, target, copies, workers)
    except (Unusable, NoSpace):
        if not existed:
            shutil.rmtree(target, ignore_errors=True)
        raise


def _write(
    store: ObjectStore, manifest: Manifest, target: Path, copies: _Copies, workers: int
) -> tuple[int, int]:
    prefix = data_prefix(manifest.name)
    (target / MARKER).unlink(missing_ok=True)  # not committed while it is being written
    inside = target.resolve()
    fetch: list[tuple[FileEntry, Path]] = []
    reused = 0
    for entry in manifest.files:
        dest = target / entry.path
        if not dest.parent.resolve().is_relative_to(inside):
            raise Unusable(f"{entry.path}: leads out of {target}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        in_place = dest.is_file() and not dest.is_symlink() and dest.stat().st_size == entry.size
        if in_place and copies.sha256(dest) == entry.sha256:
            reused += entry.size
            continue
        found = copies.find(entry, dest)
        if found is not None:
            _place(found[0], dest, link=found[1])
            reused += entry.size
            continue
        fetch.append((entry, dest))
    needed = sum(entry.size for entry, _ in fetch)
    free = free_bytes(target)
    if needed > free:
        raise NoSpace(
            f"checkpoint {manifest.name} needs {size_text(needed)} more on the instance's disk "
            f"({size_text(manifest.size)} in all), which has {size_text(free)} free at {target}"
        )

    def get(item: tuple[FileEntry, Path]) -> int:
        entry, dest = item
        part = dest.with_name(dest.name + PART)
        store.get_file(prefix + entry.path, part)
        digest = sha256_file(part)
        if digest != entry.sha256:
            part.unlink(missing_ok=True)
            raise Unusable(
                f"{prefix}{entry.path}: sha256 {digest[:12]}..., the manifest says "
                f"{entry.sha256[:12]}..."
            )
        os.replace(part, dest)
        return entry.size

    fetched = 0
    if fetch:
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(fetch)))) as pool:
            futures = [pool.submit(get, item) for item in fetch]
            wait(futures, return_when=FIRST_EXCEPTION)
            failed = next((f for f in futures if f.done() and f.exception()), None)
            if failed is not None:
                for other in futures:
                    other.cancel()
                failed.result()  # raises its error
            fetched = sum(f.result() for f in futures)
    wanted = {entry.path for entry in manifest.files}
    for root, _dirs, files in os.walk(target):
        for name in files:
            rel = (Path(root) / name).relative_to(target).as_posix()
            if rel not in wanted:
                (Path(root) / name).unlink(missing_ok=True)  # left by an earlier try
    commit(target, manifest.step)
    return fetched, reused


def restore(
    store: ObjectStore,
    local_dir: Path,
    *,
    staging: Path | None = None,
    workers: int = 8,
    on_skipped: Callable[[str, str], object] = lambda name, why: None,
) -> Restore | None:
    """Restore the newest complete checkpoint into `local_dir` (None when there is none).

    Store errors (unreachable, denied) are raised; a checkpoint with missing or corrupt data
    is skipped for the one before it."""
    started = time.monotonic()
    local_dir = Path(local_dir)
    local_dir.mkdir(parents=True, exist_ok=True)
    manifests = list_checkpoints(store)
    if not manifests:
        return None
    folders = [(local_dir, False)]
    if staging is not None and Path(staging).is_dir():
        folders.append((Path(staging), True))
    copies = _Copies(folders)
    skipped: list[str] = []
    for manifest in manifests:
        try:
            fetched, reused = _restore_one(store, manifest, local_dir, copies, workers)
        except Unusable as exc:
            why = str(exc)
            log.warning(
                "checkpoint %s cannot be restored (%s); trying an older one", manifest.name, why
            )
            skipped.append(f"{manifest.name}: {why}")
            try:
                on_skipped(manifest.name, why)
            except Exception:
                log.exception("on_skipped failed")
            continue
        marker = read_marker(local_dir / manifest.name)
        if marker is not None:  # what was restored is never sent back
            record_uploaded(local_dir, str(store.location), {marker.name: marker.committed_at})
        seconds = time.monotonic() - started
        log.info(
            "restored checkpoint %s: %d bytes fetched, %d reused, in %.1f s",
            manifest.name,
            fetched,
            reused,
            seconds,
        )
        return Restore(
            manifest.name,
            manifest.step,
            manifest.size,
            fetched,
            reused,
            seconds,
            rate(fetched, seconds),
            tuple(skipped),
        )
    log.warning("no checkpoint could be restored: %s", "; ".join(skipped))
    return None


def prefetch(store: ObjectStore, staging: Path, **options: Any) -> Restore | None:
    """Download the newest complete checkpoint into `staging` (reusing what is there), so a
    later `restore(..., staging=staging)` fetches only what differs; older staged ones go."""
    staging = Path(staging)
    done = restore(store, staging, **options)
    if done is not None:
        for entry in os.scandir(staging):
            if entry.is_dir(follow_symlinks=False) and entry.name != done.name:
                shutil.rmtree(entry.path, ignore_errors=True)
    return done
