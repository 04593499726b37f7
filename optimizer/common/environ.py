"""Allow-listed environments for processes gpuopt starts on a machine it manages.

A job, and on the local cloud the agent that starts it, inherits only what a shell, Python
and the GPU stack need from its parent: never the daemon's credentials (alert webhooks,
database URLs, API tokens) nor any `GPUOPT_*` setting (only the local cloud's
machine mark). What they need beyond that is passed
to them by name.
"""

from __future__ import annotations

from collections.abc import Mapping

# The local cloud and owned machines (providers/ssh) mark every process of an instance with
# this variable so that powering the instance off kills them all, the job included: a
# machine's identity, not a setting.
MACHINE_MARK_ENV = "GPUOPT_LOCAL_INSTANCE"

BASIC_ENV = frozenset(
    {
        "PATH",
        "HOME",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "USER",
        "LOGNAME",
        "SHELL",
        "TERM",
        "PYTHONPATH",
        "LD_LIBRARY_PATH",
        "CUDA_VISIBLE_DEVICES",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        MACHINE_MARK_ENV,
    }
)
BASIC_PREFIXES = ("LC_", "NVIDIA_")


def is_basic(name: str) -> bool:
    """True for a variable on the allow-list: BASIC_ENV, `LC_*` and `NVIDIA_*`."""
    return name in BASIC_ENV or name.startswith(BASIC_PREFIXES)


def basic_env(parent: Mapping[str, str]) -> dict[str, str]:
    """The allow-listed part of `parent`."""
    return {k: v for k, v in parent.items() if is_basic(k)}
