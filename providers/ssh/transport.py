"""One authenticated SSH connection per owned machine, host keys checked against an OpenSSH
known_hosts file (first-use pin only when asked), errors typed at the boundary.

paramiko is imported here only: nothing imports this module when the daemon starts."""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
import shlex
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import paramiko

from providers.base import ProviderError

if TYPE_CHECKING:
    from collections.abc import Callable

PROVIDER = "ssh"


@dataclass(frozen=True, slots=True)
class Target:
    """Where to connect and as whom; key_file None means paramiko's defaults (agent, ~/.ssh)."""

    host: str
    user: str
    port: int = 22
    key_file: Path | None = None

    def label(self) -> str:
        """`user@host:port`, the name every message uses."""
        return f"{self.user}@{self.host}:{self.port}"

    def known_hosts_name(self) -> str:
        """The host as OpenSSH writes it in known_hosts: `[host]:port` off port 22."""
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"


class SshError(ProviderError):
    """An SSH call failed; the message names user@host:port."""

    def __init__(self, message: str) -> None:
        super().__init__(message, provider=PROVIDER, code=type(self).__name__)


class Unreachable(SshError):
    """The machine could not be reached: refused, timed out, unknown name, connection dropped."""


class AuthFailed(SshError):
    """The machine refused the key, or the key file is missing or unreadable."""


class HostKeyUnknown(SshError):
    """The host is not in known_hosts and trusting a new key was not asked for."""


class HostKeyChanged(SshError):
    """known_hosts holds another key for this host: refused whatever trust_new says."""


class CommandFailed(SshError):
    """run(..., check=True) exited non-zero."""


class CommandTimedOut(SshError):
    """A command did not finish within its timeout (its channel is closed)."""


@dataclass(frozen=True, slots=True)
class Result:
    rc: int
    stdout: str
    stderr: str


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's `SHA256:` fingerprint of a public key (base64 without padding)."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


class Session:
    """One authenticated connection; thread-safe (each call opens its own channel)."""

    def __init__(self, target: Target, client: paramiko.SSHClient, host_key: paramiko.PKey) -> None:
        self.target = target
        self.host_key_fingerprint = fingerprint(host_key)
        self._client = client

    @property
    def active(self) -> bool:
        """Whether the underlying connection is still up."""
        transport = self._client.get_transport()
        return transport is not None and transport.is_active()

    def run(
        self, command: str, *, input: str | None = None, timeout: float = 30.0, check: bool = False
    ) -> Result:
        """Run `command` (through the remote user's shell) and read its output in full.

        stdout and stderr are drained concurrently so that neither blocks the other when both
        are large; `input` goes to stdin, which is then closed."""
        label = self.target.label()
        word = command.split(maxsplit=1)[0] if command.split() else command
        deadline = time.monotonic() + timeout
        transport = self._client.get_transport()
        if transport is None or not transport.is_active():
            raise Unreachable(f"{label}: the connection is closed")
        try:
            channel = transport.open_session(timeout=timeout)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise Unreachable(f"{label}: could not open a channel ({_reason(exc)})") from None
        errors: list[BaseException] = []
        stderr_chunks: list[bytes] = []
        stdout_chunks: list[bytes] = []
        try:
            channel.settimeout(0.5)
            channel.exec_command(command)
            helpers = [
                _thread(lambda: _drain(channel.recv_stderr, stderr_chunks, deadline), errors),
            ]
            if input is not None:
                data = input.encode()
                helpers.append(_thread(lambda: _feed(channel, data), errors))
            else:
                channel.shutdown_write()
            _drain(channel.recv, stdout_chunks, deadline)
            for helper in helpers:
                helper.join(max(0.0, deadline - time.monotonic()) + 1.0)
            if errors:
                raise errors[0]
            while not channel.exit_status_ready():
                if time.monotonic() > deadline:
                    raise TimeoutError
                channel.status_event.wait(0.1)
            rc = channel.recv_exit_status()
        except TimeoutError:
            raise CommandTimedOut(
                f"{label}: {word!r} did not finish within {timeout:g} s"
            ) from None
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise Unreachable(
                f"{label}: the connection dropped during {word!r} ({_reason(exc)})"
            ) from None
        finally:
            channel.close()
        result = Result(
            rc=rc,
            stdout=b"".join(stdout_chunks).decode("utf-8", errors="replace"),
            stderr=b"".join(stderr_chunks).decode("utf-8", errors="replace"),
        )
        if check and rc != 0:
            lines = result.stderr.strip().splitlines()
            last = f": {lines[-1]}" if lines else ""
            raise CommandFailed(f"{label}: {word!r} exited {rc}{last}")
        return result

    def write_file(self, path: str, text: str, *, mode: int = 0o600) -> None:
        """Write `text` to `path` atomically (a temporary file beside it, then a rename), making
        the parent folders; under umask 077, so the file is never readable by others meanwhile."""
        parent = os.path.dirname(path) or "."
        tmp = f"{path}.tmp-{secrets.token_hex(4)}"
        script = 'umask 077; mkdir -p "$1" && cat > "$2" && chmod "$4" "$2" && mv "$2" "$3"'
        argv = ["sh", "-c", script, "sh", parent, tmp, path, f"{mode:o}"]
        self.run(" ".join(shlex.quote(part) for part in argv), input=text, check=True)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _thread(work: Callable[[], None], errors: list[BaseException]) -> threading.Thread:
    def body() -> None:
        try:
            work()
        except BaseException as exc:  # handed to the caller's thread
            errors.append(exc)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread


