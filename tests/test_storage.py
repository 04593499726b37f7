"""optimizer.storage: URIs, and each backend (files, S3 on moto_server, GCS on an emulator)
through the same assertions, with real servers on loopback."""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from botocore.stub import Stubber

import optimizer.storage.s3 as s3_module
from optimizer.storage import (
    AccessDenied,
    BadUri,
    Location,
    NotFound,
    ObjectInfo,
    ObjectStore,
    StorageError,
    Unreachable,
    open_store,
    parse_uri,
)
from tests.helpers.objstore import free_port

pytestmark = pytest.mark.usefixtures("aws_env")
MIB = 1 << 20


def unique(stem: str = "b") -> str:
    return f"{stem}-{uuid.uuid4().hex[:12]}"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- URIs ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "scheme", "bucket", "prefix", "canonical"),
    [
        ("s3://bucket", "s3", "bucket", "", "s3://bucket"),
        ("s3://bucket/", "s3", "bucket", "", "s3://bucket"),
        ("s3://my.bucket-1/jobs/42/", "s3", "my.bucket-1", "jobs/42", "s3://my.bucket-1/jobs/42"),
        ("S3://bucket/a", "s3", "bucket", "a", "s3://bucket/a"),
        ("gs://my_bucket/ckpt", "gs", "my_bucket", "ckpt", "gs://my_bucket/ckpt"),
        ("file:///data/ckpt/", "file", "", "/data/ckpt", "file:///data/ckpt"),
        ("file://localhost/data", "file", "", "/data", "file:///data"),
    ],
)
def test_parse_uri_reads_good_uris(
    text: str, scheme: str, bucket: str, prefix: str, canonical: str
) -> None:
    location = parse_uri(text)
    assert location == Location(scheme, bucket, prefix)
    assert str(location) == canonical
    assert parse_uri(str(location)) == location


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "empty storage URI"),
        ("gs://", "no bucket name after gs://"),
        ("s3:///prefix", "no bucket name after s3://"),
        ("ftp://host/x", "unsupported scheme 'ftp'"),
        ("bucket/prefix", "not a storage URI"),
        ("file://relative/path", "a relative path is not allowed"),
        ("file://", "no path after file://"),
        ("file:///a/../b", "'..'"),
        ("s3://Bucket/x", "'Bucket' is not a valid bucket name"),
        ("s3://ab", "'ab' is not a valid bucket name"),
        ("s3://bucket/a//b", "empty, '.' or '..' segment"),
        ("gs://bucket/a/../b", "empty, '.' or '..' segment"),
        ("s3://bucket/a?versionId=1", "query strings"),
    ],
)
def test_parse_uri_names_the_problem(text: str, problem: str) -> None:
    with pytest.raises(BadUri, match="^.*" + problem.replace("?", r"\?").replace(".", r"\.")):
        parse_uri(text)


def test_location_join_appends_a_checked_key() -> None:
    assert str(parse_uri("s3://bucket").join("a/b")) == "s3://bucket/a/b"
    assert str(parse_uri("gs://bucket/p").join("/a/")) == "gs://bucket/p/a"
    assert str(parse_uri("file:///data").join("x.bin")) == "file:///data/x.bin"
    with pytest.raises(BadUri, match=r"'\.\./x'"):
        parse_uri("file:///data").join("../x")


def test_open_store_refuses_parts_below_s3_minimum() -> None:
    with pytest.raises(BadUri, match="5 MiB"):
        open_store("s3://bucket/x", part_mib=4)


# -- every backend, the same assertions ------------------------------------------------------


