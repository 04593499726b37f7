"""Daemons for tests: the in-process one (`running`), its config and API client, and
`gpuopt` as a real process (`start_gpuopt`, `run_gpuopt`, `DaemonProcess`).

Every launcher starts from a clean slate: no GPUOPT_* setting of the developer's shell reaches
a daemon under test (the environment outranks the values a test passes).
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from optimizer.api.serve import daemon_app
from optimizer.daemon.config import DaemonConfig
from optimizer.daemon.service import Daemon
from tests.helpers.offers import FakeSource
from tests.helpers.waiting import wait_until

TOKEN = "test-api-token-7Qx2"
GPUOPT = (sys.executable, "-m", "optimizer.cli")
"""The `gpuopt` command, run by this interpreter from the code under test."""

# -- in process ------------------------------------------------------------------------------


def make_config(data_dir: Path, **sections: Any) -> DaemonConfig:
    """A daemon on an ephemeral loopback port with fast loops; `sections` override keys."""
    values: dict[str, Any] = {
        "data_dir": data_dir,
        # No simulated history backfill (a test that wants one says so): it costs seconds.
        "providers": {
            "local": {"spot_interval_s": 3600, "on_demand_interval_s": 3600, "history_days": 0}
        },
        "api": {"host": "127.0.0.1", "port": 0, "token": TOKEN},
        "loops": {"reconcile_s": 3600, "deliver_s": 0.05, "watch_s": 0.05},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(values.get(key), dict):
            merged = {**values[key], **value}
            if key == "providers" and isinstance(value.get("local"), dict):
                merged["local"] = {**values[key]["local"], **value["local"]}
            values[key] = merged
        else:
            values[key] = value
    return DaemonConfig(**values)


@contextmanager
def running(config: DaemonConfig, **kwargs: Any) -> Iterator[Daemon]:
    """A started daemon serving the API (offer sources default to one empty fake; `face`
    to daemon_app, the API alone), stopped afterwards."""
    kwargs.setdefault("sources", {"local": FakeSource()})
    kwargs.setdefault("face", daemon_app)
    daemon = Daemon(config, **kwargs)
    daemon.start()
    try:
        yield daemon
    finally:
        daemon.stop()


def without_job_passes(daemon: Daemon) -> None:
    """Take the job reconciler out of the daemon's passes, and return once no pass that ran
    it is left in flight. For tests that write jobs and attempts into the store themselves and
    call the API as their agents: a pass would manage those jobs (launch them, or end attempts
    whose instances no provider knows) while the test talks to the API as their agents."""
    from optimizer.jobs.reconcile import JobReconciler

    loop = daemon.reconcile
    loop.reconcilers = [r for r in loop.reconcilers if not isinstance(r, JobReconciler)]
    # Two passes from now: the second began after the first ended, so with the new list.
    before = loop.passes
    for more in (1, 2):
        loop.wakeup.set()
        wait_until(lambda n=more: loop.passes >= before + n, 30, "a reconcile pass")


def api(daemon: Daemon, token: str | None = TOKEN) -> httpx.Client:
    """A client of the daemon's API, with the test token unless told otherwise."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    # Generous: a loaded CI host can stall a process for seconds; a hung API still fails.
    # Plain HTTP on loopback: no certificate store to load for each of the many clients that
    # polls make (loading it costs more CPU than the request).
    return httpx.Client(base_url=daemon.url, headers=headers, timeout=30, verify=False)


# -- as a process ----------------------------------------------------------------------------


def gpuopt_env(data_dir: Path, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment less its GPUOPT_* settings, with GPUOPT_DATA_DIR=data_dir
    and then `env` on top."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUOPT_")}
    clean["GPUOPT_DATA_DIR"] = str(data_dir)
    clean.update(env or {})
    return clean


def start_gpuopt(
    data_dir: Path, *args: str, env: Mapping[str, str] | None = None, **popen: Any
) -> subprocess.Popen[str]:
    """`gpuopt <args>` as a process on `data_dir` (see gpuopt_env); text stdout and stderr
    piped unless `popen` says otherwise."""
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen([*GPUOPT, *args], text=True, env=gpuopt_env(data_dir, env), **popen)


def run_gpuopt(
    data_dir: Path, *args: str, env: Mapping[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`gpuopt <args>` run to its exit (see start_gpuopt), its output captured."""
    proc = start_gpuopt(data_dir, *args, env=env)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


_serial = itertools.count(1)


class DaemonProcess:
    """`gpuopt daemon` as a real process on `data_dir`, started by the constructor, which
    returns once the daemon has said where its API is (its first line on stdout).

    `args` go to `gpuopt daemon` (`--port 0` unless they name a port); `env` adds settings
    (GPUOPT_DATABASE_URL, ...). Its stderr goes to `log`, by default a file beside `data_dir`.
    """

    def __init__(
        self,
        data_dir: Path,
        *args: str,
        env: Mapping[str, str] | None = None,
        log: Path | None = None,
        timeout: float = 60,
    ) -> None:
        self.data_dir = data_dir
        self.env = dict(env or {})
        if "--port" not in args:
            args = (*args, "--port", "0")
        self.log = log or data_dir.parent / f"{data_dir.name}-daemon-{next(_serial)}.log"
        with self.log.open("a") as stderr:
            self.proc = start_gpuopt(data_dir, "daemon", *args, env=self.env, stderr=stderr)
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        said = wait_until(
            lambda: self.lines or self.proc.poll() is not None, timeout, "the daemon's API line"
        )
        if not isinstance(said, list):
            raise AssertionError(f"the daemon exited ({self.proc.returncode}): {self.output()}")
        first = said[0].split()
        if first[:3] != ["gpuopt:", "API", "at"]:
            self.stop()
            raise AssertionError(f"the daemon said {said[0]!r} first: {self.output()}")
        self.url = first[3]
        self.port = int(self.url.rsplit(":", 1)[1])

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def output(self) -> str:
        """What the daemon has written to stderr so far (the tail of its log)."""
        return self.log.read_text()[-4000:]

    @property
    def token(self) -> str:
        """The API token: the one set in `env`, else the one the daemon wrote to its data dir."""
        configured = self.env.get("GPUOPT_API__TOKEN")
        return configured or (self.data_dir / "api-token").read_text().strip()

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=10
        )

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def role(self) -> str | None:
        """`leader` or `follower` as /readyz says; None while the daemon does not answer."""
        try:
            return str(httpx.get(f"{self.url}/readyz", timeout=2).json()["checks"]["role"])
        except httpx.HTTPError:
            return None

    def reconcile_passes(self) -> float:
        """How many reconcile passes succeeded so far, from /metrics."""
        text = httpx.get(f"{self.url}/metrics", timeout=5).text
        for line in text.splitlines():
            if line.startswith('gpuopt_loop_runs_total{loop="reconcile",outcome="ok"}'):
                return float(line.split()[-1])
        return 0.0

    def kill(self, signum: int = signal.SIGKILL) -> int:
        """Send `signum` and wait for the exit; returns the exit status."""
        self.proc.send_signal(signum)
        return self.proc.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not exited within 30 s (no-op once it has exited)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
