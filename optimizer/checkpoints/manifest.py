"""The remote layout and its manifest (docs/checkpoints.md).

Under the job's checkpoint location a checkpoint `<name>` is its files at
`data/<name>/<relpath>` and, written after every one of them, `manifests/<name>.json`: a
checkpoint without its manifest is an upload that did not finish, and is never restored.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from optimizer.checkpoints.convention import CheckpointError, check_name, order_key

if TYPE_CHECKING:
    from optimizer.storage import ObjectStore

log = logging.getLogger(__name__)

VERSION = 1
MANIFESTS = "manifests/"
DATA = "data/"
HASH_CHUNK = 1024 * 1024


def manifest_key(name: str) -> str:
    return f"{MANIFESTS}{name}.json"


def data_prefix(name: str) -> str:
    return f"{DATA}{name}/"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as source:
        while chunk := source.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def check_relpath(text: str) -> str:
    """A file's path inside a checkpoint: relative, without `..`, never the marker."""
    path = PurePosixPath(text)
    if not text or path.is_absolute() or any(p in ("", ".", "..") for p in text.split("/")):
        raise CheckpointError(f"{text!r}: not a relative path inside the checkpoint")
    return text


@dataclass(frozen=True, slots=True)
class FileEntry:
    path: str
    size: int
    sha256: str


@dataclass(frozen=True, slots=True)
class Manifest:
    """One complete checkpoint as the remote store holds it."""

    name: str
    step: int | None
    committed_at: float
    size: int
    files: tuple[FileEntry, ...]

    def order(self) -> tuple[bool, int, float]:
        return order_key(self.step, self.committed_at)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "name": self.name,
            "step": self.step,
            "committed_at": self.committed_at,
            "size": self.size,
            "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in self.files],
        }

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json(), indent=1).encode()

    @classmethod
    def parse(cls, raw: bytes | str, *, where: str = "manifest") -> Manifest:
        """The manifest in `raw`; CheckpointError naming `where` and the bad field."""
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise CheckpointError(f"{where}: not JSON ({exc})") from None
        if not isinstance(data, Mapping):
            raise CheckpointError(f"{where}: expected a JSON object")
        if data.get("version") != VERSION:
            raise CheckpointError(f"{where}: version {data.get('version')!r}, expected {VERSION}")
        try:
            files = tuple(
                FileEntry(check_relpath(str(f["path"])), _count(f["size"]), _hex(f["sha256"]))
                for f in data["files"]
            )
            step = data.get("step")
            manifest = cls(
                name=check_name(str(data["name"])),
                step=None if step is None else _count(step),
                committed_at=float(data["committed_at"]),
                size=_count(data["size"]),
                files=files,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{where}: bad field ({type(exc).__name__}: {exc})") from None
        if manifest.size != sum(f.size for f in files):
            raise CheckpointError(f"{where}: size {manifest.size} is not the sum of its files")
        return manifest


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{value!r} is not a whole number >= 0")
    return value


def _hex(value: Any) -> str:
    text = str(value)
    if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
        raise ValueError(f"{value!r} is not a sha256 (64 lowercase hex digits)")
    return text


def manifest_names(store: ObjectStore) -> list[str]:
    """The names that have a manifest (complete or not readable), unordered."""
    names = []
    for info in store.list(MANIFESTS):
        key = info.key.removeprefix(MANIFESTS)
        if key.endswith(".json") and "/" not in key:
            names.append(key.removesuffix(".json"))
    return names


def list_checkpoints(store: ObjectStore, *, workers: int = 8) -> list[Manifest]:
    """The complete checkpoints, newest first (by step, then committed_at); an unreadable
    manifest is left out with a warning."""
    names = manifest_names(store)

    def read(name: str) -> Manifest | None:
        key = manifest_key(name)
        try:
            manifest = Manifest.parse(store.get_bytes(key), where=f"{store.location}/{key}")
        except CheckpointError as exc:
            log.warning("ignoring checkpoint %s: %s", name, exc)
            return None
        if manifest.name != name:
            log.warning("ignoring checkpoint %s: its manifest names %s", name, manifest.name)
            return None
        return manifest

    if not names:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(names)))) as pool:
        found = [m for m in pool.map(read, names) if m is not None]
    return sorted(found, key=Manifest.order, reverse=True)
