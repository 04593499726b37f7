"""Object-storage servers for tests, each a real subprocess on a free loopback port.

    with s3_server() as s3:            # moto_server
        monkeypatch.setenv(...) for each of s3.env   (or the fixture `object_s3`)
        uri = s3.make_bucket("my-bucket", region="eu-central-1")   # "s3://my-bucket"
    with gcs_server() as gcs:          # gcp-storage-emulator
        uri = gcs.make_bucket("my-bucket", location="EUROPE-WEST4")  # "gs://my-bucket"

The stores under test find the servers through the SDKs' standard variables in `.env`
(AWS_ENDPOINT_URL_S3, STORAGE_EMULATOR_HOST); the helpers' own clients are given the
endpoint directly. Each server is killed (its own pid only) when the block exits.

Why gcp-storage-emulator and not fake-gcs-server's wrapper: both serve google-cloud-storage's
uploads (simple and resumable in chunks), downloads and transfer_manager's chunked downloads,
and neither serves the XML multipart API behind transfer_manager's parallel upload. The pure
Python emulator keeps a bucket's location (set with a PATCH after the create; the Go server
has one location per server, from a flag, and ignores the one asked for), serves JSON batch
requests, and needs no platform binary.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tests.helpers.waiting import wait_until

START_TIMEOUT_S = 60.0  # imports alone take seconds on a loaded 2-core machine
S3_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answers(url: str, proc: subprocess.Popen[bytes]) -> bool:
    if proc.poll() is not None:
        raise RuntimeError(f"the server for {url} exited with {proc.returncode}")
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True  # it answered
    except OSError:
        return False


@contextlib.contextmanager
def _process(command: list[str], probe: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """Start `command` (its `{port}` filled) on a free port until `probe` answers; yields the
    base URL. A port taken between the pick and the bind makes the server exit: try another."""
    for attempt in range(3):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with tempfile.TemporaryFile() as log:
            proc = subprocess.Popen(
                [part.format(port=port) for part in command],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
            )
            try:
                try:
                    wait_until(
                        functools.partial(_answers, url + probe, proc),
                        timeout=START_TIMEOUT_S,
                        what=f"{command[2]} on port {port}",
                        interval=0.05,
                    )
                except RuntimeError:
                    if attempt == 2:
                        log.seek(0)
                        raise RuntimeError(log.read().decode(errors="replace")[-2000:]) from None
                    continue
                yield url
                return
            finally:
                proc.kill()
                proc.wait(timeout=30)


@dataclass
class S3Server:
    endpoint: str
    env: dict[str, str] = field(default_factory=dict)

    def client(self, **kwargs: Any) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name=kwargs.pop("region_name", "us-east-1"),
            **kwargs,
        )

    def make_bucket(self, name: str, region: str | None = None) -> str:
        """Create bucket `name` (in `region`, us-east-1 by default); returns "s3://name"."""
        args: dict[str, Any] = {"Bucket": name}
        if region and region != "us-east-1":
            args["CreateBucketConfiguration"] = {"LocationConstraint": region}
        self.client(region_name=region or "us-east-1").create_bucket(**args)
        return f"s3://{name}"


@dataclass
class GcsServer:
    endpoint: str
    env: dict[str, str] = field(default_factory=dict)

    def client(self) -> Any:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(
            project="test",
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": self.endpoint},
        )

    def make_bucket(self, name: str, location: str | None = None) -> str:
        """Create bucket `name` (at `location`, e.g. "EUROPE-WEST4"); returns "gs://name".

        The emulator ignores the location of a create, so it is set by a PATCH after it."""
        client = self.client()
        bucket = client.create_bucket(name)
        if location:
            bucket._patch_property("location", location)
            bucket.patch()
        return f"gs://{name}"


@contextlib.contextmanager
def s3_server() -> Iterator[S3Server]:
    """moto_server on a free loopback port, until the block exits."""
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", "{port}"]
    with _process(command, "/moto-api/") as url:
        yield S3Server(url, {"AWS_ENDPOINT_URL_S3": url, **S3_CREDENTIALS})


@contextlib.contextmanager
def gcs_server() -> Iterator[GcsServer]:
    """gcp-storage-emulator (in memory) on a free loopback port, until the block exits."""
    command = [
        sys.executable,
        "-m",
        "gcp_storage_emulator",
        "start",
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
        "--in-memory",
    ]
    with _process(command, "/storage/v1/b?project=test") as url:
        yield GcsServer(url, {"STORAGE_EMULATOR_HOST": url})
