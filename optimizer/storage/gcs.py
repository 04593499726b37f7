"""gs:// stores through google-cloud-storage.

STORAGE_EMULATOR_HOST is honoured by the library itself; with it set and no project
configured (GOOGLE_CLOUD_PROJECT / GCLOUD_PROJECT), the client is anonymous, as emulators
expect. The library's own retries are off (`retry=None`): the store's Retrier is the one retry.

Transfers: downloads of objects over one part go through `transfer_manager`
(`download_chunks_concurrently`, ranged reads in threads). Uploads are one resumable upload
in chunks of `part_mib`: the parallel upload (`upload_chunks_concurrently`) uses the XML
multipart API, which neither GCS emulator serves (404 / 501), so it could not be tested here.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from optimizer.storage.base import MIB, ObjectInfo, Retrier, download_via_tmp, source_file
from optimizer.storage.errors import AccessDenied, NotFound, StorageError, Unreachable
from optimizer.storage.location import Location, check_key

PROJECT_ENV = ("GOOGLE_CLOUD_PROJECT", "GCLOUD_PROJECT")
EMULATOR_ENV = "STORAGE_EMULATOR_HOST"


def make_client() -> Any:
    """A storage client: anonymous against an emulator with no project set, else ADC."""
    from google.cloud import storage

    project = next((os.environ[n] for n in PROJECT_ENV if os.environ.get(n)), None)
    if os.environ.get(EMULATOR_ENV) and project is None:
        from google.auth.credentials import AnonymousCredentials

        return storage.Client(project="gpuopt-emulator", credentials=AnonymousCredentials())
    return storage.Client(project=project)


class GcsStore:
    """Objects under `gs://bucket/prefix`."""

    def __init__(
        self, location: Location, retrier: Retrier, *, part_mib: int, concurrency: int
    ) -> None:
        self.location = location
        self.retrier = retrier
        self.part_bytes = part_mib * MIB
        self.concurrency = concurrency
        self._client: Any = None

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = self.retrier.run(str(self.location), make_client)
        return self._client

    def _blob(self, key: str) -> tuple[Any, str]:
        key = check_key(key, self.location)
        full = self.location.join(key)
        return self.client.bucket(self.location.bucket).blob(full.prefix), str(full)

    def _run(self, uri: str, call: Callable[[], Any]) -> Any:
        return self.retrier.run(uri, call)

    def put_file(self, key: str, path: Path) -> None:
        blob, uri = self._blob(key)
        source = source_file(path, uri)
        if source.stat().st_size > self.part_bytes:
            blob.chunk_size = self.part_bytes  # a resumable upload, one chunk per request
        self._run(uri, lambda: blob.upload_from_filename(str(source), retry=None))

    def put_bytes(self, key: str, data: bytes) -> None:
        blob, uri = self._blob(key)
        if len(data) > self.part_bytes:
            blob.chunk_size = self.part_bytes
        self._run(uri, lambda: blob.upload_from_string(data, retry=None))

    def get_file(self, key: str, path: Path) -> None:
        blob, uri = self._blob(key)

        def fetch(tmp: Path) -> None:
            blob.reload(retry=None)  # the size (and NotFound before any byte is written)
            if (blob.size or 0) <= self.part_bytes:
                blob.download_to_filename(str(tmp), retry=None)
                return
            from google.cloud.storage import transfer_manager

            transfer_manager.download_chunks_concurrently(
                blob,
                str(tmp),
                chunk_size=self.part_bytes,
                download_kwargs={"retry": None},
                worker_type=transfer_manager.THREAD,
                max_workers=self.concurrency,
            )

        self._run(uri, lambda: download_via_tmp(Path(path), fetch))

    def get_bytes(self, key: str) -> bytes:
        blob, uri = self._blob(key)
        result: bytes = self._run(uri, lambda: blob.download_as_bytes(retry=None))
        return result

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        base = f"{self.location.prefix}/" if self.location.prefix else ""
        where = str(self.location) + (f"/{prefix}" if prefix else "")

        def call() -> list[ObjectInfo]:
            blobs = self.client.list_blobs(self.location.bucket, prefix=base + prefix, retry=None)
            return [ObjectInfo(b.name[len(base) :], int(b.size or 0)) for b in blobs]

        found: list[ObjectInfo] = self._run(where, call)
        return sorted(found, key=lambda o: o.key)

    def delete(self, keys: Iterable[str]) -> None:
        blobs = [self._blob(k) for k in keys]
        if not blobs:
            return
        # One request per object, several at a time (a JSON batch is not served by every
        # emulator); a missing object is not an error.
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(blobs))) as pool:
            for future in [pool.submit(self._delete_one, b, u) for b, u in blobs]:
                future.result()

    def _delete_one(self, blob: Any, uri: str) -> None:
        with contextlib.suppress(NotFound):
            self._run(uri, lambda: blob.delete(retry=None))

    def region(self) -> str | None:
        where = f"gs://{self.location.bucket}"

        def call() -> str | None:
            bucket = self.client.get_bucket(self.location.bucket, retry=None)
            return bucket.location.lower() if bucket.location else None

        result: str | None = self._run(where, call)
        return result


def translate(exc: BaseException, uri: str) -> StorageError | None:
    """A google-cloud-storage failure as a StorageError naming `uri`; None when it is not a
    storage failure."""
    import requests
    from google.api_core import exceptions as gx
    from google.auth import exceptions as ax

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, gx.GoogleAPICallError):
            return _from_status(int(current.code or 0), type(current).__name__, uri)
        status = getattr(getattr(current, "response", None), "status_code", None)
        if isinstance(status, int) and type(current).__name__ == "InvalidResponse":
            return _from_status(status, f"HTTP {status}", uri)  # google-resumable-media
        if isinstance(current, ax.DefaultCredentialsError):
            return AccessDenied(f"{uri}: access denied (no Google credentials found: {current})")
        if isinstance(current, ax.TransportError | requests.ConnectionError | requests.Timeout):
            return Unreachable(f"{uri}: cannot reach the storage endpoint ({current})")
        current = current.__cause__ or current.__context__
    return None


def _from_status(status: int, name: str, uri: str) -> StorageError:
    if status == 404:
        return NotFound(f"{uri}: not found ({name})")
    if status in (401, 403):
        return AccessDenied(f"{uri}: access denied ({name})")
    retryable = status in (408, 429) or status >= 500
    return StorageError(f"{uri}: storage error ({name}, HTTP {status})", retryable=retryable)
