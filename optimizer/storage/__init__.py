"""Object storage: one small interface over S3, GCS and local folders.

    store = open_store("s3://bucket/jobs/42")
    store.put_file("step-500/model.pt", Path("model.pt"))
    store.list("step-500/")

Credentials and endpoints come from each SDK's standard configuration (docs/storage.md).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from optimizer.storage.base import ObjectInfo, ObjectStore, Retrier
from optimizer.storage.errors import AccessDenied, BadUri, NotFound, StorageError, Unreachable
from optimizer.storage.location import Location, parse_uri

__all__ = [
    "AccessDenied",
    "BadUri",
    "Location",
    "NotFound",
    "ObjectInfo",
    "ObjectStore",
    "StorageError",
    "Unreachable",
    "open_store",
    "parse_uri",
]


def open_store(
    location: Location | str,
    *,
    retries: int = 4,
    part_mib: int = 8,
    concurrency: int = 8,
    sleep: Callable[[float], None] = time.sleep,
    rng: Callable[[], float] = random.random,
) -> ObjectStore:
    """The store at `location` (a Location or a URI). Transient failures are tried again up
    to `retries` times with the project's back-off (`sleep` and `rng` pace it; tests pass
    their own); objects over `part_mib` MiB move in parts, `concurrency` at a time."""
    where = parse_uri(location) if isinstance(location, str) else location
    if part_mib < 5 and where.scheme == "s3":
        # S3's smallest multipart part (S3 API reference, "Amazon S3 multipart upload limits")
        raise BadUri(f"{where}: part_mib {part_mib} is below S3's 5 MiB minimum part size")
    if part_mib < 1 or concurrency < 1:
        raise BadUri(f"{where}: part_mib and concurrency must be at least 1")
    if where.scheme == "file":
        from optimizer.storage.local import FileStore

        return FileStore(where)
    if where.scheme == "s3":
        from optimizer.storage import s3

        retrier = Retrier(retries, s3.translate, sleep=sleep, rng=rng)
        return s3.S3Store(where, retrier, part_mib=part_mib, concurrency=concurrency)
    if where.scheme == "gs":
        from optimizer.storage import gcs

        retrier = Retrier(retries, gcs.translate, sleep=sleep, rng=rng)
        return gcs.GcsStore(where, retrier, part_mib=part_mib, concurrency=concurrency)
    raise BadUri(f"{where}: unsupported scheme {where.scheme!r}")
