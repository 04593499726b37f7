"""Settings read from the environment: data directory and database URL."""

from __future__ import annotations

from pathlib import Path

import pytest

from optimizer import settings
from optimizer.settings import ConfigError


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(settings.DATA_DIR_ENV, raising=False)
    monkeypatch.delenv(settings.DATABASE_URL_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def test_data_dir_defaults_under_home_and_is_not_created(tmp_path: Path) -> None:
    expected = tmp_path / "home" / ".local" / "share" / "gpuopt"
    assert settings.data_dir() == expected
    assert not expected.exists()


def test_data_dir_follows_the_env_var(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GPUOPT_DATA_DIR", str(tmp_path / "data"))
    assert settings.data_dir() == tmp_path / "data"


def test_blank_env_vars_count_as_unset(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GPUOPT_DATA_DIR", "  ")
    monkeypatch.setenv("GPUOPT_DATABASE_URL", "")
    assert settings.data_dir() == tmp_path / "home" / ".local" / "share" / "gpuopt"
    assert settings.database_url().startswith("sqlite:///")


def test_database_url_defaults_to_sqlite_in_the_data_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GPUOPT_DATA_DIR", str(tmp_path / "data"))
    assert settings.database_url() == f"sqlite:///{tmp_path / 'data' / 'gpuopt.db'}"


@pytest.mark.parametrize(
    "given",
    [
        "postgresql://gpuopt:pw@db:5432/gpuopt",
        "postgres://gpuopt:pw@db:5432/gpuopt",
        "postgresql+psycopg://gpuopt:pw@db:5432/gpuopt",
    ],
)
def test_postgres_urls_are_pointed_at_psycopg3(monkeypatch: pytest.MonkeyPatch, given: str) -> None:
    monkeypatch.setenv("GPUOPT_DATABASE_URL", given)
    assert settings.database_url() == "postgresql+psycopg://gpuopt:pw@db:5432/gpuopt"


def test_sqlite_url_passes_through(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUOPT_DATABASE_URL", "sqlite:////var/lib/gpuopt/gpuopt.db")
    assert settings.database_url() == "sqlite:////var/lib/gpuopt/gpuopt.db"


@pytest.mark.parametrize(
    ("given", "scheme"),
    [
        ("mysql://admin:hunter2@db/gpuopt", "mysql"),
        ("postgresql+asyncpg://admin:hunter2@db/gpuopt", "postgresql+asyncpg"),
        ("htps://admin:hunter2@db", "htps"),
    ],
)
def test_unknown_scheme_names_the_variable_and_scheme_but_not_the_password(
    monkeypatch: pytest.MonkeyPatch, given: str, scheme: str
) -> None:
    monkeypatch.setenv("GPUOPT_DATABASE_URL", given)
    with pytest.raises(ConfigError) as caught:
        settings.database_url()
    message = str(caught.value)
    assert "GPUOPT_DATABASE_URL" in message
    assert repr(scheme) in message
    assert "hunter2" not in message


def test_a_value_that_is_not_a_url_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUOPT_DATABASE_URL", "admin:hunter2@db/gpuopt")
    with pytest.raises(ConfigError, match="GPUOPT_DATABASE_URL is not a URL") as caught:
        settings.database_url()
    assert "hunter2" not in str(caught.value)


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)
