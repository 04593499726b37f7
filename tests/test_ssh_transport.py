"""The SSH transport against a real OpenSSH server: commands, stdin, atomic file writes, big
outputs, host-key pinning (unknown, first use, changed), typed failures and the pool."""

from __future__ import annotations

import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from providers.ssh.transport import (
    AuthFailed,
    CommandFailed,
    HostKeyChanged,
    HostKeyUnknown,
    Pool,
    Target,
    Unreachable,
    connect,
)
from tests.helpers.sshd import SshMachine, make_key, sshd
from tests.helpers.waiting import wait_until


@pytest.fixture
def key(tmp_path: Path) -> Path:
    return make_key(tmp_path / "client")


@pytest.fixture
def machine(tmp_path: Path, key: Path) -> Iterator[SshMachine]:
    with sshd(tmp_path / "server", "gpu1", authorized=[key.with_suffix(".pub")]) as running:
        yield running


@pytest.fixture
def known_hosts(tmp_path: Path, machine: SshMachine) -> Path:
    path = tmp_path / "known_hosts"
    path.write_text(machine.known_hosts_line() + "\n")
    return path


def test_run_returns_stdout_stderr_and_rc(
    machine: SshMachine, key: Path, known_hosts: Path
) -> None:
    with connect(machine.target(key), known_hosts=known_hosts) as session:
        result = session.run("echo out; echo err >&2; exit 3")
        assert (result.rc, result.stdout, result.stderr) == (3, "out\n", "err\n")
        assert session.host_key_fingerprint.startswith("SHA256:")


def test_check_raises_naming_the_command_rc_and_last_stderr_line(
    machine: SshMachine, key: Path, known_hosts: Path
) -> None:
    with (
        connect(machine.target(key), known_hosts=known_hosts) as session,
        pytest.raises(CommandFailed) as caught,
    ):
        session.run("ls /no-such-folder-here", check=True)
    message = str(caught.value)
    assert "'ls'" in message and "exited 2" in message and "no-such-folder-here" in message
    assert caught.value.provider == "ssh" and caught.value.code == "CommandFailed"


def test_input_goes_to_stdin(machine: SshMachine, key: Path, known_hosts: Path) -> None:
    with connect(machine.target(key), known_hosts=known_hosts) as session:
        assert session.run("tr a-z A-Z", input="hello\nworld\n").stdout == "HELLO\nWORLD\n"


def test_write_file_makes_parents_and_a_0600_file_with_no_leftovers(
    machine: SshMachine, key: Path, known_hosts: Path, tmp_path: Path
) -> None:
    path = tmp_path / "remote" / "deep" / "agent.env"
    with connect(machine.target(key), known_hosts=known_hosts) as session:
        session.write_file(str(path), "TOKEN=s3cret\n")
        session.write_file(str(path), "TOKEN=second\n")
        session.write_file(str(path.with_name("run.sh")), "#!/bin/sh\n", mode=0o700)
    assert path.read_text() == "TOKEN=second\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.with_name("run.sh").stat().st_mode) == 0o700
    assert sorted(p.name for p in path.parent.iterdir()) == ["agent.env", "run.sh"]


def test_several_megabytes_on_both_streams_do_not_deadlock(
    machine: SshMachine, key: Path, known_hosts: Path
) -> None:
    command = "head -c 4000000 /dev/zero | tr '\\0' o; head -c 4000000 /dev/zero | tr '\\0' e >&2"
    with connect(machine.target(key), known_hosts=known_hosts) as session:
        result = session.run(command, timeout=20)
    assert result.rc == 0
    assert len(result.stdout) == 4_000_000 and set(result.stdout) == {"o"}
    assert len(result.stderr) == 4_000_000 and set(result.stderr) == {"e"}


def test_both_streams_interleaved_do_not_deadlock(
    machine: SshMachine, key: Path, known_hosts: Path
) -> None:
    # stderr first and big: a reader that drained stdout alone would stall the remote.
    command = "head -c 3000000 /dev/zero >&2; head -c 3000000 /dev/zero"
    with connect(machine.target(key), known_hosts=known_hosts) as session:
        result = session.run(command, timeout=20)
    assert (len(result.stdout), len(result.stderr)) == (3_000_000, 3_000_000)


