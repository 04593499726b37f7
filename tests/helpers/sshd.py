"""A real OpenSSH server for the SSH transport's tests: Debian's /usr/sbin/sshd on 127.0.0.1,
an ephemeral port, its own folder (config, host key, authorized_keys, pid file), stopped by PID.

Tests skip, saying why, where /usr/sbin/sshd is missing or cannot run (.ci/run installs
Debian's openssh-server where it can)."""

from __future__ import annotations

import getpass
import os
import signal
import socket
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from providers.ssh.transport import Target
from tests.helpers.waiting import wait_until

SSHD = Path("/usr/sbin/sshd")
# sshd refuses to start without its privilege separation folder (made by systemd's unit
# normally, which a test host does not run).
PRIVSEP_DIR = Path("/run/sshd")
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0


def _keygen(path: Path, comment: str) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
    )


def make_key(folder: Path, name: str = "id_ed25519") -> Path:
    """A new passphrase-less ed25519 key pair in `folder`; returns the private key's path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    _keygen(path, f"gpuopt-test-{name}")
    return path


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _banner(port: int) -> bool:
    """Whether an SSH server answers its banner on the port."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as conn:
            conn.settimeout(1.0)
            return conn.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def _children(pid: int) -> list[int]:
    """The PIDs started by `pid` (sshd's per-connection processes), read from /proc."""
    found: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


@dataclass
class SshMachine:
    name: str
    port: int
    folder: Path
    host_key_pub: Path
    pid: int
    _process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def config(self) -> Path:
        return self.folder / "sshd_config"

    @property
    def host_key(self) -> Path:
        return self.folder / "ssh_host_ed25519_key"

    def target(self, key: Path) -> Target:
        """This server as the current user, with `key`."""
        return Target("127.0.0.1", getpass.getuser(), self.port, key)

    def known_hosts_line(self) -> str:
        """The line OpenSSH would pin for this server: `[127.0.0.1]:PORT ssh-ed25519 AAAA...`."""
        kind, blob = self.host_key_pub.read_text().split()[:2]
        return f"[127.0.0.1]:{self.port} {kind} {blob}"

    def start(self) -> None:
        """Start sshd on self.port and wait until it answers an SSH banner."""
        log = (self.folder / "sshd.log").open("ab")
        process = subprocess.Popen(
            [str(SSHD), "-D", "-e", "-f", str(self.config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        self._process = process
        self.pid = process.pid

        def up() -> bool:
            if process.poll() is not None:
                tail = (self.folder / "sshd.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"sshd {self.name} exited {process.returncode}: {tail}")
            return _banner(self.port)

        wait_until(up, START_TIMEOUT_S, f"sshd {self.name} on 127.0.0.1:{self.port}")

    def stop(self) -> None:
        """Stop this server and the connections it serves (all by PID: processes it started)."""
        process = self._process
        if process is None:
            return
        self._process = None
        children = _children(process.pid)
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(STOP_TIMEOUT_S)
        for child in children:
            with suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)

    def regenerate_host_key(self) -> None:
        """A new host key, and a restart on the same port (the changed-key case)."""
        self.stop()
        self.host_key.unlink()
        self.host_key_pub.unlink()
        _keygen(self.host_key, f"gpuopt-test-{self.name}")
        self.start()

    def restart(self) -> None:
        """Stop the server (dropping its connections) and start it again on the same port."""
        self.stop()
        self.start()


def _runnable() -> str | None:
    """Why sshd cannot run here, or None."""
    if not SSHD.exists():
        return f"{SSHD} is missing (Debian: apt-get install openssh-server)"
    if not os.access(SSHD, os.X_OK):
        return f"{SSHD} is not executable"
    try:
        PRIVSEP_DIR.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"sshd needs {PRIVSEP_DIR}, which cannot be made ({exc.strerror})"
    return None


def _write_config(machine: SshMachine, authorized_keys: Path) -> None:
    lines = [
        f"ListenAddress 127.0.0.1:{machine.port}",
        f"HostKey {machine.host_key}",
        f"AuthorizedKeysFile {authorized_keys}",
        f"PidFile {machine.folder / 'sshd.pid'}",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",
        "PermitRootLogin prohibit-password",
        "LogLevel VERBOSE",
        "MaxStartups 100",
        "UseDNS no",
        "PrintMotd no",
        "PrintLastLog no",
        "X11Forwarding no",
        "Subsystem sftp internal-sftp",
    ]
    machine.config.write_text("\n".join(lines) + "\n")


@contextmanager
def sshd(folder: Path, name: str, *, authorized: Sequence[Path]) -> Iterator[SshMachine]:
    """A running sshd that accepts the given public keys; stopped afterwards."""
    reason = _runnable()
    if reason is not None:
        pytest.skip(f"no OpenSSH server to test against: {reason}")
    folder = folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    host_key = folder / "ssh_host_ed25519_key"
    _keygen(host_key, f"gpuopt-test-{name}")
    authorized_keys = folder / "authorized_keys"
    authorized_keys.write_text("".join(Path(f"{key}").read_text() for key in authorized))
    machine = SshMachine(name, 0, folder, folder / "ssh_host_ed25519_key.pub", 0)
    # A port freed by the probe can be taken again before sshd binds it: try a few.
    for attempt in range(5):
        machine.port = _free_port()
        _write_config(machine, authorized_keys)
        try:
            machine.start()
            break
        except RuntimeError:
            machine._process = None
            if attempt == 4:
                raise
    try:
        yield machine
    finally:
        machine.stop()


def instance_processes(folder: Path) -> list[int]:
    """The live processes of owned instances whose folder lies under `folder` (each carries
    its mark, `<id>@<its folder>`, in MACHINE_MARK_ENV, the job included); zombies do not
    count."""
    from optimizer.common.environ import MACHINE_MARK_ENV
    from optimizer.common.procs import pids_with_env

    root = str(folder.resolve())

    def under(mark: str) -> bool:
        where = mark.partition("@")[2]
        return where == root or where.startswith(root + "/")

    return pids_with_env(MACHINE_MARK_ENV, under)


def reap_instances(folder: Path) -> list[int]:
    """SIGKILL every process of the owned instances under `folder` (instance_processes): so
    a test that fails midway leaves none of its jobs running. Only processes a test started
    can carry such a mark; returns the pids killed."""
    killed = []
    for pid in instance_processes(folder):
        with suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    return killed
