"""`jobs.state.bucket_region`: the storage API's answer, its errors sorted into a bucket that
cannot be used (refused at submit) and a storage API out of reach (the job is accepted). The
storage package is stood in for by a module with its face (contract: open_store(uri).region(),
StorageError and its subclasses)."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from optimizer.jobs.state import BucketRefused, BucketUnreachable, bucket_region


class StorageError(Exception):
    pass


class NotFound(StorageError):
    pass


class Unreachable(StorageError):
    pass


@pytest.fixture
def storage(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A storage face whose stores answer `answers[uri]` (an exception is raised)."""
    answers: dict[str, Any] = {}

    class Store:
        def __init__(self, uri: str) -> None:
            self.uri = uri

        def region(self) -> str | None:
            answer = answers[self.uri]
            if isinstance(answer, Exception):
                raise answer
            return answer  # type: ignore[no-any-return]

    fake = types.ModuleType("optimizer.storage")
    fake.StorageError = StorageError  # type: ignore[attr-defined]
    fake.Unreachable = Unreachable  # type: ignore[attr-defined]
    fake.open_store = Store  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "optimizer.storage", fake)
    return answers


def test_the_region_the_storage_api_names(storage: dict[str, Any]) -> None:
    storage["s3://bkt/r"] = "eu-west-1"
    storage["file:///srv/c"] = None
    assert bucket_region("s3://bkt/r") == "eu-west-1"
    assert bucket_region("file:///srv/c") is None


def test_a_missing_bucket_is_refused_and_an_unreachable_api_is_not(
    storage: dict[str, Any],
) -> None:
    storage["s3://gone"] = NotFound("s3://gone: no such bucket (NoSuchBucket)")
    storage["s3://far"] = Unreachable("s3://far: unreachable (EndpointConnectionError)")
    with pytest.raises(BucketRefused, match=r"^s3://gone: no such bucket \(NoSuchBucket\)$"):
        bucket_region("s3://gone")
    with pytest.raises(BucketUnreachable, match="unreachable"):
        bucket_region("s3://far")
