"""Shared fixtures: a Store on each engine, and the shared price catalog."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from optimizer.settings import normalize_database_url
from optimizer.store import Store

TEST_DATABASE_URL_ENV = "GPUOPT_TEST_DATABASE_URL"
SHARED_DIR_ENV = "GPUOPT_SHARED_DIR"


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
