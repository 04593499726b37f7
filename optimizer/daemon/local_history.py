"""The daemon's part of the local cloud's history: written once, by the leader, at start.

`providers/local/history.py` makes the points; this runs it when the daemon polls the local
cloud with `providers.local.history_days` above 0 and its source is the real local cloud (not
a test's fake source), whose prices are a function of the time. It runs as a child process
(`gpuopt local history`, on the daemon's store and data directory, up to the daemon's now):
a week of every pool is a few seconds of work and tens of MB of memory the long-running
daemon would otherwise keep.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from optimizer.clock import utc_text
from optimizer.daemon.providers import ProviderHandle
from providers.base import ProviderDisabled

log = logging.getLogger(__name__)

STOP_GRACE_S = 5.0  # a stopping daemon's child gets this long after SIGTERM


class LocalHistory:
    """A leader loop's step that backfills once, then does nothing."""

    def __init__(
        self,
        handle: ProviderHandle,
        *,
        database_url: str,
        data_dir: Path,
        clock: Callable[[], datetime],
        stopping: threading.Event | None = None,
    ) -> None:
        self.handle = handle
        self.database_url = database_url
        self.data_dir = data_dir
        self.clock = clock
        self.stopping = stopping or threading.Event()
        self.days = int(getattr(handle.config, "history_days", 0) or 0)
        self.done = threading.Event()

    def run_once(self) -> None:
        if self.done.is_set():
            return
        from providers.local import LocalCloud

        try:
            source = self.handle.source()
        except ProviderDisabled:
            source = None
        if self.days > 0 and isinstance(source, LocalCloud):
            self._run()
        self.done.set()

    def _run(self) -> None:
        command = [
            sys.executable, "-m", "optimizer.cli", "local", "history",
            "--days", str(self.days), "--until", utc_text(self.clock()),
        ]  # fmt: skip
        env = {
            **os.environ,
            "GPUOPT_DATABASE_URL": self.database_url,
            "GPUOPT_DATA_DIR": str(self.data_dir),
        }
        proc = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        while proc.poll() is None:
            if self.stopping.wait(0.2):  # the daemon stops: so does its child, by its PID
                proc.terminate()
                try:
                    proc.wait(STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                break
        out, err = proc.communicate()
        if proc.returncode == 0:
            if "nothing to add" not in out:
                log.info("%s", out.strip())
        elif not self.stopping.is_set():
            last = (err.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
            log.warning("local cloud history not written: %s", last)


__all__ = ["LocalHistory"]