def _fingerprint_of(machine: SshMachine) -> str:
    """The server's fingerprint as OpenSSH prints it (an oracle independent of the transport)."""
    out = subprocess.run(
        ["ssh-keygen", "-lf", str(machine.host_key_pub)], check=True, capture_output=True, text=True
    ).stdout
    return out.split()[1]


def test_an_unknown_host_is_refused_naming_its_fingerprint(
    machine: SshMachine, key: Path, tmp_path: Path
) -> None:
    known_hosts = tmp_path / "pins" / "known_hosts"
    with pytest.raises(HostKeyUnknown) as caught:
        connect(machine.target(key), known_hosts=known_hosts)
    message = str(caught.value)
    assert _fingerprint_of(machine) in message
    assert machine.target(key).label() in message and "trust_new" in message
    assert not known_hosts.exists()


def test_trust_new_pins_the_key_on_first_use(
    machine: SshMachine, key: Path, tmp_path: Path
) -> None:
    known_hosts = tmp_path / "pins" / "known_hosts"
    with connect(machine.target(key), known_hosts=known_hosts, trust_new=True) as session:
        assert session.host_key_fingerprint == _fingerprint_of(machine)
    assert known_hosts.read_text() == machine.known_hosts_line() + "\n"
    assert stat.S_IMODE(known_hosts.stat().st_mode) == 0o600
    with connect(machine.target(key), known_hosts=known_hosts) as session:
        assert session.run("true").rc == 0
    assert known_hosts.read_text() == machine.known_hosts_line() + "\n"


def test_a_changed_host_key_is_refused_even_with_trust_new(
    machine: SshMachine, key: Path, known_hosts: Path
) -> None:
    old = _fingerprint_of(machine)
    pinned = known_hosts.read_text()
    machine.regenerate_host_key()
    new = _fingerprint_of(machine)
    assert old != new
    with pytest.raises(HostKeyChanged) as caught:
        connect(machine.target(key), known_hosts=known_hosts, trust_new=True)
    message = str(caught.value)
    assert old in message and new in message and str(known_hosts) in message
    assert known_hosts.read_text() == pinned


def test_a_refused_key_is_auth_failed_naming_user_host_port(
    machine: SshMachine, known_hosts: Path, tmp_path: Path
) -> None:
    stranger = make_key(tmp_path / "stranger")
    target = machine.target(stranger)
    with pytest.raises(AuthFailed) as caught:
        connect(target, known_hosts=known_hosts)
    assert target.label() in str(caught.value)
    assert caught.value.code == "AuthFailed"


def test_a_missing_key_file_is_auth_failed_naming_the_file(
    machine: SshMachine, known_hosts: Path, tmp_path: Path
) -> None:
    missing = tmp_path / "nowhere" / "id_ed25519"
    with pytest.raises(AuthFailed) as caught:
        connect(machine.target(missing), known_hosts=known_hosts)
    assert str(missing) in str(caught.value)


def test_a_closed_port_is_unreachable_within_the_timeout(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    target = Target("127.0.0.1", "nobody", port, make_key(tmp_path / "client"))
    started = time.monotonic()
    with pytest.raises(Unreachable) as caught:
        connect(target, known_hosts=tmp_path / "known_hosts", timeout=3.0)
    assert time.monotonic() - started < 3.0 * 2
    assert f"127.0.0.1:{port}" in str(caught.value)
    assert caught.value.code == "Unreachable"


def test_the_pool_reuses_a_session_and_reconnects_after_a_restart(
    machine: SshMachine, key: Path, known_hosts: Path
) -> None:
    pool = Pool(known_hosts, timeout=5.0)
    try:
        target = machine.target(key)
        first = pool.session(target)
        assert pool.session(target) is first
        machine.restart()
        wait_until(lambda: not first.active, 10.0, "the old connection to drop")
        second = pool.session(target)
        assert second is not first
        assert second.run("echo again").stdout == "again\n"
        assert pool.session(target) is second
    finally:
        pool.close()
