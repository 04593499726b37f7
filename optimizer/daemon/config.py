"""The daemon's configuration: a YAML file plus `GPUOPT_*` environment variables.

Precedence, highest first: environment (`GPUOPT_API__PORT=9000`, nested keys joined by `__`),
the YAML file, the defaults below. The file is read by the shared YAML document loader, so
`${VAR}` interpolation works and every problem is located as `file:line:col: field: message`;
a bad environment variable is named instead (`GPUOPT_API__PORT: api.port: …`).
docs/daemon.md lists every key.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from contextvars import ContextVar
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    SerializeAsAny,
    ValidationError,
    field_validator,
)
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from optimizer.alerts.config import ALERTS_EXAMPLE, AlertsConfig
from optimizer.common.bounds import Count, Days, Seconds
from optimizer.common.documents import Checked, check_file
from optimizer.common.errors import LocatedError, Problem
from optimizer.common.validation import findings, in_file_order, validate_each
from optimizer.daemon import settings, token_strength
from optimizer.daemon.connections import ConnectionLimits
from optimizer.jobs.bootstrap import AgentInstall, AgentProxy, AgentSettings
from optimizer.jobs.measured import DEFAULT_DEMOTE_FAILED, ProbeWindow
from optimizer.protocol import BOOTSTRAP_ENV
from optimizer.store import DatabaseUrlError, Retention, normalize_database_url
from optimizer.store.logs import (
    DEFAULT_FOLLOWERS,
    DEFAULT_FOLLOWERS_PER_JOB,
    DEFAULT_MAX_BYTES_PER_JOB,
)
from optimizer.store.probes import DEFAULT_LAST
from providers import registry
from providers.config import ProviderConfig

CONFIG_FILE_NAME = "gpuopt.yaml"
CONFIG_ENV = "GPUOPT_CONFIG"
ENV_PREFIX = "GPUOPT_"
DEFAULT_PORT = 8470
MAX_BODY_BYTES = 1 << 20  # 1 MiB
DEFAULT_CODE_MAX_MIB = 512  # optimizer.code.DEFAULT_MAX_MIB: the CLI's default cap
MIN_REMOTE_TOKEN = 32  # characters an API token needs to listen beyond loopback


class ConfigError(LocatedError):
    """A daemon config that cannot be used; `problems` locates each one."""


class _Section(BaseModel):
    # Numbers are bounded (optimizer/common/bounds.py); NaN and infinity are never one.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


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
    max_body_bytes: int = Field(
        MAX_BODY_BYTES,
        ge=1024,
        le=1 << 30,
        description="Larger request bodies are refused with 413 before they are read.",
    )
    header_timeout_s: float = Field(
        10,
        gt=0,
        le=300,
        description="A connection whose request line and headers take longer is closed (408).",
    )
    idle_timeout_s: float = Field(
        5, gt=0, le=3600, description="A keep-alive connection idle this long is closed."
    )
    max_connections: int = Field(
        1024,
        ge=8,
        le=1_000_000,
        description="Connections beyond this are refused at once (503); kept 128 under the "
        "open-file limit.",
    )

    def limits(self) -> ConnectionLimits:
        """The API server's limits on slow and numerous clients."""
        return ConnectionLimits(
            header_timeout_s=self.header_timeout_s,
            idle_timeout_s=self.idle_timeout_s,
            max_connections=self.max_connections,
        )


class LoopsConfig(_Section):
    reconcile_s: Seconds = Field(15, gt=0)
    deliver_s: Seconds = Field(5, gt=0)
    watch_s: Seconds = Field(2, gt=0)
    retention_s: Seconds = Field(3600, gt=0, description="Price history pruning (leader only).")
    misfire_grace_s: Seconds = Field(60, gt=0)


