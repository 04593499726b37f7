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
from collections.abc import Mapping

DEFAULT_INSTALL = "pip install 'gpuopt[probes]'"
_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")


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
    `<python> -m optimizer.cli agent run` instead (the local cloud passes `sys.executable`).
    `env` adds variables for the agent and the job (e.g. `GPUOPT_PROBE_CPU_N`).
    """
    values = {
        "GPUOPT_DAEMON_URL": _check("daemon_url", daemon_url),
        "GPUOPT_ATTEMPT_KEY": _check("attempt_key", attempt_key),
        "GPUOPT_CLOUD": _check("cloud", cloud),
        "GPUOPT_METADATA_KIND": _check("metadata_kind", metadata_kind),
    }
    for name, value in (env or {}).items():
        if not _NAME.match(name) or name == "GPUOPT_AGENT_TOKEN":
            raise ValueError(f"bad environment variable name {name!r}")
        values[name] = _check(name, str(value))
    command = (
        "gpuopt agent run"
        if python is None
        else f"{shlex.quote(_check('python', python))} -m optimizer.cli agent run"
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
        f"GPUOPT_AGENT_TOKEN={shlex.quote(_check('token', token))}",
        "export GPUOPT_AGENT_TOKEN",
        f"exec {command}",
    ]
    return "\n".join(lines) + "\n"
