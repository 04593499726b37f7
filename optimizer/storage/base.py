"""What every backend offers (`ObjectStore`), and the retry loop they share."""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar, runtime_checkable

from optimizer.common.retry import Backoff
from optimizer.storage.errors import StorageError
from optimizer.storage.location import Location

T = TypeVar("T")
MIB = 1 << 20
# Back-off between tries of one operation: about 0.5 s, 1 s, 2 s, ... up to 15 s.
BACKOFF_BASE_S, BACKOFF_CAP_S = 0.5, 15.0


@dataclass(frozen=True)
class ObjectInfo:
    """One object; `key` is relative to the store's prefix."""

    key: str
    size: int


@runtime_checkable
class ObjectStore(Protocol):
    """Objects under one Location. Keys are relative to its prefix ("a/b.bin")."""

    location: Location

    def put_file(self, key: str, path: Path) -> None:
        """Upload a local file (large files: multipart, parts in parallel)."""
        ...

    def put_bytes(self, key: str, data: bytes) -> None: ...

    def get_file(self, key: str, path: Path) -> None:
        """Download into `path` (large: parallel ranged reads) through `path.tmp`, renamed at
        the end; NotFound when missing."""
        ...

    def get_bytes(self, key: str) -> bytes:
        """The object's bytes; NotFound when missing."""
        ...

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object whose key starts with `prefix`, sorted by key."""
        ...

    def delete(self, keys: Iterable[str]) -> None:
        """Delete these objects; keys that do not exist are fine."""
        ...

    def region(self) -> str | None:
        """The bucket's region or location from the storage API; None for files."""
        ...


class Retrier:
    """Runs an operation, mapping its failures to StorageError and retrying the retryable
    ones (after `retries` more tries, the last error is raised) with the project's Backoff."""

    def __init__(
        self,
        retries: int,
        translate: Callable[[BaseException, str], StorageError | None],
        *,
        sleep: Callable[[float], None] = time.sleep,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.retries, self.translate, self.sleep, self.rng = max(0, retries), translate, sleep, rng

    def run(self, what: str, call: Callable[[], T]) -> T:
        """`call()`; `what` is the URI named in errors."""
        backoff = Backoff(BACKOFF_BASE_S, BACKOFF_CAP_S, self.rng)
        tries = 0
        while True:
            tries += 1
            try:
                return call()
            except StorageError as error:
                mapped, cause = error, error.__cause__
            except Exception as exc:
                found = self.translate(exc, what)
                if found is None:
                    raise
                mapped, cause = found, exc
            if not mapped.retryable or tries > self.retries:
                if mapped.retryable and tries > 1:
                    mapped.args = (f"{mapped.args[0]} (after {tries} tries)",)
                raise mapped from cause
            self.sleep(backoff.next())


def tmp_beside(path: Path) -> Path:
    """`path.tmp`: where a download goes before it is renamed into place."""
    return path.with_name(path.name + ".tmp")


def download_via_tmp(path: Path, fetch: Callable[[Path], object]) -> None:
    """`fetch(path.tmp)` then rename to `path`; the partial file is removed on failure."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_beside(path)
    try:
        fetch(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def source_file(path: Path, where: str) -> Path:
    """A local file to upload; StorageError naming it when it is not a readable file."""
    path = Path(path)
    if not path.is_file():
        raise StorageError(f"{path}: not a file (to upload to {where})")
    return path
