"""The daemon's configuration: a YAML file plus `GPUOPT_*` environment variables.

Precedence, highest first: environment (`GPUOPT_API__PORT=9000`, nested keys joined by `__`),
the YAML file, the defaults below. The file is read by the shared YAML document loader, so
`${VAR}` interpolation works and every problem is located as `file:line:col: field: message`;
a bad environment variable is named instead (`GPUOPT_API__PORT: api.port: …`).
docs/daemon.md lists every key.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from optimizer.alerts.config import AlertsConfig
from optimizer.common.documents import load_document
from optimizer.common.errors import LocatedError, Problem
from optimizer.daemon import settings
from optimizer.store import DatabaseUrlError, normalize_database_url
from providers import registry

CONFIG_FILE_NAME = "gpuopt.yaml"
CONFIG_ENV = "GPUOPT_CONFIG"
ENV_PREFIX = "GPUOPT_"
DEFAULT_PORT = 8470


class ConfigError(LocatedError):
    """A daemon config that cannot be used; `problems` locates each one."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProviderConfig(_Section):
    """One provider's polling. Regions empty = every region the provider knows."""

    enabled: bool = True
    regions: list[str] = Field(default_factory=list)
    spot_interval_s: float = Field(600, ge=1, description="Spot prices: every 10 minutes.")
    on_demand_interval_s: float = Field(
        86_400, ge=1, description="On-demand prices and specs: daily."
    )
    project: str | None = Field(None, description="GCP only: the project (GPUOPT_GCP_PROJECT).")
    placement_scores: bool = Field(False, description="AWS only: fetch spot placement scores.")
    interruption_queue_url: str | None = Field(
        None, description="AWS only: the SQS queue EventBridge sends EC2 interruption events to."
    )


class ApiConfig(_Section):
    host: str = "127.0.0.1"
    port: int = Field(DEFAULT_PORT, ge=0, le=65535, description="0 picks a free port.")
    token: SecretStr | None = Field(
        None, description="Bearer token; required to listen beyond loopback."
    )
    public_url: str | None = Field(
        None, description="How people reach the API, for links in alerts."
    )
    access_log: bool = False


class LoopsConfig(_Section):
    reconcile_s: float = Field(15, gt=0)
    deliver_s: float = Field(5, gt=0)
    watch_s: float = Field(2, gt=0)
    misfire_grace_s: float = Field(60, gt=0)


class LeaderConfig(_Section):
    """Leader election among replicas on one PostgreSQL database (docs/deploy.md)."""

    check_s: float = Field(
        2, gt=0, le=5, description="How often followers try for the lock and the leader checks it."
    )
    # At most 10: the lock's session is dropped after about 12 s without an answer, and a
    # cut-off leader must have stopped acting by then (optimizer/daemon/leader.py).
    lease_s: float = Field(
        6, gt=0, le=10, description="A leader that cannot confirm its lock this long stops acting."
    )

    @field_validator("lease_s")
    @classmethod
    def _longer_than_check(cls, value: float, info: Any) -> float:
        check = info.data.get("check_s")
        if check is not None and value <= 2 * check:
            raise ValueError(f"must be more than twice leader.check_s ({check:g})")
        return value


class PricesConfig(_Section):
    drop_fraction: float = Field(
        0.20, gt=0, lt=1, description="Alert when a policy's best offer gets this much cheaper."
    )


class LogConfig(_Section):
    format: Literal["text", "json"] = "text"
    level: Literal["debug", "info", "warning", "error"] = "info"


def _default_providers() -> dict[str, ProviderConfig]:
    return {"local": ProviderConfig()}


