"""A directory-backed object store with the methods of `optimizer.storage.ObjectStore`, for
the checkpoint tests: it counts what goes up and down, and fails on demand (after N files or
N bytes sent, as an agent killed mid-upload; every call, as an unreachable bucket)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


class FakeStoreError(Exception):
    pass


class FakeUnreachable(FakeStoreError):
    pass


class FakeNotFound(FakeStoreError):
    pass


class Killed(FakeStoreError):
    """The upload stopped here, as if the agent had been killed."""


@dataclass(frozen=True)
class FakeLocation:
    scheme: str
    bucket: str
    prefix: str

    def __str__(self) -> str:
        return f"file://{self.prefix}"


@dataclass(frozen=True)
class Info:
    key: str
    size: int


class FakeStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.location = FakeLocation("file", "", str(self.root))
        self.unreachable = False
        self.fail_after_files: int | None = None  # puts allowed before every put fails
        self.fail_after_bytes: int | None = None  # bytes allowed up before every put fails
        self.files_put = 0
        self.bytes_put = 0
        self.bytes_got = 0
        self.keys_put: list[str] = []
        self.keys_got: list[str] = []
        self.calls = 0
        self._lock = threading.Lock()

    # --- the ObjectStore methods --------------------------------------------------------------

    def put_file(self, key: str, path: Path) -> None:
        self.put_bytes(key, Path(path).read_bytes())

    def put_bytes(self, key: str, data: bytes) -> None:
        self._call()
        with self._lock:
            if self.fail_after_files is not None and self.files_put >= self.fail_after_files:
                raise Killed(f"killed before {key}")
            if self.fail_after_bytes is not None:
                room = self.fail_after_bytes - self.bytes_put
                if len(data) > room:
                    self._write(key + ".partial-upload", data[: max(room, 0)])
                    self.bytes_put += max(room, 0)
                    raise Killed(f"killed while sending {key}")
            self.files_put += 1
            self.bytes_put += len(data)
            self.keys_put.append(key)
        self._write(key, data)

    def get_file(self, key: str, path: Path) -> None:
        data = self.get_bytes(key)
        tmp = Path(str(path) + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def get_bytes(self, key: str) -> bytes:
        self._call()
        try:
            data = (self.root / key).read_bytes()
        except FileNotFoundError:
            raise FakeNotFound(f"{self.location}/{key}: not found") from None
        with self._lock:
            self.bytes_got += len(data)
            self.keys_got.append(key)
        return data

    def list(self, prefix: str = "") -> list[Info]:
        self._call()
        found = []
        for path in sorted(self.root.rglob("*")):
            key = path.relative_to(self.root).as_posix()
            if (
                path.is_file()
                and key.startswith(prefix)
                and not key.endswith((".partial-upload", ".tmp-write"))
            ):
                found.append(Info(key, path.stat().st_size))
        return found

    def delete(self, keys: Iterable[str]) -> None:
        self._call()
        for key in keys:
            (self.root / key).unlink(missing_ok=True)

    def region(self) -> str | None:
        return None

    # --- for the tests ------------------------------------------------------------------------

    def names(self, prefix: str = "") -> list[str]:
        return [i.key for i in self.list(prefix)]

    def corrupt(self, key: str) -> None:
        path = self.root / key
        data = bytearray(path.read_bytes())
        data[0] ^= 0xFF
        path.write_bytes(bytes(data))

    def reset_counts(self) -> None:
        with self._lock:
            self.bytes_got = self.bytes_put = self.files_put = 0
            self.keys_got, self.keys_put = [], []

    def _call(self) -> None:
        with self._lock:
            self.calls += 1
        if self.unreachable:
            raise FakeUnreachable(f"{self.location}: could not connect")

    def _write(self, key: str, data: bytes) -> None:
        path = self.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp-write")
        tmp.write_bytes(data)
        os.replace(tmp, path)
