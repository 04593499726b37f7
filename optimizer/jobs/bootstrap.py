"""The first-boot script that starts the agent: AWS user data, GCP startup script, local shell.

It sets the agent's environment, optionally installs gpuopt, then replaces itself with
`gpuopt agent run`. The token is assigned without being echoed: the script never turns on
tracing (`set -x`), never prints it, and the install step runs before it is exported, so
nothing but the agent ever has it in its environment. (On AWS, user data can be read back
through IMDS by any process on the instance; the token is scoped to one attempt, and the
daemon stores only its hash.)
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from optimizer import protocol

DEFAULT_INSTALL = "pip install 'gpuopt[probes]'"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Metadata endpoints the agent must reach directly, whatever the proxy.
METADATA_HOSTS = ("169.254.169.254", "metadata.google.internal")
_EXTRA = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


@dataclass(frozen=True, slots=True)
class AgentInstall:
    """How a new instance gets gpuopt: into a virtual environment at `venv` (made with
    `python -m venv` unless one is there already), from `wheel_url`, else the package index
    (`index_url`, else pip's default) at `version` (None: the newest). `prebaked`: the
    machine image has it in `venv` already, so pip runs only where that environment's Python
    cannot import gpuopt (at `version`, when one is set): a pre-baked image boots to its
    agent without pip's seconds (docs/handover.md)."""

    version: str | None = None
    wheel_url: str | None = None
    index_url: str | None = None
    extras: tuple[str, ...] = ("probes",)
    python: str = "python3"
    venv: str = "/opt/gpuopt"
    prebaked: bool = False

    def requirement(self) -> str:
        """The pip requirement: `gpuopt[probes]==1.2.0`, or `gpuopt[probes] @ <wheel URL>`."""
        for extra in self.extras:
            if not _EXTRA.match(extra):
                raise ValueError(f"bad extra {extra!r}")
        name = "gpuopt" + (f"[{','.join(self.extras)}]" if self.extras else "")
        if self.wheel_url:
            return f"{name} @ {_check('wheel_url', self.wheel_url)}"
        if self.version:
            return f"{name}=={_check('version', self.version)}"
        return name

    @property
    def interpreter(self) -> str:
        """The virtual environment's Python, which runs the agent."""
        return f"{self.venv.rstrip('/')}/bin/python"

    def command(self) -> str:
        """One shell line: make the virtual environment if missing, then pip install."""
        venv = shlex.quote(_check("venv", self.venv))
        python = shlex.quote(self.interpreter)
        pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        if self.index_url:
            pip += ["--index-url", shlex.quote(_check("index_url", self.index_url))]
        pip.append(shlex.quote(self.requirement()))
        make = f"{shlex.quote(_check('python', self.python))} -m venv {venv}"
        install = f"{{ [ -x {python} ] || {make}; }} && {' '.join(pip)}"
        if not self.prebaked:
            return install
        check = f"{python} -c {shlex.quote(self._present())} 2>/dev/null"
        return f"{{ [ -x {python} ] && {check}; }} || {{ {install}; }}"

    def _present(self) -> str:
        """Python that exits 0 where gpuopt (at `version`, if set) is importable."""
        if self.version:
            version = _check("version", self.version)
            return f"import sys, optimizer; sys.exit(optimizer.__version__ != {version!r})"
        return "import optimizer"


@dataclass(frozen=True, slots=True)
class AgentProxy:
    """An HTTP(S) proxy for the install and the agent; `no_proxy` hosts go direct (the
    cloud metadata endpoints always do)."""

    http: str | None = None
    https: str | None = None
    no_proxy: tuple[str, ...] = ()

    def env(self) -> dict[str, str]:
        values: dict[str, str] = {}
        if self.http:
            values["HTTP_PROXY"] = values["http_proxy"] = self.http
        if self.https:
            values["HTTPS_PROXY"] = values["https_proxy"] = self.https
        if values:
            hosts = ",".join(dict.fromkeys((*self.no_proxy, *METADATA_HOSTS)))
            values["NO_PROXY"] = values["no_proxy"] = hosts
        return values


@dataclass(frozen=True, slots=True)
class AgentSettings:
    """How the agent gets onto a new instance (the daemon config's `agent:` section):
    the install, the machine image per provider (None: the provider's default GPU image),
    extra environment for the agent and the install, and a proxy."""

    install: AgentInstall = field(default_factory=AgentInstall)
    images: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    proxy: AgentProxy = field(default_factory=AgentProxy)

    def image(self, provider: str) -> str | None:
        return self.images.get(provider)

    def script(
        self,
        *,
        daemon_url: str,
        token: str,
        attempt_key: str,
        cloud: str,
        metadata_kind: str,
        on_host: bool = False,
        expected_gpus: int | None = None,
    ) -> str:
        """The bootstrap for one attempt. `on_host` (the registry's `agent_on_host`): the
        instance runs on this host with this gpuopt, so nothing is installed and the agent
        runs with this interpreter. `expected_gpus` becomes the probe's default GPU count
        (GPUOPT_EXPECTED_GPUS; a job's own `expected_gpus` wins)."""
        env = {**self.proxy.env(), **self.env}
        if expected_gpus is not None:
            env[protocol.ENV_EXPECTED_GPUS] = str(expected_gpus)
        return bootstrap_script(
            daemon_url=daemon_url,
            token=token,
            attempt_key=attempt_key,
            cloud=cloud,
            metadata_kind=metadata_kind,
            install=None if on_host else self.install.command(),
            python=sys.executable if on_host else self.install.interpreter,
            env=env,
        )


def _check(name: str, value: str) -> str:
    if not value or any(c in value for c in "\0\n\r"):
        raise ValueError(f"{name} must be a non-empty single line")
    return value


def bootstrap_script(
    *,
    daemon_url: str,
    token: str,
    attempt_key: str,
    cloud: str,
    metadata_kind: str,
    install: str | None = DEFAULT_INSTALL,
    python: str | None = None,
    env: Mapping[str, str] | None = None,
) -> str:
    """The shell script a new instance runs first.

    `cloud` is the provider's name and `metadata_kind` the metadata watcher kind the agent
    runs there (`aws-imds`, `gcp-metadata`: the provider registry's `watcher`).
    `install` runs before the agent starts (None: gpuopt is already there, as on the local
    cloud). `python` None runs the `gpuopt` console script; an interpreter path runs
    `<python> -m optimizer.agent` instead (the local cloud passes `sys.executable`), which
    loads the agent without the command line's modules.
    `env` adds variables for the agent and the job (e.g. `GPUOPT_PROBE_CPU_N`).
    """
    values = {
        protocol.ENV_DAEMON_URL: _check("daemon_url", daemon_url),
        protocol.ENV_ATTEMPT_KEY: _check("attempt_key", attempt_key),
        protocol.ENV_CLOUD: _check("cloud", cloud),
        protocol.ENV_METADATA_KIND: _check("metadata_kind", metadata_kind),
    }
    for name, value in (env or {}).items():
        if not _NAME.match(name) or name == protocol.ENV_AGENT_TOKEN:
            raise ValueError(f"bad environment variable name {name!r}")
        values[name] = _check(name, str(value))
    command = (
        "gpuopt agent run"
        if python is None
        else f"{shlex.quote(_check('python', python))} -m optimizer.agent"
    )
    lines = [
        "#!/bin/sh",
        "# gpuopt agent bootstrap (generated; holds a secret: do not log or share)",
        "set -eu",
        "set +x",
    ]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in values.items()]
    if install:
        lines.append(_check("install", install))
    lines += [
        f"{protocol.ENV_AGENT_TOKEN}={shlex.quote(_check('token', token))}",
        f"export {protocol.ENV_AGENT_TOKEN}",
        f"exec {command}",
    ]
    return "\n".join(lines) + "\n"