def _drain(recv: Callable[[int], bytes], into: list[bytes], deadline: float) -> None:
    """Read until EOF, polling so the overall deadline is kept."""
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError
        try:
            chunk = recv(65536)
        except TimeoutError:
            continue
        if not chunk:
            return
        into.append(chunk)


def _feed(channel: paramiko.Channel, data: bytes) -> None:
    channel.sendall(data)
    channel.shutdown_write()


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


class _HostKeyCheck(paramiko.MissingHostKeyPolicy):
    """The host is not in known_hosts: pin its key when trusting new hosts, else refuse."""

    def __init__(self, target: Target, known_hosts: Path, trust_new: bool) -> None:
        self._target = target
        self._known_hosts = known_hosts
        self._trust_new = trust_new

    def missing_host_key(self, client: Any, hostname: str, key: paramiko.PKey) -> None:
        if not self._trust_new:
            raise HostKeyUnknown(
                f"{self._target.label()}: host key {fingerprint(key)} ({key.get_name()}) is not"
                f" in {self._known_hosts}; check the fingerprint on the machine"
                " (ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub) and pin it by connecting"
                " once with trust_new, or add its line to that file"
            )
        _append_known_host(self._known_hosts, hostname, key)


def _append_known_host(known_hosts: Path, name: str, key: paramiko.PKey) -> None:
    known_hosts.parent.mkdir(parents=True, exist_ok=True)
    line = f"{name} {key.get_name()} {key.get_base64()}\n"
    fd = os.open(known_hosts, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a") as out:
        out.write(line)


def _load_key(target: Target) -> paramiko.PKey | None:
    """The target's private key, or None for paramiko's defaults; a key file that is missing,
    unreadable or not a key is an AuthFailed naming it (never its contents)."""
    if target.key_file is None:
        return None
    try:
        return paramiko.PKey.from_path(target.key_file)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
    except (paramiko.SSHException, ValueError) as exc:
        reason = f"not a usable private key: {type(exc).__name__}"
    raise AuthFailed(f"{target.label()}: cannot read the key file {target.key_file} ({reason})")


def connect(
    target: Target, *, known_hosts: Path, trust_new: bool = False, timeout: float = 10.0
) -> Session:
    """Connect and authenticate, the host key checked against `known_hosts` (OpenSSH format).

    An unknown host is refused (HostKeyUnknown) unless `trust_new`, which appends its key to
    the file; a changed key is always refused (HostKeyChanged)."""
    label = target.label()
    pkey = _load_key(target)
    client = paramiko.SSHClient()
    if known_hosts.exists():
        try:
            client.get_host_keys().load(str(known_hosts))
        except (OSError, paramiko.SSHException) as exc:
            raise SshError(f"{label}: cannot read {known_hosts} ({_reason(exc)})") from None
    client.set_missing_host_key_policy(_HostKeyCheck(target, known_hosts, trust_new))
    keyed = pkey is not None
    try:
        client.connect(
            target.host,
            port=target.port,
            username=target.user,
            pkey=pkey,
            allow_agent=not keyed,
            look_for_keys=not keyed,
            timeout=timeout,
            banner_timeout=timeout,
            auth_timeout=timeout,
            channel_timeout=timeout,
        )
    except SshError:
        client.close()
        raise
    except paramiko.BadHostKeyException as exc:
        client.close()
        raise HostKeyChanged(
            f"{label}: the host key changed: the machine offers {fingerprint(exc.key)} but"
            f" {known_hosts} pins {fingerprint(exc.expected_key)}; refused. If the machine was"
            f" reinstalled, remove its line from {known_hosts} after checking the new key"
        ) from None
    except paramiko.AuthenticationException:
        client.close()
        which = f"the key {target.key_file}" if keyed else "the agent's and ~/.ssh's keys"
        raise AuthFailed(f"{label}: authentication refused ({which})") from None
    except (OSError, EOFError, paramiko.SSHException) as exc:
        client.close()
        raise Unreachable(f"{label}: cannot connect ({_reason(exc)})") from None
    transport = client.get_transport()
    assert transport is not None  # connect() returned, so it made one
    return Session(target, client, transport.get_remote_server_key())


class Pool:
    """Sessions kept per target; a cached one whose connection died is replaced once."""

    def __init__(self, known_hosts: Path, *, timeout: float = 10.0) -> None:
        self._known_hosts = known_hosts
        self._timeout = timeout
        self._sessions: dict[Target, Session] = {}
        self._lock = threading.Lock()

    def session(self, target: Target) -> Session:
        """The live session for `target`, connecting (once) when none is cached or it died."""
        with self._lock:
            cached = self._sessions.get(target)
            if cached is not None and cached.active:
                return cached
            if cached is not None:
                cached.close()
                del self._sessions[target]
            fresh = connect(target, known_hosts=self._known_hosts, timeout=self._timeout)
            self._sessions[target] = fresh
            return fresh

    def close(self) -> None:
        with self._lock:
            sessions = list(self._sessions.values())
            self._sessions.clear()
        for session in sessions:
            session.close()
