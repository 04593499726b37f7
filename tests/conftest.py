"""Shared fixtures: a Store on each engine, the shared price catalog, a clean GPUOPT_*
environment (daemon_env), and for the AWS tests fake credentials, no network beyond loopback
and a moto server.

The environment fixtures are not autouse for the whole suite: a module opts in with
`pytestmark = pytest.mark.usefixtures("daemon_env")` (or "aws_env", "offline").
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from optimizer.store import Store, normalize_database_url

TEST_DATABASE_URL_ENV = "GPUOPT_TEST_DATABASE_URL"
SHARED_DIR_ENV = "GPUOPT_SHARED_DIR"
KEEP_ENV = {TEST_DATABASE_URL_ENV, SHARED_DIR_ENV}  # the test suite's own settings
LOOPBACK = {"127.0.0.1", "::1", "localhost"}


def _postgres_url() -> str:
    url = os.environ.get(TEST_DATABASE_URL_ENV, "").strip()
    if not url:
        pytest.skip(f"{TEST_DATABASE_URL_ENV} is not set")
    return normalize_database_url(url, origin=TEST_DATABASE_URL_ENV)


@pytest.fixture
def postgres_schema() -> Iterator[tuple[str, str]]:
    """(url, schema): a freshly created PostgreSQL schema, dropped with everything in it after."""
    url = _postgres_url()
    schema = f"gpuopt_test_{uuid.uuid4().hex}"
    admin = create_engine(url)
    try:
        with admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        yield url, schema
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A Store with its tables created: a SQLite file, or a throwaway PostgreSQL schema."""
    if request.param == "sqlite":
        with Store(f"sqlite:///{tmp_path / 'gpuopt.db'}") as db:
            db.create_all()
            yield db
        return
    url, schema = request.getfixturevalue("postgres_schema")
    # Closed before postgres_schema's teardown drops the schema (fixtures tear down in reverse).
    with Store(url, schema=schema) as db:
        db.create_all()
        yield db


@pytest.fixture
def shared_catalog_dir() -> Path:
    """The shared AWS/GCP catalog snapshot (`<shared>/data/catalog`)."""
    configured = os.environ.get(SHARED_DIR_ENV, "").strip()
    shared = Path(configured) if configured else Path(__file__).resolve().parents[2] / "shared"
    catalog = shared / "data" / "catalog"
    if not catalog.is_dir():
        pytest.skip(f"shared catalog not found at {catalog} (set {SHARED_DIR_ENV})")
    return catalog


# -- the environment -------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def no_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """No `COLUMNS` but the one a test sets: pytest-xdist's workers carry COLUMNS=80, and a
    piped table fits COLUMNS when it is set (optimizer/cli/render.py), so a test that reads a
    whole table would see it cut under xdist only. The one autouse environment fixture."""
    monkeypatch.delenv("COLUMNS", raising=False)


@pytest.fixture
def daemon_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No GPUOPT_* setting from the developer's shell leaks into a test's config (the
    environment outranks the values a test passes)."""
    for name in list(os.environ):
        if name.startswith("GPUOPT_") and name not in KEEP_ENV:
            monkeypatch.delenv(name)


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Fake AWS credentials only: no profile, no config file, no instance metadata lookups."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any connection beyond loopback fails the test (moto and Stubber only)."""
    real_connect = socket.socket.connect

    def guarded(sock: socket.socket, address: Any) -> Any:
        host = address[0] if isinstance(address, tuple) else address
        if isinstance(host, str) and host not in LOOPBACK and not host.startswith("/"):
            raise AssertionError(f"a test tried to reach {address!r}")
        return real_connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)


@pytest.fixture(scope="module")
def moto_server() -> Iterator[str]:
    """A moto server on a free loopback port, for the module; yields its URL."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture(scope="session")
def object_s3() -> Iterator[Any]:
    """A moto_server subprocess for the session (one per xdist worker); see
    tests/helpers/objstore.py. Put its `.env` into the environment of the test."""
    from tests.helpers.objstore import s3_server

    with s3_server() as server:
        yield server


@pytest.fixture(scope="session")
def object_gcs() -> Iterator[Any]:
    """A GCS emulator subprocess for the session (one per xdist worker)."""
    from tests.helpers.objstore import gcs_server

    with gcs_server() as server:
        yield server
