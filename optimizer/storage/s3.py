"""s3:// stores through boto3.

The endpoint comes from boto3's own configuration (AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, or
the config file's `endpoint_url`), so a test server or an S3-compatible store needs no code
here. boto3's retries are off: the store's Retrier (the project's Backoff) is the one retry.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions as bx
from boto3.s3.transfer import TransferConfig
from botocore.config import Config

from optimizer.storage.base import MIB, ObjectInfo, Retrier, download_via_tmp, source_file
from optimizer.storage.errors import AccessDenied, NotFound, StorageError, Unreachable
from optimizer.storage.location import Location, check_key

DELETE_BATCH = 1000  # DeleteObjects takes at most 1,000 keys (S3 API reference)
# Error codes by meaning (S3 API reference, "Error responses"; botocore's HEAD errors carry
# only the status code, hence "404" and "403").
NOT_FOUND_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "NotFound", "404"})
DENIED_CODES = frozenset(
    {
        "AccessDenied",
        "403",
        "AllAccessDisabled",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "AccountProblem",
    }
)
TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "InternalError",
        "ServiceUnavailable",
        "503",
        "500",
    }
)


class S3Store:
    """Objects under `s3://bucket/prefix`."""

    def __init__(
        self, location: Location, retrier: Retrier, *, part_mib: int, concurrency: int
    ) -> None:
        self.location = location
        self.retrier = retrier
        self.part_bytes = part_mib * MIB
        self.transfer = TransferConfig(
            multipart_threshold=self.part_bytes,
            multipart_chunksize=self.part_bytes,
            max_concurrency=concurrency,
            use_threads=True,
        )
        config = Config(
            retries={"total_max_attempts": 1, "mode": "standard"},
            max_pool_connections=max(10, concurrency),
        )
        self._client: Any = boto3.session.Session().client("s3", config=config)

    @property
    def client(self) -> Any:
        """The boto3 S3 client (its endpoint is boto3's configured one)."""
        return self._client

    def _key(self, key: str) -> tuple[str, str]:
        key = check_key(key, self.location)
        full = self.location.join(key)
        return full.prefix, str(full)

    def _run(self, uri: str, call: Callable[[], Any]) -> Any:
        return self.retrier.run(uri, call)

    def put_file(self, key: str, path: Path) -> None:
        name, uri = self._key(key)
        source = source_file(path, uri)
        self._run(
            uri,
            lambda: self._client.upload_file(
                str(source), self.location.bucket, name, Config=self.transfer
            ),
        )

    def put_bytes(self, key: str, data: bytes) -> None:
        name, uri = self._key(key)
        if len(data) <= self.part_bytes:
            call = lambda: self._client.put_object(  # noqa: E731
                Bucket=self.location.bucket, Key=name, Body=data
            )
        else:
            call = lambda: self._client.upload_fileobj(  # noqa: E731
                io.BytesIO(data), self.location.bucket, name, Config=self.transfer
            )
        self._run(uri, call)

    def get_file(self, key: str, path: Path) -> None:
        name, uri = self._key(key)
        self._run(
            uri,
            lambda: download_via_tmp(
                Path(path),
                lambda tmp: self._client.download_file(
                    self.location.bucket, name, str(tmp), Config=self.transfer
                ),
            ),
        )

    def get_bytes(self, key: str) -> bytes:
        name, uri = self._key(key)

        def call() -> bytes:
            answer = self._client.get_object(Bucket=self.location.bucket, Key=name)
            return bytes(answer["Body"].read())

        result: bytes = self._run(uri, call)
        return result

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        base = f"{self.location.prefix}/" if self.location.prefix else ""
        where = str(self.location) + (f"/{prefix}" if prefix else "")

        def call() -> list[ObjectInfo]:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.location.bucket, Prefix=base + prefix
            )
            return [
                ObjectInfo(item["Key"][len(base) :], int(item["Size"]))
                for page in pages
                for item in page.get("Contents", ())
            ]

        found: list[ObjectInfo] = self._run(where, call)
        return sorted(found, key=lambda o: o.key)

    def delete(self, keys: Iterable[str]) -> None:
        names = [self._key(k)[0] for k in keys]
        for start in range(0, len(names), DELETE_BATCH):
            batch = names[start : start + DELETE_BATCH]
            self._run(str(self.location), functools.partial(self._delete_batch, batch))

    def _delete_batch(self, names: Sequence[str]) -> None:
        answer = self._client.delete_objects(
            Bucket=self.location.bucket,
            Delete={"Objects": [{"Key": n} for n in names], "Quiet": True},
        )
        errors = [e for e in answer.get("Errors", ()) if e.get("Code") not in NOT_FOUND_CODES]
        if errors:
            first = errors[0]
            uri = f"s3://{self.location.bucket}/{first.get('Key', '')}"
            raise _from_code(str(first.get("Code", "")), uri, first.get("Message", ""))

    def region(self) -> str | None:
        where = f"s3://{self.location.bucket}"

        def call() -> str:
            answer = self._client.get_bucket_location(Bucket=self.location.bucket)
            # None means us-east-1; "EU" is the legacy name of eu-west-1 (S3 API reference,
            # GetBucketLocation).
            constraint = answer.get("LocationConstraint") or "us-east-1"
            return "eu-west-1" if constraint == "EU" else str(constraint)

        result: str = self._run(where, call)
        return result


def _from_code(code: str, uri: str, message: str = "", status: int = 0) -> StorageError:
    detail = f" ({code})" if code else ""
    if code in NOT_FOUND_CODES or status == 404:
        return NotFound(f"{uri}: not found{detail}")
    if code in DENIED_CODES or status == 403:
        return AccessDenied(f"{uri}: access denied{detail}")
    retryable = code in TRANSIENT_CODES or status >= 500 or status == 429
    text = f": {message}" if message else ""
    return StorageError(f"{uri}: storage error{detail}{text}", retryable=retryable)


def translate(exc: BaseException, uri: str) -> StorageError | None:
    """A boto3/botocore/s3transfer failure as a StorageError naming `uri`; None when it is
    not a storage failure. Transfer errors wrap the botocore error: the chain is followed."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, bx.ClientError):
            error = current.response.get("Error", {})
            status = int(current.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
            return _from_code(str(error.get("Code", "")), uri, error.get("Message", ""), status)
        if isinstance(current, bx.NoCredentialsError | bx.PartialCredentialsError):
            return AccessDenied(f"{uri}: access denied (no AWS credentials found)")
        if isinstance(current, bx.ConnectionError | bx.HTTPClientError):
            return Unreachable(f"{uri}: cannot reach the storage endpoint ({current})")
        # s3transfer's RetriesExceededError keeps the failure it gave up on aside
        last = getattr(current, "last_exception", None)
        current = (last if isinstance(last, BaseException) else None) or (
            current.__cause__ or current.__context__
        )
    return None