class ConfigSchema(BaseModel):
    """Every key the config file may hold (the file alone is validated against this)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    data_dir: Path | None = None
    database_url: SecretStr | None = None
    policy_dir: Path | None = None
    providers: dict[str, ProviderConfig] = Field(default_factory=_default_providers)
    api: ApiConfig = Field(default_factory=ApiConfig)
    loops: LoopsConfig = Field(default_factory=LoopsConfig)
    leader: LeaderConfig = Field(default_factory=LeaderConfig)
    prices: PricesConfig = Field(default_factory=PricesConfig)
    alerts: AlertsConfig = Field(default_factory=AlertsConfig)
    log: LogConfig = Field(default_factory=LogConfig)

    @field_validator("providers")
    @classmethod
    def _known_providers(cls, value: dict[str, ProviderConfig]) -> dict[str, ProviderConfig]:
        """Providers the registry knows, asked only for what each can do."""
        for name, cfg in value.items():
            entry = registry.find(name)
            if entry is None:
                known = ", ".join(registry.names())
                raise ValueError(f"unknown provider {name!r}; known: {known}")
            can = entry.capabilities
            if cfg.placement_scores and not can.placement_scores:
                raise ValueError(f"{name}.placement_scores: {name} has no placement scores")
            if cfg.interruption_queue_url and not can.interruption_queue:
                raise ValueError(
                    f"{name}.interruption_queue_url: {name} reads no interruption queue"
                )
        return value

    @field_validator("data_dir", "policy_dir")
    @classmethod
    def _expand(cls, value: Path | None) -> Path | None:
        return None if value is None else value.expanduser().absolute()


class DaemonConfig(BaseSettings, ConfigSchema):
    """The effective config: file values with `GPUOPT_*` variables on top."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", frozen=True
    )
    _source: str | None = PrivateAttr(None)

    @property
    def source(self) -> str | None:
        """The config file read, or None."""
        return self._source

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The file's values arrive as init arguments; the environment outranks them.
        return (env_settings, init_settings)

    # -- derived values ----------------------------------------------------------------------

    @property
    def effective_data_dir(self) -> Path:
        return self.data_dir or settings.data_dir()

    @property
    def effective_database_url(self) -> str:
        if self.database_url is not None:
            return normalize_database_url(
                self.database_url.get_secret_value(), origin="database_url"
            )
        return f"sqlite:///{self.effective_data_dir / 'gpuopt.db'}"

    @property
    def effective_policy_dir(self) -> Path:
        return self.policy_dir or self.effective_data_dir / "policies"

    def enabled_providers(self) -> dict[str, ProviderConfig]:
        return {name: cfg for name, cfg in self.providers.items() if cfg.enabled}

    def secrets(self) -> list[str]:
        """Every secret value in the config, for log redaction and leak tests."""
        found = self.alerts.secrets()
        if self.api.token is not None:
            found.append(self.api.token.get_secret_value())
        if self.database_url is not None:
            from sqlalchemy.engine import make_url

            try:
                password = make_url(self.database_url.get_secret_value()).password
            except Exception:
                password = None
            if password:
                found.append(str(password))
        return [s for s in found if s]


def config_problems(config: DaemonConfig) -> list[str]:
    """What the schema cannot see but the daemon would refuse, one line each."""
    from optimizer.daemon.server import is_loopback

    where = config.source or "<config>"
    problems = []
    if not is_loopback(config.api.host) and config.api.token is None:
        problems.append(
            f"{where}: api.token: required to listen on {config.api.host} (a non-loopback "
            "address); set it or GPUOPT_API__TOKEN"
        )
    if not config.enabled_providers():
        problems.append(f"{where}: providers: no provider is enabled; nothing will be polled")
    try:
        config.effective_database_url  # noqa: B018 (normalizing it is the check)
    except DatabaseUrlError as exc:
        problems.append(f"{where}: {exc}")
    return problems


def default_config_path(environ: Mapping[str, str] | None = None) -> Path | None:
    """`GPUOPT_CONFIG`, else `<data dir>/gpuopt.yaml` when it exists, else None."""
    env = os.environ if environ is None else environ
    named = env.get(CONFIG_ENV, "").strip()
    if named:
        return Path(named).expanduser()
    candidate = settings.data_dir() / CONFIG_FILE_NAME
    return candidate if candidate.is_file() else None


def _env_name(loc: tuple[Any, ...], environ: Mapping[str, str]) -> str | None:
    """The most specific `GPUOPT_A__B` variable set for a field location, if any."""
    parts = [str(p).upper() for p in loc]
    for end in range(len(parts), 0, -1):
        name = ENV_PREFIX + "__".join(parts[:end])
        if name in environ:
            return name
    return None


def _env_problems(error: ValidationError, source: str) -> list[Problem]:
    problems = []
    for item in error.errors(include_url=False, include_input=False):
        loc = tuple(item["loc"])
        field = ".".join(str(p) for p in loc)
        message = item["msg"].removeprefix("Value error, ").replace("Input should be", "must be")
        where = _env_name(loc, os.environ) or source
        problems.append(Problem(where, message, field=field))
    return problems


def load_config(path: str | Path | None = None) -> DaemonConfig:
    """Read the config file (if any) and the environment; raises ConfigError with every
    problem located. `path` None means `default_config_path()`."""
    chosen = Path(path) if path is not None else default_config_path()
    file_values: dict[str, Any] = {}
    source = None
    if chosen is not None:
        source = str(chosen)
        schema = load_document(
            chosen, ConfigSchema, interpolate=True, what="config", error=ConfigError
        )
        file_values = schema.model_dump(exclude_unset=True)
    try:
        config = DaemonConfig(**file_values)
    except ValidationError as exc:
        raise ConfigError(_env_problems(exc, source or "<defaults>")) from None
    config._source = source
    return config
