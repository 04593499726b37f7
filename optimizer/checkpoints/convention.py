"""The checkpoint convention on the instance's disk (docs/checkpoints.md).

The job writes each checkpoint into a sub-folder of `$GPUOPT_CHECKPOINT_DIR` (a name of
letters, digits, `.`, `_` and `-`) and commits it by writing the marker file `MARKER` into it
last: empty, or JSON `{"step": 500}`. Until the marker is there the folder is ignored, so a
job killed while writing leaves nothing half-written to upload.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

MARKER = ".gpuopt-committed"
NAME = re.compile(r"^[A-Za-z0-9._-]+$")


class CheckpointError(ValueError):
    """A folder that cannot be committed or a manifest that cannot be used; the message names it."""


def check_name(name: str) -> str:
    if not NAME.match(name) or name in (".", ".."):
        raise CheckpointError(
            f"{name!r}: a checkpoint's name is letters, digits, '.', '_' and '-' only"
        )
    return name


def _fsync_path(path: Path, *, folder: bool = False) -> None:
    fd = os.open(path, (os.O_RDONLY | os.O_DIRECTORY) if folder else os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot sync a folder; the data files were synced
        pass
    finally:
        os.close(fd)


def commit(path: Path | str, step: int | None = None) -> Path:
    """Commit the checkpoint folder `path`: its files are synced to disk, then the marker is
    written atomically (tmp file, fsync, rename). Returns the marker's path."""
    folder = Path(path)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: not a folder (write the checkpoint into it first)")
    check_name(folder.resolve().name)
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise CheckpointError(f"step {step!r}: expected a whole number >= 0")
    for root, _dirs, files in os.walk(folder):
        for name in files:
            file = Path(root) / name
            if name != MARKER and file.is_file() and not file.is_symlink():
                _fsync_path(file)
    marker = folder / MARKER
    tmp = folder / f"{MARKER}.tmp"
    body = json.dumps({"step": step}) if step is not None else ""
    with open(tmp, "w", encoding="utf-8") as out:
        out.write(body)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, marker)
    _fsync_path(folder, folder=True)
    return marker


@dataclass(frozen=True, slots=True)
class Committed:
    """A committed folder on the local disk."""

    name: str
    path: Path
    step: int | None
    committed_at: float  # the marker's modification time

    def order(self) -> tuple[bool, int, float]:
        return order_key(self.step, self.committed_at)


def order_key(step: int | None, committed_at: float) -> tuple[bool, int, float]:
    """Oldest first: by step (a checkpoint without one before any with one), then time."""
    return (step is not None, step or 0, committed_at)


def read_marker(folder: Path) -> Committed | None:
    """The committed folder, or None when it has no marker (not committed yet)."""
    marker = folder / MARKER
    try:
        text = marker.read_text(encoding="utf-8").strip()
        at = marker.stat().st_mtime
    except OSError:
        return None
    step: int | None = None
    if text:
        try:
            value = json.loads(text).get("step")
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"step {value!r} is not a whole number")
            step = value
        except (ValueError, AttributeError) as exc:
            log.warning(
                "%s: unreadable marker (%s); taken as committed without a step", marker, exc
            )
    return Committed(folder.name, folder, step, at)


def committed(local_dir: Path) -> list[Committed]:
    """The committed checkpoint folders in `local_dir`, oldest first."""
    found: list[Committed] = []
    try:
        entries = list(os.scandir(local_dir))
    except OSError:
        return []
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False) or not NAME.match(entry.name):
            continue
        one = read_marker(Path(entry.path))
        if one is not None:
            found.append(one)
    return sorted(found, key=Committed.order)


def folder_files(folder: Path) -> list[tuple[str, Path]]:
    """The regular files of a checkpoint folder (relative POSIX path, path), sorted; the
    marker and symbolic links are left out."""
    out: list[tuple[str, Path]] = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in files:
            path = Path(root) / name
            rel = path.relative_to(folder).as_posix()
            if rel in (MARKER, f"{MARKER}.tmp") or path.is_symlink() or not path.is_file():
                continue
            out.append((rel, path))
    return sorted(out)