class LeaderConfig(_Section):
    """Leader election among replicas on one PostgreSQL database (docs/deploy.md)."""

    check_s: float = Field(
        2, gt=0, le=5, description="One round of a follower's lock wait; the leader's check period."
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


class RetentionConfig(_Section):
    """How long price history is kept: raw points, then hourly min/median/max per pool."""

    raw_days: Days = Field(14, gt=0, description="Raw price points are kept this long.")
    hourly_days: Days = Field(
        400, gt=0, description="History reaches back this far, hourly past raw_days."
    )
    batch_rows: int = Field(
        5_000, ge=100, le=1_000_000, description="Rows one pruning transaction removes at most."
    )

    @field_validator("hourly_days")
    @classmethod
    def _longer_than_raw(cls, value: float, info: Any) -> float:
        raw = info.data.get("raw_days")
        if raw is not None and value <= raw:
            raise ValueError(f"must be more than prices.retention.raw_days ({raw:g})")
        return value

    def retention(self) -> Retention:
        """The store's plain retention values."""
        return Retention(timedelta(days=self.raw_days), timedelta(days=self.hourly_days))


class PricesConfig(_Section):
    drop_fraction: float = Field(
        0.20, gt=0, lt=1, description="Alert when a policy's best offer gets this much cheaper."
    )
    retention: RetentionConfig = Field(
        default_factory=RetentionConfig, examples=[{"raw_days": 14, "hourly_days": 400}]
    )


class LogsConfig(_Section):
    """The job output agents ship (docs/daemon.md: Job logs)."""

    max_bytes_per_job: int = Field(
        DEFAULT_MAX_BYTES_PER_JOB,
        ge=1 << 16,
        le=1 << 30,
        description="Past this, a job's oldest output is dropped (64 KiB to 1 GiB).",
    )
    retention_days: float = Field(
        30, gt=0, le=36_500, description="The output of jobs that ended longer ago is deleted."
    )
    max_followers_per_job: int = Field(
        DEFAULT_FOLLOWERS_PER_JOB,
        ge=1,
        le=10_000,
        description="More followers of one job's output at once are refused with 429.",
    )
    max_followers: int = Field(
        DEFAULT_FOLLOWERS,
        ge=1,
        le=100_000,
        description="More followers of job output at once, over all jobs, are refused with 429.",
    )


class TelemetryConfig(_Section):
    """How long jobs' GPU telemetry is kept (docs/daemon.md: GPU telemetry)."""

    minute_days: float = Field(
        14, gt=0, le=36_500, description="Per-minute GPU readings are kept this long."
    )
    hourly_days: float = Field(
        400,
        gt=0,
        le=36_500,
        description="Readings reach back this far, per hour past minute_days.",
    )

    @field_validator("hourly_days")
    @classmethod
    def _longer_than_minutes(cls, value: float, info: Any) -> float:
        minutes = info.data.get("minute_days")
        if minutes is not None and value <= minutes:
            raise ValueError(f"must be more than telemetry.minute_days ({minutes:g})")
        return value


class AgentEventsConfig(_Section):
    """How long agents' reports are kept (docs/daemon.md: Retention)."""

    retention_days: float = Field(
        30,
        gt=0,
        le=36_500,
        description="Reports of attempts that ended longer ago are deleted (job_exited stays).",
    )


class ProbesConfig(_Section):
    """How probe results feed the ranking (docs/policies.md, \"Probe results in the ranking\")."""

    last: int = Field(
        DEFAULT_LAST,
        ge=1,
        le=100,
        description="Measured figures are medians of each type's last N usable probe results.",
    )
    demote_failed: Count = Field(
        DEFAULT_DEMOTE_FAILED,
        ge=1,
        description="This many failures among a type's last N probes demote it on a provider.",
    )

    def window(self) -> ProbeWindow:
        return ProbeWindow(last=self.last, demote_failed=min(self.demote_failed, self.last))


class CodeConfig(_Section):
    """Code archives that `gpuopt jobs submit` uploads (docs/code.md)."""

    max_mib: int = Field(
        DEFAULT_CODE_MAX_MIB,
        ge=1,
        le=1 << 16,
        description="Larger archives are refused with 413 (and larger folders by the CLI).",
    )
    store: str | None = Field(
        None,
        description="A bucket URI (s3://…, gs://…) to keep archives in; <data_dir>/code without.",
    )

    @field_validator("store")
    @classmethod
    def _store(cls, value: str | None) -> str | None:
        value = _one_line(value)
        if value is not None and "://" not in value:
            raise ValueError("must be a bucket URI (s3://bucket/prefix, gs://…, file:///…)")
        return value


class PoliciesConfig(_Section):
    """What policies the daemon applies besides its policy files (docs/policies.md)."""

    default: str | None = Field(
        None,
        pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$",
        description="The loaded policy that inline resources (`gpuopt run`, a job's "
        "`resources:`) are written over; gpuopt's shipped default policy when unset.",
    )


class DataTransferConfig(_Section):
    """Data transfer rates that replace the bundled table's (docs/costs.md, "The job's
    state"): `{provider: {path: usd_per_gb}}`, paths same-region, other-zone,
    same-continent, other-continent, other-cloud."""

    egress_usd_per_gb: dict[str, dict[str, float]] = Field(
        default_factory=dict,
        examples=[{"aws": {"other-continent": 0.05}}],
        description="USD per GB by provider and path, over the bundled list prices.",
    )

    @field_validator("egress_usd_per_gb")
    @classmethod
    def _known(cls, value: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        from policies import egress

        egress.check_overrides(value)
        return value

    def apply(self) -> None:
        """Put these rates in force in this process (the bundled ones where none is given)."""
        from policies import egress

        egress.override(self.egress_usd_per_gb)


class LogConfig(_Section):
    format: Literal["text", "json"] = "text"
    level: Literal["debug", "info", "warning", "error"] = "info"


def _secret(value: SecretStr | None) -> str | None:
    return None if value is None else value.get_secret_value()


def _one_line(value: str | None) -> str | None:
    if value is not None and (not value.strip() or any(c in value for c in "\0\r\n")):
        raise ValueError("must be a non-empty single line")
    return value


class AgentInstallConfig(_Section):
    """How a cloud instance installs gpuopt: a virtual environment at `venv`, from
    `wheel_url`, else the package index (`index_url`) at `version` (None: the newest)."""

    version: str | None = Field(None, description="The gpuopt version to install.")
    wheel_url: str | None = Field(None, description="A wheel to install instead of the index.")
    index_url: str | None = Field(None, description="A package index instead of PyPI.")
    extras: list[str] = Field(
        default_factory=lambda: ["probes"],
        description="Extras to install (probes: torch).",
        examples=[["probes"]],
    )
    python: str = Field("python3", description="The interpreter that makes the venv.")
    venv: str = Field("/opt/gpuopt", description="Where the agent's environment lives.")
    prebaked: bool = Field(
        False,
        description="The image has gpuopt in venv already: pip runs only where it cannot be "
        "imported (at version, if set).",
    )

    @field_validator("version", "wheel_url", "index_url", "python", "venv")
    @classmethod
    def _single_line(cls, value: str | None) -> str | None:
        return _one_line(value)

    @field_validator("version")
    @classmethod
    def _version(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[0-9A-Za-z][0-9A-Za-z.+!-]*", value):
            raise ValueError(f"{value!r} is not a version (e.g. 0.4.1)")
        return value

    @field_validator("wheel_url")
    @classmethod
    def _wheel(cls, value: str | None, info: Any) -> str | None:
        if value is None:
            return value
        if info.data.get("version") is not None:
            raise ValueError("give version or wheel_url, not both")
        if not value.split("?", 1)[0].endswith(".whl") or "://" not in value:
            raise ValueError("must be a URL of a .whl file (https://… or file://…)")
        return value

    @field_validator("index_url")
    @classmethod
    def _index(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://", "file://")):
            raise ValueError("must be an http(s) or file URL")
        return value

    @field_validator("extras")
    @classmethod
    def _extras(cls, value: list[str]) -> list[str]:
        for extra in value:
            if not re.fullmatch(r"[a-z0-9][a-z0-9._-]*", extra):
                raise ValueError(f"{extra!r} is not an extra's name")
        return value

    @field_validator("venv")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("must be an absolute path")
        return value


class AgentProxyConfig(_Section):
    """An HTTP(S) proxy for the install and the agent (the metadata endpoints go direct); a
    secret, since its URL may hold credentials."""

    http: SecretStr | None = None
    https: SecretStr | None = None
    no_proxy: list[str] = Field(default_factory=list, examples=[["10.0.0.1", "internal.example"]])

    @field_validator("http", "https")
    @classmethod
    def _url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return value
        text = value.get_secret_value()
        if any(c in text for c in "\0\r\n") or not text.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL on one line")
        return value

    @field_validator("no_proxy")
    @classmethod
    def _hosts(cls, value: list[str]) -> list[str]:
        for host in value:
            if not host or any(c in host for c in " ,\0\r\n"):
                raise ValueError(f"{host!r} is not a host name")
        return value


class AgentSetupConfig(_Section):
    """How the agent gets onto a cloud instance (the AWS user data, the GCP startup script)."""

    install: AgentInstallConfig = Field(
        default_factory=AgentInstallConfig, examples=[{"version": "0.4.1"}]
    )
    images: dict[str, str] = Field(
        default_factory=dict,
        description="A machine image per provider (AMI id, GCE image).",
        examples=[{"aws": "ami-0abc"}],
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="For the agent and install.",
        examples=[{"HF_HOME": "/data/hf"}],
    )
    proxy: AgentProxyConfig = Field(
        default_factory=AgentProxyConfig, examples=[{"https": "http://proxy:3128"}]
    )

    @field_validator("images")
    @classmethod
    def _images(cls, value: dict[str, str]) -> dict[str, str]:
        for name, image in value.items():
            entry = registry.find(name)
            if entry is None or not entry.capabilities.launch:
                launching = [n for n, e in registry.entries().items() if e.capabilities.launch]
                raise ValueError(
                    f"{name}: not a provider that launches; known: {', '.join(launching)}"
                )
            if entry.capabilities.agent_on_host:
                raise ValueError(f"{name}: its instances run on this host and take no image")
            _one_line(image)
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for name, item in value.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"{name!r} is not an environment variable name")
            if name in BOOTSTRAP_ENV:
                raise ValueError(f"{name} is set by the bootstrap; choose another name")
            if any(c in item for c in "\0\r\n"):
                raise ValueError(f"{name}: must be a single line")
        return value

    def settings(self) -> AgentSettings:
        """The plain settings the job reconciler renders each bootstrap from."""
        install = self.install
        return AgentSettings(
            install=AgentInstall(
                version=install.version,
                wheel_url=install.wheel_url,
                index_url=install.index_url,
                extras=tuple(install.extras),
                python=install.python,
                venv=install.venv,
                prebaked=install.prebaked,
            ),
            images=dict(self.images),
            env=dict(self.env),
            proxy=AgentProxy(
                http=_secret(self.proxy.http),
                https=_secret(self.proxy.https),
                no_proxy=tuple(self.proxy.no_proxy),
            ),
        )


# Variables a check found bad: left out while it builds the config from the rest.
_IGNORED_ENV: ContextVar[frozenset[str]] = ContextVar("_IGNORED_ENV", default=frozenset())


class _Environment(EnvSettingsSource):
    """The `GPUOPT_*` variables less those in `_IGNORED_ENV` (names in lower case)."""

    def _load_env_vars(self) -> Mapping[str, str | None]:
        ignored = _IGNORED_ENV.get()
        return {k: v for k, v in super()._load_env_vars().items() if k.lower() not in ignored}


def _provider_model(name: Any, section: Any) -> type[ProviderConfig]:
    """The settings model of an installed provider."""
    entry = registry.find(name) if isinstance(name, str) else None
    if entry is None:
        raise ValueError(f"unknown provider {name!r}; installed: {', '.join(registry.names())}")
    return entry.settings


def _default_providers() -> dict[str, ProviderConfig]:
    """The embedded local cloud, with its own section's defaults."""
    return {"local": _provider_model("local", None)()}


class ConfigSchema(BaseModel):
    """Every key the config file may hold (the file alone is validated against this)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    data_dir: Path | None = None
    database_url: SecretStr | None = None
    policy_dir: Path | None = None
    policies: PoliciesConfig = Field(
        default_factory=PoliciesConfig, examples=[{"default": "team-default"}]
    )
    providers: dict[str, SerializeAsAny[ProviderConfig]] = Field(
        default_factory=_default_providers,
        examples=[{"aws": {"regions": ["us-east-1"]}, "local": {"enabled": False}}],
    )
    api: ApiConfig = Field(default_factory=ApiConfig, examples=[{"port": 8470}])
    loops: LoopsConfig = Field(default_factory=LoopsConfig, examples=[{"reconcile_s": 15}])
    leader: LeaderConfig = Field(default_factory=LeaderConfig, examples=[{"check_s": 2}])
    prices: PricesConfig = Field(default_factory=PricesConfig, examples=[{"drop_fraction": 0.2}])
    alerts: AlertsConfig = Field(default_factory=AlertsConfig, examples=[ALERTS_EXAMPLE])
    log: LogConfig = Field(default_factory=LogConfig, examples=[{"format": "json"}])
    probes: ProbesConfig = Field(
        default_factory=ProbesConfig, examples=[{"last": 5, "demote_failed": 3}]
    )
    logs: LogsConfig = Field(
        default_factory=LogsConfig, examples=[{"max_bytes_per_job": 16777216, "retention_days": 30}]
    )
    telemetry: TelemetryConfig = Field(
        default_factory=TelemetryConfig, examples=[{"minute_days": 14, "hourly_days": 400}]
    )
    agent: AgentSetupConfig = Field(
        default_factory=AgentSetupConfig, examples=[{"images": {"aws": "ami-0abc"}}]
    )
    agent_events: AgentEventsConfig = Field(
        default_factory=AgentEventsConfig, examples=[{"retention_days": 30}]
    )
    code: CodeConfig = Field(default_factory=CodeConfig, examples=[{"max_mib": 512}])
    data_transfer: DataTransferConfig = Field(
        default_factory=DataTransferConfig,
        examples=[{"egress_usd_per_gb": {"aws": {"other-continent": 0.05}}}],
    )

    @field_validator("providers", mode="before")
    @classmethod
    def _provider_sections(cls, value: Any) -> Any:
        """Each provider's section validated with the model its registry entry names (its
        own keys: `project` is GCP's, `interruption_queue_url` AWS's)."""
        return validate_each("providers", value, _provider_model)

    @field_validator("data_dir", "policy_dir")
    @classmethod
    def _expand(cls, value: Path | None) -> Path | None:
        return None if value is None else value.expanduser().absolute()


class DaemonConfig(BaseSettings, ConfigSchema):
    """The effective config: file values with `GPUOPT_*` variables on top."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
        allow_inf_nan=False,
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
        if _IGNORED_ENV.get():
            env_settings = _Environment(settings_cls)
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
        for proxy in (self.agent.proxy.http, self.agent.proxy.https):
            if proxy is not None:
                found.append(proxy.get_secret_value())
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


def config_problems(
    config: DaemonConfig, checked: Checked[ConfigSchema] | None = None
) -> list[Problem]:
    """What the schema cannot see but the daemon would refuse, each located where it was
    set: the variable, else the file's line (`checked`, the file's check), else the file."""
    from optimizer.daemon.server import is_loopback

    def at(field: tuple[str, ...], message: str, near: tuple[str, ...] | None = None) -> Problem:
        named = _env_name(field, os.environ) or (near and _env_name(near, os.environ))
        if named:
            return Problem(named, message, field=".".join(field))
        if checked is not None:
            return checked.problem(message, field, near)
        return Problem(config.source or "<config>", message, field=".".join(field))

    problems = []
    if not is_loopback(config.api.host) and config.api.token is None:
        problems.append(
            at(
                ("api", "token"),
                f"required to listen on {config.api.host} (a non-loopback address); set it or "
                "GPUOPT_API__TOKEN",
                near=("api", "host"),
            )
        )
    weak = _weak_token(config)
    if weak:
        problems.append(at(("api", "token"), weak))
    if not config.enabled_providers():
        problems.append(at(("providers",), "no provider is enabled; nothing will be polled"))
    try:
        config.effective_database_url  # noqa: B018 (normalizing it is the check)
    except DatabaseUrlError as exc:
        problems.append(at(("database_url",), str(exc).removeprefix("database_url ")))
    return problems


def _weak_token(config: DaemonConfig) -> str | None:
    from optimizer.daemon.server import is_loopback

    token = config.api.token
    if is_loopback(config.api.host) or token is None:
        return None
    text = token.get_secret_value().strip()
    make = f"make one with: {token_strength.GENERATE}"
    if len(text) < MIN_REMOTE_TOKEN:
        return (
            f"must be at least {MIN_REMOTE_TOKEN} characters to listen on {config.api.host} "
            f"(a non-loopback address); this one has {len(text)}; {make}"
        )
    # Long is not enough (32 x 'a'): judge how hard it is to guess, never echoing it.
    found = token_strength.strength(text)
    if found.strong:
        return None
    why = "; ".join(dict.fromkeys(found.patterns)) or "too few kinds of character"
    return (
        f"too easy to guess to listen on {config.api.host} (a non-loopback address): an "
        f"estimated {found.bits:.0f} bits, at least {token_strength.MIN_BITS:.0f} needed "
        f"({why}); {make}"
    )


def weak_token_problem(config: DaemonConfig) -> str | None:
    """A located problem when the API would listen beyond loopback with a token anyone on the
    network could guess: shorter than MIN_REMOTE_TOKEN characters, or scoring under
    token_strength.MIN_BITS (optimizer/daemon/token_strength.py), else None."""
    weak = _weak_token(config)
    if weak is None:
        return None
    where = _env_name(("api", "token"), os.environ) or config.source or "<config>"
    return f"{where}: api.token: {weak}"


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
    for finding in findings(error, DaemonConfig):
        where = _env_name(finding.field, os.environ) or source
        field = ".".join(str(p) for p in finding.field)
        problems.append(Problem(where, finding.message, field=field))
    return problems


def _with_environment(
    file_values: dict[str, Any], source: str | None
) -> tuple[DaemonConfig | None, list[Problem]]:
    """The file's values with the environment on top, and the variables' problems; with bad
    variables the config is built without them (None when that fails too), so a check can go
    on to what the daemon would refuse."""
    try:
        config = DaemonConfig(**file_values)
    except ValidationError as exc:
        problems = _env_problems(exc, source or "<defaults>")
    else:
        config._source = source
        return config, []
    bad = {p.path for p in problems}
    if not all(name.startswith(ENV_PREFIX) for name in bad):
        return None, problems
    ignored = _IGNORED_ENV.set(frozenset(name.lower() for name in bad))
    try:
        config = DaemonConfig(**file_values)
    except ValidationError:
        return None, problems
    finally:
        _IGNORED_ENV.reset(ignored)
    config._source = source
    return config, problems


def _gather(
    path: str | Path | None,
) -> tuple[DaemonConfig | None, list[Problem], Checked[ConfigSchema] | None]:
    """The config built from everything that was valid, every schema and environment
    problem, and the file's check (None without a file)."""
    chosen = Path(path) if path is not None else default_config_path()
    if chosen is None:
        config, problems = _with_environment({}, None)
        return config, problems, None
    checked = check_file(chosen, ConfigSchema, interpolate=True, what="config", error=ConfigError)
    values = checked.value.model_dump(exclude_unset=True) if checked.value is not None else {}
    config, problems = _with_environment(values, str(chosen))
    if checked.value is None:
        config = None  # a file that could not be read at all leaves nothing to check further
    return config, [*checked.problems, *problems], checked


def _under(field: str, fields: set[str]) -> bool:
    return any(field == f or field.startswith((f + ".", f + "[")) for f in fields)


def check_config(path: str | Path | None = None) -> list[Problem]:
    """Every problem at once, as `gpuopt config check` lists them: the file's in file order,
    then the variables', then what the daemon would refuse (`config_problems`) about what
    is left (a value already reported bad is not reported again)."""
    config, problems, checked = _gather(path)
    if config is not None:
        bad = {p.field for p in problems if p.field}
        problems += [p for p in config_problems(config, checked) if not _under(p.field, bad)]
    return in_file_order(problems)


def load_config(path: str | Path | None = None) -> DaemonConfig:
    """Read the config file (if any) and the environment; raises ConfigError with every
    problem located. `path` None means `default_config_path()`."""
    config, problems, _ = _gather(path)
    if problems or config is None:
        raise ConfigError(problems)
    return config
