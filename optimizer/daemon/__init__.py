"""The daemon: config, the loops on a scheduler, the API server, signals.

Exports are resolved on first use, so importing one daemon module (the config, for
`gpuopt config check`) does not load the whole service.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from optimizer.daemon.config import ConfigError, DaemonConfig, load_config
    from optimizer.daemon.loops.reconcile import Wakeup
    from optimizer.daemon.service import Daemon, DaemonError
    from optimizer.jobs.context import ReconcileContext, Reconciler

_EXPORTS = {
    "ConfigError": "optimizer.daemon.config",
    "DaemonConfig": "optimizer.daemon.config",
    "load_config": "optimizer.daemon.config",
    "ReconcileContext": "optimizer.jobs.context",
    "Reconciler": "optimizer.jobs.context",
    "Wakeup": "optimizer.daemon.loops.reconcile",
    "Daemon": "optimizer.daemon.service",
    "DaemonError": "optimizer.daemon.service",
}

__all__ = [
    "ConfigError",
    "Daemon",
    "DaemonConfig",
    "DaemonError",
    "ReconcileContext",
    "Reconciler",
    "Wakeup",
    "load_config",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'optimizer.daemon' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(_EXPORTS[name]), name)