@pytest.fixture
def s3_env(object_s3: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    for name, value in object_s3.env.items():
        monkeypatch.setenv(name, value)
    return object_s3


@pytest.fixture
def gcs_env(object_gcs: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    for name in ("GOOGLE_CLOUD_PROJECT", "GCLOUD_PROJECT", "GOOGLE_APPLICATION_CREDENTIALS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in object_gcs.env.items():
        monkeypatch.setenv(name, value)
    return object_gcs


@pytest.fixture(params=["file", "s3", "gs"])
def bucket_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty bucket (a folder for file://) of each backend."""
    if request.param == "file":
        return f"file://{tmp_path / 'bucket'}"
    if request.param == "s3":
        return str(request.getfixturevalue("s3_env").make_bucket(unique()))
    return str(request.getfixturevalue("gcs_env").make_bucket(unique()))


@pytest.fixture
def store(bucket_uri: str) -> ObjectStore:
    return open_store(f"{bucket_uri}/runs/7", part_mib=5, concurrency=4)


def test_bytes_round_trip(store: ObjectStore) -> None:
    store.put_bytes("a/hello.txt", b"hello")
    assert store.get_bytes("a/hello.txt") == b"hello"
    store.put_bytes("a/hello.txt", b"again")
    assert store.get_bytes("a/hello.txt") == b"again"


def test_large_file_round_trips_in_parts(store: ObjectStore, tmp_path: Path) -> None:
    source = tmp_path / "big.bin"
    source.write_bytes(os.urandom(20 * MIB + 123))
    store.put_file("ckpt/big.bin", source)
    target = tmp_path / "out" / "big.bin"
    store.get_file("ckpt/big.bin", target)
    assert sha256(target) == sha256(source)
    assert not (tmp_path / "out" / "big.bin.tmp").exists()
    small = tmp_path / "small.bin"
    small.write_bytes(b"x" * 1000)
    store.put_file("ckpt/small.bin", small)
    store.get_file("ckpt/small.bin", tmp_path / "small.out")
    assert (tmp_path / "small.out").read_bytes() == small.read_bytes()


def test_list_under_a_prefix_with_keys_relative_to_the_store(
    bucket_uri: str, store: ObjectStore
) -> None:
    outside = open_store(bucket_uri)
    outside.put_bytes("runs/70/x", b"not ours")  # shares the string prefix "runs/7"
    for key, size in [("data/s1/a", 1), ("data/s1/b", 22), ("data/s2/a", 3), ("manifests/s1", 4)]:
        store.put_bytes(key, b"z" * size)
    assert store.list("data/s1/") == [ObjectInfo("data/s1/a", 1), ObjectInfo("data/s1/b", 22)]
    assert [o.key for o in store.list("data/")] == ["data/s1/a", "data/s1/b", "data/s2/a"]
    assert [o.key for o in store.list()] == ["data/s1/a", "data/s1/b", "data/s2/a", "manifests/s1"]
    assert store.list("nothing/") == []
    assert ObjectInfo("runs/70/x", 8) in outside.list()


def test_delete_removes_and_ignores_missing_keys(store: ObjectStore) -> None:
    for key in ("d/1", "d/2", "keep"):
        store.put_bytes(key, b"1")
    store.delete(["d/1", "d/2", "never/was"])
    assert [o.key for o in store.list()] == ["keep"]
    store.delete([])
    with pytest.raises(NotFound, match=r"runs/7/d/1: not found"):
        store.get_bytes("d/1")


def test_missing_object_is_not_found_naming_the_uri(store: ObjectStore, tmp_path: Path) -> None:
    with pytest.raises(NotFound, match=r"runs/7/no/such: not found"):
        store.get_bytes("no/such")
    with pytest.raises(NotFound, match=r"runs/7/no/such: not found"):
        store.get_file("no/such", tmp_path / "out.bin")
    assert list(tmp_path.iterdir()) in ([], [tmp_path / "bucket"])  # no out.bin, no .tmp


def test_keys_cannot_escape_the_store(store: ObjectStore) -> None:
    with pytest.raises(BadUri, match=r"'\.\./x'"):
        store.put_bytes("../x", b"1")
    with pytest.raises(BadUri, match="empty key"):
        store.get_bytes("/")


def test_missing_bucket_is_not_found(s3_env: Any, gcs_env: Any) -> None:
    for uri in (f"s3://{unique()}/p", f"gs://{unique()}/p"):
        with pytest.raises(NotFound, match=f"^{uri}"):
            open_store(uri, retries=0).list()
        with pytest.raises(NotFound, match=uri.rsplit("/", 1)[0]):
            open_store(uri, retries=0).region()


# -- regions ---------------------------------------------------------------------------------


def test_s3_region_comes_from_get_bucket_location(s3_env: Any) -> None:
    assert open_store(s3_env.make_bucket(unique(), region="eu-central-1")).region() == (
        "eu-central-1"
    )
    # GetBucketLocation answers null for us-east-1
    assert open_store(s3_env.make_bucket(unique())).region() == "us-east-1"


def test_gcs_region_is_the_bucket_location_lower_cased(gcs_env: Any) -> None:
    assert open_store(gcs_env.make_bucket(unique(), location="EUROPE-WEST4")).region() == (
        "europe-west4"
    )
    assert open_store(gcs_env.make_bucket(unique(), location="EU")).region() == "eu"


def test_file_store_has_no_region(tmp_path: Path) -> None:
    assert open_store(f"file://{tmp_path}").region() is None


# -- S3 specifics ----------------------------------------------------------------------------


def test_s3_large_upload_is_multipart(s3_env: Any, tmp_path: Path) -> None:
    bucket = s3_env.make_bucket(unique())
    source = tmp_path / "big.bin"
    source.write_bytes(os.urandom(12 * MIB))
    open_store(bucket, part_mib=5).put_file("big.bin", source)
    head = s3_env.client().head_object(Bucket=bucket.removeprefix("s3://"), Key="big.bin")
    assert head["ETag"].strip('"').endswith("-3")  # a multipart ETag: "<md5 of md5s>-<parts>"


def test_s3_endpoint_comes_from_the_standard_environment(
    s3_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = s3_env.make_bucket(unique())
    store = open_store(bucket)
    assert store.client.meta.endpoint_url == s3_env.endpoint  # type: ignore[attr-defined]
    # the generic variable works too, with no code of ours involved
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_env.endpoint)
    open_store(bucket).put_bytes("k", b"via AWS_ENDPOINT_URL")
    assert open_store(bucket).get_bytes("k") == b"via AWS_ENDPOINT_URL"
    assert "endpoint_url=" not in inspect.getsource(s3_module)


def test_s3_access_denied_by_iam_is_mapped_and_not_retried(tmp_path: Path) -> None:
    """A dedicated moto_server with IAM checks on: a user allowed only to list the bucket."""
    from tests.helpers.objstore import s3_server

    with s3_server() as server, pytest.MonkeyPatch.context() as mp:
        bucket = server.make_bucket(unique())
        name = bucket.removeprefix("s3://")
        server.client().put_object(Bucket=name, Key="secret", Body=b"s")
        iam = server_client(server, "iam")
        iam.create_user(UserName="reader")
        iam.put_user_policy(
            UserName="reader",
            PolicyName="list-only",
            PolicyDocument=json.dumps(
                {
                    "Version": "2012-10-17",
                    # AWS authorizes ListObjectsV2 as s3:ListBucket; moto 5.2 checks it as its
                    # own name: both, so the user can list and nothing more on either.
                    "Statement": [
                        {
                            "Effect": "Allow",
                            "Action": ["s3:ListBucket", "s3:ListObjectsV2"],
                            "Resource": "*",
                        }
                    ],
                }
            ),
        )
        key = iam.create_access_key(UserName="reader")["AccessKey"]
        # from here on moto checks every request against IAM
        request = urllib.request.Request(
            f"{server.endpoint}/moto-api/reset-auth",
            data=b"0",
            method="POST",
            headers={"Content-Type": "text/plain"},
        )
        urllib.request.urlopen(request, timeout=10).close()
        for env_name, value in server.env.items():
            mp.setenv(env_name, value)
        mp.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
        mp.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])
        mp.delenv("AWS_SESSION_TOKEN", raising=False)
        waits: list[float] = []
        store = open_store(bucket, sleep=waits.append)
        assert [o.key for o in store.list()] == ["secret"]
        with pytest.raises(
            AccessDenied, match=rf"^{bucket}/secret: access denied \(AccessDenied\)"
        ):
            store.get_bytes("secret")
        with pytest.raises(AccessDenied, match=rf"^{bucket}/new: access denied"):
            store.put_bytes("new", b"n")
        assert waits == []


def server_client(server: Any, service: str) -> Any:
    import boto3

    return boto3.client(
        service,
        endpoint_url=server.endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )


def test_s3_transient_errors_are_retried_and_final_errors_are_not(s3_env: Any) -> None:
    waits: list[float] = []
    store = open_store("s3://bucket/p", retries=3, sleep=waits.append, rng=lambda: 0.0)
    with Stubber(store.client) as stub:  # type: ignore[attr-defined]
        stub.add_client_error("get_object", "SlowDown", http_status_code=503)
        stub.add_client_error("get_object", "InternalError", http_status_code=500)
        stub.add_response("get_object", {"Body": _Body(b"ok")})
        assert store.get_bytes("k") == b"ok"
        assert waits == [0.25, 0.5]  # the project's Backoff: d/2 with base 0.5, doubling
        waits.clear()
        stub.add_client_error("get_object", "AccessDenied", http_status_code=403)
        with pytest.raises(AccessDenied, match=r"^s3://bucket/p/k: access denied"):
            store.get_bytes("k")
        stub.add_client_error("get_object", "NoSuchKey", http_status_code=404)
        with pytest.raises(NotFound):
            store.get_bytes("k")
        assert waits == []
        for _ in range(4):
            stub.add_client_error("get_object", "SlowDown", http_status_code=503)
        with pytest.raises(StorageError, match=r"\(SlowDown\).*after 4 tries") as caught:
            store.get_bytes("k")
        assert caught.value.retryable
        assert waits == [0.25, 0.5, 1.0]


def test_s3_transfer_giving_up_is_mapped_through_its_last_exception() -> None:
    """s3transfer raises RetriesExceededError(last_exception) when a ranged GET keeps timing
    out (seen against a loaded moto_server with 32 parts at a time)."""
    import boto3.exceptions
    import botocore.exceptions
    from s3transfer.exceptions import RetriesExceededError

    timeout = botocore.exceptions.ReadTimeoutError(endpoint_url="http://127.0.0.1:1/b/k")
    try:
        try:
            raise RetriesExceededError(timeout)
        except RetriesExceededError as inner:
            raise boto3.exceptions.RetriesExceededError(inner.last_exception) from None
    except boto3.exceptions.RetriesExceededError as outer:
        mapped = s3_module.translate(outer, "s3://b/k")
    assert isinstance(mapped, Unreachable)
    assert str(mapped).startswith("s3://b/k: cannot reach the storage endpoint (Read timeout")


class _Body:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self) -> bytes:
        return self.data


# -- GCS error mapping (the emulator grants everything and never throttles) ------------------


def test_gcs_errors_are_mapped_by_status() -> None:
    from google.api_core import exceptions as gx
    from google.resumable_media import InvalidResponse

    import optimizer.storage.gcs as gcs_module

    denied = gcs_module.translate(gx.Forbidden("no"), "gs://b/k")
    assert isinstance(denied, AccessDenied)
    assert str(denied) == "gs://b/k: access denied (Forbidden)"
    assert isinstance(gcs_module.translate(gx.NotFound("no"), "gs://b/k"), NotFound)
    throttled = gcs_module.translate(gx.TooManyRequests("slow"), "gs://b/k")
    assert type(throttled) is StorageError and throttled.retryable

    class Response:
        status_code = 503

    # an upload's failure arrives from google-resumable-media, wrapped
    try:
        try:
            raise InvalidResponse(Response(), "unavailable")
        except InvalidResponse as inner:
            raise RuntimeError("upload failed") from inner
    except RuntimeError as outer:
        unavailable = gcs_module.translate(outer, "gs://b/k")
    assert unavailable is not None and unavailable.retryable
    assert "HTTP 503" in str(unavailable)
    assert gcs_module.translate(ValueError("a bug"), "gs://b/k") is None


def test_large_bytes_round_trip(store: ObjectStore) -> None:
    data = os.urandom(11 * MIB)
    store.put_bytes("big", data)
    assert store.get_bytes("big") == data


# -- unreachable endpoints -------------------------------------------------------------------


@pytest.fixture
def closed_port() -> int:
    return free_port()  # bound and released: nothing listens there


@pytest.mark.parametrize("scheme", ["s3", "gs"])
def test_closed_port_is_unreachable_after_the_backoff_waits(
    scheme: str, closed_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint = f"http://127.0.0.1:{closed_port}"
    if scheme == "s3":
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)
    else:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
        monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
    waits: list[float] = []
    store = open_store(f"{scheme}://bucket/p", retries=3, sleep=waits.append, rng=lambda: 1.0)
    with pytest.raises(Unreachable, match=rf"^{scheme}://bucket/p/k: cannot reach .*after 4 tries"):
        store.get_bytes("k")
    assert waits == [0.5, 1.0, 2.0]  # full delays with rng 1.0: base 0.5, doubling


# -- file:// specifics -----------------------------------------------------------------------


def test_file_store_writes_whole_files_and_tidies_folders(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path / 'root'}")
    store.put_bytes("a/b/c.bin", b"123")
    (tmp_path / "root" / "a" / "b" / ".c.bin.gpuopt-tmp-feed").write_bytes(b"partial")
    assert store.list() == [ObjectInfo("a/b/c.bin", 3)]  # an in-flight write is not listed
    (tmp_path / "root" / "a" / "b" / ".c.bin.gpuopt-tmp-feed").unlink()
    store.delete(["a/b/c.bin"])
    assert list((tmp_path / "root").iterdir()) == []  # emptied folders go with the object


def test_file_store_unreadable_object_is_access_denied(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads any file")
    store = open_store(f"file://{tmp_path}")
    store.put_bytes("locked", b"x")
    (tmp_path / "locked").chmod(0)
    with pytest.raises(AccessDenied, match=r"/locked: access denied"):
        store.get_bytes("locked")


def test_upload_of_a_missing_local_file_names_it(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}")
    with pytest.raises(StorageError, match=r"nope\.bin: not a file"):
        store.put_file("k", tmp_path / "nope.bin")
