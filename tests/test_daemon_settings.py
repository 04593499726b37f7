"""Settings read from the environment (the data directory), and the database URLs the store
accepts (PostgreSQL pointed at psycopg 3, nothing past the scheme in a message)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from optimizer.daemon import settings
from optimizer.daemon.config import load_config
from optimizer.daemon.leader import SqliteLock, sqlite_lock_path
from optimizer.daemon.service import resolve_token
from optimizer.store import DatabaseUrlError, Store, normalize_database_url
from optimizer.store.engine import StoreError


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(settings.DATA_DIR_ENV, raising=False)
    monkeypatch.delenv("GPUOPT_DATABASE_URL", raising=False)
    monkeypatch.delenv("GPUOPT_CONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def test_data_dir_defaults_under_home_and_is_not_created(tmp_path: Path) -> None:
    expected = tmp_path / "home" / ".local" / "share" / "gpuopt"
    assert settings.data_dir() == expected
    assert not expected.exists()


def test_data_dir_follows_the_env_var(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GPUOPT_DATA_DIR", str(tmp_path / "data"))
    assert settings.data_dir() == tmp_path / "data"


def test_a_blank_data_dir_counts_as_unset(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GPUOPT_DATA_DIR", "  ")
    assert settings.data_dir() == tmp_path / "home" / ".local" / "share" / "gpuopt"


def test_the_default_store_creates_its_sqlite_file_under_the_data_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    data = tmp_path / "not" / "yet"
    monkeypatch.setenv("GPUOPT_DATA_DIR", str(data))
    url = load_config().effective_database_url
    assert url == f"sqlite:///{data / 'gpuopt.db'}"
    with Store(url) as db:
        db.create_all()
    assert (data / "gpuopt.db").is_file()


@pytest.fixture
def usual_umask() -> Iterator[None]:
    # The common default, under which files are created 0644 and folders 0755 unless asked.
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.usefixtures("usual_umask")
def test_the_data_dir_is_created_0700_and_the_database_0600(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    monkeypatch.setenv("GPUOPT_DATA_DIR", str(data))
    config = load_config()
    with Store(config.effective_database_url) as db:
        db.create_all()
        with db.engine.begin() as conn:
            conn.execute(text("CREATE TABLE scratch (x INTEGER)"))  # so the -wal file exists
        assert _mode(data) == 0o700
        assert _mode(data / "gpuopt.db") == 0o600
        assert _mode(data / "gpuopt.db-wal") == 0o600
        lock_path = sqlite_lock_path(config.effective_database_url)
        assert lock_path is not None
        lock = SqliteLock(db, lock_path)
        lock.claim()
        try:
            assert _mode(lock_path) == 0o600
        finally:
            lock.release()


@pytest.mark.usefixtures("usual_umask")
def test_the_daemon_creates_its_data_dir_0700_whichever_file_comes_first(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    data = tmp_path / "fresh"
    monkeypatch.setenv("GPUOPT_DATA_DIR", str(data))
    _, token_file = resolve_token(load_config())
    assert token_file == data / "api-token"
    assert _mode(data) == 0o700 and _mode(token_file) == 0o600
    # An existing folder keeps the mode its owner chose.
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o750)
    assert _mode(settings.make_private_dir(shared)) == 0o750


@pytest.mark.parametrize(
    "given",
    [
        "postgresql://gpuopt:pw@db:5432/gpuopt",
        "postgres://gpuopt:pw@db:5432/gpuopt",
        "postgresql+psycopg://gpuopt:pw@db:5432/gpuopt",
    ],
)
def test_postgres_urls_are_pointed_at_psycopg3(given: str) -> None:
    assert normalize_database_url(given) == "postgresql+psycopg://gpuopt:pw@db:5432/gpuopt"


def test_sqlite_url_passes_through() -> None:
    assert normalize_database_url("sqlite:////var/lib/gpuopt/gpuopt.db") == (
        "sqlite:////var/lib/gpuopt/gpuopt.db"
    )


@pytest.mark.parametrize(
    ("given", "scheme"),
    [
        ("mysql://admin:hunter2@db/gpuopt", "mysql"),
        ("postgresql+asyncpg://admin:hunter2@db/gpuopt", "postgresql+asyncpg"),
        ("htps://admin:hunter2@db", "htps"),
    ],
)
def test_unknown_scheme_names_the_origin_and_scheme_but_not_the_password(
    given: str, scheme: str
) -> None:
    with pytest.raises(DatabaseUrlError) as caught:
        normalize_database_url(given, origin="GPUOPT_DATABASE_URL")
    message = str(caught.value)
    assert "GPUOPT_DATABASE_URL" in message
    assert repr(scheme) in message
    assert "hunter2" not in message


def test_a_value_that_is_not_a_url_is_refused() -> None:
    with pytest.raises(DatabaseUrlError, match="database_url is not a URL") as caught:
        normalize_database_url("admin:hunter2@db/gpuopt", origin="database_url")
    assert "hunter2" not in str(caught.value)


def test_the_daemon_config_names_a_bad_database_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUOPT_DATABASE_URL", "mysql://admin:hunter2@db/gpuopt")
    with pytest.raises(DatabaseUrlError, match="database_url has unsupported scheme 'mysql'"):
        load_config().effective_database_url  # noqa: B018


def test_a_bad_url_is_a_store_error_and_a_value_error() -> None:
    assert issubclass(DatabaseUrlError, StoreError) and issubclass(DatabaseUrlError, ValueError)
