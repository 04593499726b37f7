"""The daemon's keeping of code archives: once per hash in its data folder, or in a bucket
(`code.store`) through the object storage layer, here a stand-in for it."""

from __future__ import annotations

import shutil
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from optimizer.code import CodeError, CodeStore

SHA = "ab" * 32


@dataclass(frozen=True)
class Info:
    key: str
    size: int


class Bucket:
    """An in-memory object store with the calls CodeStore makes."""

    def __init__(self, error: type[Exception]) -> None:
        self.objects: dict[str, bytes] = {}
        self.error = error
        self.broken = False
        self.gets = 0

    def _check(self) -> None:
        if self.broken:
            raise self.error("s3://team-code/archives: access denied (AccessDenied)")

    def list(self, prefix: str = "") -> list[Info]:
        self._check()
        return [Info(k, len(v)) for k, v in sorted(self.objects.items()) if k.startswith(prefix)]

    def put_file(self, key: str, path: Path) -> None:
        self._check()
        self.objects[key] = path.read_bytes()

    def get_file(self, key: str, path: Path) -> None:
        self._check()
        self.gets += 1
        path.write_bytes(self.objects[key])


@pytest.fixture
def bucket(monkeypatch: pytest.MonkeyPatch) -> Bucket:
    storage = types.ModuleType("optimizer.storage")
    error = type("StorageError", (Exception,), {})
    made = Bucket(error)
    storage.StorageError = error  # type: ignore[attr-defined]
    opened: list[str] = []
    storage.open_store = lambda uri: opened.append(uri) or made  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "optimizer.storage", storage)
    return made


def test_the_data_folder_keeps_each_archive_once_by_hash(tmp_path: Path) -> None:
    store = CodeStore(tmp_path / "code")
    assert not store.has(SHA) and store.size(SHA) is None and store.path(SHA) is None
    part = tmp_path / "upload.part"
    part.write_bytes(b"archive")
    store.put(SHA, part)
    assert not part.exists()  # moved, not copied
    assert store.has(SHA) and store.size(SHA) == 7
    assert store.path(SHA) == tmp_path / "code" / f"{SHA}.tar.gz"
    with pytest.raises(ValueError, match="is not a sha256"):
        store.has("../../etc/passwd")


def test_a_bucket_keeps_them_and_another_replica_serves_them(
    tmp_path: Path, bucket: Bucket
) -> None:
    store = CodeStore(tmp_path / "one", uri="s3://team-code/archives")
    part = tmp_path / "upload.part"
    part.write_bytes(b"archive bytes")
    store.put(SHA, part)
    assert bucket.objects == {f"{SHA}.tar.gz": b"archive bytes"}
    # A daemon with an empty data folder finds it in the bucket and fetches it once.
    other = CodeStore(tmp_path / "two", uri="s3://team-code/archives")
    assert other.has(SHA) and other.size(SHA) == 13
    served = other.path(SHA)
    assert served is not None and served.read_bytes() == b"archive bytes"
    assert other.path(SHA) == served and bucket.gets == 1
    shutil.rmtree(tmp_path / "two")
    assert not CodeStore(tmp_path / "three", uri="s3://x/y").has("cd" * 32)


def test_a_bucket_that_fails_is_a_code_error_naming_it(tmp_path: Path, bucket: Bucket) -> None:
    bucket.broken = True
    store = CodeStore(tmp_path / "code", uri="s3://team-code/archives")
    with pytest.raises(CodeError, match=r"code\.store s3://team-code/archives: .*access denied"):
        store.has(SHA)


def test_a_real_s3_bucket_keeps_them_for_every_replica(
    tmp_path: Path, object_s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same through the real storage layer and boto3, against moto's server."""
    for name, value in object_s3.env.items():
        monkeypatch.setenv(name, value)
    uri = object_s3.make_bucket("code-archives") + "/team"
    part = tmp_path / "upload.part"
    part.write_bytes(b"real archive bytes")
    CodeStore(tmp_path / "one", uri=uri).put(SHA, part)
    other = CodeStore(tmp_path / "two", uri=uri)
    assert other.has(SHA) and other.size(SHA) == 18
    served = other.path(SHA)
    assert served is not None and served.read_bytes() == b"real archive bytes"
    missing = CodeStore(tmp_path / "three", uri=object_s3.make_bucket("other-archives"))
    assert not missing.has(SHA)
    with pytest.raises(CodeError, match=r"code\.store s3://no-such-bucket-here: "):
        CodeStore(tmp_path / "four", uri="s3://no-such-bucket-here").has(SHA)
