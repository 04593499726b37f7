"""Where the daemon keeps code archives: once per hash, as `<sha256>.tar.gz`.

In `<data_dir>/code/` by default; under a bucket URI (`code.store`) through the object
storage layer (`optimizer.storage`), imported only then. A bucket-held archive is served
from a copy fetched into the local folder on first use.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from optimizer.code.pack import SUFFIX, CodeError

if TYPE_CHECKING:
    from optimizer.storage import ObjectStore

HASH = re.compile(r"[0-9a-f]{64}")


def key(sha256: str) -> str:
    """The archive's name in the store."""
    if not HASH.fullmatch(sha256):
        raise ValueError(f"{sha256!r} is not a sha256 (64 lowercase hex digits)")
    return f"{sha256}{SUFFIX}"


class CodeStore:
    """Archives by hash: `folder` holds them (or, with `uri`, a local copy of the bucket's)."""

    def __init__(self, folder: Path, uri: str | None = None) -> None:
        self.folder = Path(folder)
        self.uri = uri
        self._bucket: ObjectStore | None = None

    def _remote(self) -> ObjectStore | None:
        if self.uri is None:
            return None
        if self._bucket is None:
            from optimizer.storage import open_store

            with self._errors():
                self._bucket = open_store(self.uri)
        return self._bucket

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """The bucket's errors as CodeError, naming the bucket."""
        from optimizer.storage import StorageError

        try:
            yield
        except StorageError as exc:
            raise CodeError(f"code.store {self.uri}: {exc}") from None

    def local_path(self, sha256: str) -> Path:
        return self.folder / key(sha256)

    def has(self, sha256: str) -> bool:
        """Whether the archive of this hash is held."""
        if self.local_path(sha256).is_file():
            return True
        remote = self._remote()
        if remote is None:
            return False
        name = key(sha256)
        with self._errors():
            return any(info.key == name for info in remote.list(name))

    def size(self, sha256: str) -> int | None:
        """The held archive's size in bytes (None: not held)."""
        path = self.local_path(sha256)
        if path.is_file():
            return path.stat().st_size
        remote = self._remote()
        if remote is None:
            return None
        name = key(sha256)
        with self._errors():
            return next((info.size for info in remote.list(name) if info.key == name), None)

    def put(self, sha256: str, source: Path) -> None:
        """Keep `source` (already checked to hash to `sha256`) as the archive; moved, not
        copied, when it is on the same disk."""
        remote = self._remote()
        if remote is not None:
            with self._errors():
                remote.put_file(key(sha256), source)
        self.folder.mkdir(parents=True, exist_ok=True)
        os.replace(source, self.local_path(sha256))

    def path(self, sha256: str) -> Path | None:
        """A local file holding the archive (fetched from the bucket when only it holds it);
        None when it is not held."""
        local = self.local_path(sha256)
        if local.is_file():
            return local
        if not self.has(sha256):
            return None
        remote = self._remote()
        assert remote is not None
        self.folder.mkdir(parents=True, exist_ok=True)
        with self._errors():
            remote.get_file(key(sha256), local)
        return local
