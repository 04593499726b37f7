"""Leader election: PostgreSQL advisory lock among replicas, the SQLite single-instance lock.

The in-process tests drive `PostgresElection` and `SqliteLock` directly against the local
PostgreSQL server. The process tests run real `gpuopt daemon` processes on one PostgreSQL
schema and one local cloud, kill the leader with SIGKILL, and check that the other replica
takes over within 15 s and that no job is launched twice. A small loopback balancer stands
in for the Kubernetes Service in front of the replicas: the agents on the local cloud's
instances report through it to whichever replica is alive.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from optimizer.daemon.errors import DaemonError
from optimizer.daemon.leader import PostgresElection, SqliteLock, sqlite_lock_path
from optimizer.model import Market, Offer
from optimizer.store import Store
from providers.base import LaunchSpec
from providers.local import LocalCloud
from providers.local.faults import add_fault
from providers.local.metadata import TOKEN_HEADER, TOKEN_TTL_HEADER
from providers.local.procs import power_off
from providers.local.state import StateDir
from tests.helpers import (
    DaemonProcess,
    FakeSource,
    api,
    make_config,
    run_gpuopt,
    running,
    start_gpuopt,
    wait_until,
)
from tests.helpers.jobs import POLICY  # the local-cloud policy of the job tests

ROOT = Path(__file__).resolve().parents[1]
TAKEOVER_LIMIT_S = 15.0
pytestmark = pytest.mark.usefixtures("daemon_env")


# -- in-process: the PostgreSQL election ---------------------------------------------------


@pytest.fixture
def pg_store(postgres_schema: tuple[str, str]) -> Iterator[Store]:
    url, schema = postgres_schema
    with Store(url, schema=schema) as db:
        db.create_all()
        yield db


def election(store: Store, **kwargs: Any) -> PostgresElection:
    kwargs.setdefault("check_s", 0.1)
    kwargs.setdefault("lease_s", 1.0)
    return PostgresElection(store, **kwargs)


@pytest.mark.postgres
def test_exactly_one_of_two_replicas_leads_and_the_other_takes_over(pg_store: Store) -> None:
    first, second = election(pg_store), election(pg_store)
    first.start()
    second.start()
    try:
        assert first.is_leader and not second.is_leader
        roles = {r.id: r.role for r in pg_store.replicas.seen()}
        assert roles == {first.replica: "leader", second.replica: "follower"}
        first.stop()
        wait_until(lambda: second.is_leader, timeout=5, what="the follower to take over")
        assert not first.is_leader
        assert [r.id for r in pg_store.replicas.seen()] == [second.replica]  # the stopped one left
    finally:
        first.stop()
        second.stop()


@pytest.mark.postgres
def test_a_clean_stop_hands_over_at_once_not_at_the_next_round(pg_store: Store) -> None:
    leader = election(pg_store, check_s=30, lease_s=61)
    follower = election(pg_store, check_s=30, lease_s=61)
    leader.start()
    follower.start()
    try:
        assert leader.is_leader and not follower.is_leader
        # The follower LISTENs from its first round; a notice that arrives before its wait
        # begins is kept by the driver and read when the wait starts.
        leader.stop()
        # Far sooner than a 30 s round: the release NOTIFY ended the follower's wait.
        wait_until(lambda: follower.is_leader, timeout=5, what="the handover")
    finally:
        leader.stop()
        follower.stop()


@pytest.mark.postgres
def test_a_follower_takes_over_when_the_leaders_session_ends_not_at_its_next_round(
    pg_store: Store,
) -> None:
    # A SIGKILLed leader announces nothing: its session just ends. Rounds of 30 s: a
    # follower that polled for the lock would take up to 30 s; one waiting for it in the
    # server is granted it as the session goes.
    leader = election(pg_store, check_s=30, lease_s=61)
    follower = election(pg_store, check_s=30, lease_s=61)
    leader.start()
    follower.start()
    try:
        assert leader.is_leader and not follower.is_leader  # its first try is over
        with pg_store.engine.begin() as conn:
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = :name"
                ),
                {"name": f"gpuopt leader election {leader.replica}"[:63]},
            )
        wait_until(lambda: follower.is_leader, timeout=5, what="the takeover")
        # The old leader, once it sees its session gone, stops acting too.
        wait_until(lambda: not leader.is_leader, timeout=5, what="the old leader to step down")
    finally:
        follower.stop()
        leader.stop()  # its thread waits 30 s for a next round: stop() ends that wait too


@pytest.mark.postgres
def test_a_new_leaders_lease_counts_from_after_its_wait_for_the_lock(pg_store: Store) -> None:
    now = [1000.0]
    leader = election(pg_store, check_s=30, lease_s=40)
    follower = election(pg_store, check_s=30, lease_s=40, monotonic=lambda: now[0])
    leader.start()
    follower.start()
    try:
        wait_until(lambda: waiting_for_the_lock(pg_store, follower), timeout=5, what="its wait")
        now[0] += 45  # the follower's clock runs on while it waits (longer than a lease)
        leader.stop()  # the lock is granted to the waiting follower
        wait_until(lambda: follower._role.leading, timeout=5, what="the handover")
        assert follower.is_leader  # a whole lease from the grant, not one spent waiting
    finally:
        follower.stop()
        leader.stop()


@pytest.mark.postgres
def test_stopping_a_follower_ends_its_wait_for_the_lock(pg_store: Store) -> None:
    leader = election(pg_store, check_s=30, lease_s=61)
    follower = election(pg_store, check_s=30, lease_s=61)
    leader.start()
    follower.start()
    try:
        wait_until(lambda: waiting_for_the_lock(pg_store, follower), timeout=5, what="its wait")
        stopped = threading.Thread(target=follower.stop)
        stopped.start()
        # Far sooner than the 30 s its wait in the server would last.
        wait_until(lambda: not stopped.is_alive(), timeout=5, what="the follower to stop")
        assert not waiting_for_the_lock(pg_store, follower)
        assert leader.is_leader and not follower.is_leader
    finally:
        follower.stop()
        leader.stop()


def waiting_for_the_lock(store: Store, replica: PostgresElection) -> bool:
    """Whether the replica's lock session is waiting in the server for the advisory lock."""
    with store.engine.connect() as conn:
        return bool(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                    "WHERE l.locktype = 'advisory' AND NOT l.granted "
                    "AND a.application_name = :name"
                ),
                {"name": f"gpuopt leader election {replica.replica}"[:63]},
            ).scalar()
        )


@pytest.mark.postgres
def test_schemas_elect_separately(postgres_schema: tuple[str, str], pg_store: Store) -> None:
    url, _ = postgres_schema
    other = f"{pg_store.schema}_b"
    with pg_store.engine.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{other}"'))
    try:
        with Store(url, schema=other) as second_store:
            second_store.create_all()
            a, b = election(pg_store), election(second_store)
            a.start()
            b.start()
            try:
                assert a.is_leader and b.is_leader
            finally:
                a.stop()
                b.stop()
    finally:
        with pg_store.engine.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{other}" CASCADE'))


@pytest.mark.postgres
def test_a_leader_whose_session_is_killed_steps_down_then_one_replica_leads(
    pg_store: Store,
) -> None:
    first, second = election(pg_store), election(pg_store)
    changes: list[bool] = []
    first.start()
    first.listeners.append(changes.append)
    second.start()
    try:
        assert first.is_leader
        with pg_store.engine.begin() as conn:
            killed = conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = :name"
                ),
                {"name": f"gpuopt leader election {first.replica}"[:63]},
            ).all()
        assert killed == [(True,)]
        wait_until(lambda: False in changes, timeout=5, what="the leader to step down")
        # Whoever wins the next round (the old leader reconnects and competes), one leads.
        wait_until(lambda: first.is_leader != second.is_leader, timeout=5, what="a new leader")
        # Once both are connected again, both compete every round; the lock allows one.
        wait_until(lambda: first._conn is not None and second._conn is not None, timeout=5)
        assert first.is_leader != second.is_leader
    finally:
        first.stop()
        second.stop()


@pytest.mark.postgres
def test_a_leader_that_cannot_confirm_its_lock_stops_acting_after_the_lease(
    pg_store: Store,
) -> None:
    now = [1000.0]
    leader = election(pg_store, check_s=60, lease_s=120, monotonic=lambda: now[0])
    leader.start()
    try:
        assert leader.is_leader
        now[0] += 119  # no confirmation for almost a lease: still leading
        assert leader.is_leader
        now[0] += 2  # past the lease: acts no more, whatever the connection says
        assert not leader.is_leader
    finally:
        leader.stop()


@pytest.mark.postgres
def test_a_follower_wakes_the_leader_through_notify(pg_store: Store) -> None:
    woken = threading.Event()
    leader = election(pg_store, on_wakeup=woken.set)
    follower = election(pg_store)
    leader.start()
    follower.start()
    try:
        assert leader.is_leader and not follower.is_leader
        follower.nudge()  # the leader LISTENs from its first round: no wait needed
        assert woken.wait(5), "the leader was not woken"
    finally:
        leader.stop()
        follower.stop()


def test_lease_must_outlast_the_check(tmp_path: Path) -> None:
    with (
        Store(f"sqlite:///{tmp_path / 'x.db'}") as db,
        pytest.raises(ValueError, match="lease_s must be longer"),
    ):
        PostgresElection(db, check_s=5, lease_s=5)


# -- in-process: the SQLite lock -----------------------------------------------------------


def test_a_second_sqlite_daemon_is_refused_and_may_start_after_the_first(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'gpuopt.db'}"
    with Store(url) as db:
        db.create_all()
        path = sqlite_lock_path(url)
        assert path == tmp_path / "gpuopt.db.lock"
        first, second = SqliteLock(db, path), SqliteLock(db, path)
        first.start()
        try:
            assert first.is_leader
            with pytest.raises(DaemonError) as refused:
                second.claim()
            message = str(refused.value)
            assert f"(pid {os.getpid()} on {socket.gethostname()}" in message
            assert f"already using the SQLite database {tmp_path / 'gpuopt.db'}" in message
            assert "use PostgreSQL" in message
            assert not second.is_leader
        finally:
            first.stop()
        second.start()
        assert second.is_leader
        second.stop()


def test_a_lock_file_caught_before_its_holder_wrote_it_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `gpuopt db upgrade` that finds the lock taken but its file still empty (the holder
    took the lock and has not written who it is yet) reads it again instead of taking the
    holder for a daemon: two upgrades started at once both succeed."""
    import fcntl

    from optimizer.daemon.leader import sqlite as sqlite_lock

    url = f"sqlite:///{tmp_path / 'gpuopt.db'}"
    reads: list[dict[str, Any]] = []
    read = sqlite_lock._read_holder

    def counted(fd: int) -> dict[str, Any]:
        reads.append(found := read(fd))
        return found

    monkeypatch.setattr(sqlite_lock, "_read_holder", counted)
    monkeypatch.setattr(sqlite_lock, "HOLDER_SETTLE_S", 30.0)  # however slow this host is
    with Store(url) as db:
        db.create_all()
        path = sqlite_lock_path(url)
        assert path is not None
        holder = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)  # the other upgrade, mid-claim
        fcntl.flock(holder, fcntl.LOCK_EX)
        upgrade = SqliteLock(db, path, purpose="db upgrade")
        failed: list[BaseException] = []

        def claim() -> None:
            try:
                upgrade.claim(wait_for_migration_s=30)
            except BaseException as exc:  # handed to the test's thread
                failed.append(exc)

        waiter = threading.Thread(target=claim)
        waiter.start()
        try:
            wait_until(lambda: len(reads) >= 2 or failed, 10, "the empty lock file read twice")
            assert failed == []
            os.pwrite(holder, b'{"pid": 1, "purpose": "db upgrade"}\n', 0)
            wait_until(lambda: any(reads[-1:]), 10, "the holder read once written")
            fcntl.flock(holder, fcntl.LOCK_UN)
            waiter.join(10)
            assert not waiter.is_alive() and failed == []
        finally:
            os.close(holder)
            upgrade.release()


def test_a_replica_that_leads_serves_the_instances_the_last_leader_launched(
    tmp_path: Path,
) -> None:
    # The last leader launched an instance and died: its metadata endpoint went with it, the
    # instance runs on. No job names the instance, so no reconcile pass describes it (which
    # used to be what started the cloud): the replica that leads serves it at once. The real
    # local cloud; the lock is SQLite's, whose daemon leads from its start, through the same
    # listener as a takeover on PostgreSQL.
    config = make_config(tmp_path / "data")
    state = config.effective_data_dir / "local-cloud"
    last = LocalCloud(state)
    offer = next(
        o
        for o in last.fetch_offers(["eu-west-1"])
        if o.instance_type == "g5.xlarge" and o.market is Market.SPOT
    )
    ref = last.launch(offer, LaunchSpec(job="j", attempt=1, bootstrap="sleep 60"), "j/1")
    port = last.metadata.port
    last.close()  # as the leader dies: the endpoint and ticker stop, the instance runs on
    try:
        with running(config, sources=None) as daemon:
            assert daemon.leadership.is_leader
            url = f"http://127.0.0.1:{port}/{ref.instance_id}/latest"
            token = httpx.put(f"{url}/api/token", headers={TOKEN_TTL_HEADER: "60"}).text
            answer = httpx.get(f"{url}/meta-data/instance-id", headers={TOKEN_HEADER: token})
            assert (answer.status_code, answer.text) == (200, ref.instance_id)
    finally:
        LocalCloud(state).kill_all()


class RecordedSource(FakeSource):
    """A FakeSource that, once `armed`, writes each fetch into `order` and sets `fetched`."""

    def __init__(self) -> None:
        super().__init__(name="local")
        self.order: list[str] = []
        self.armed = threading.Event()
        self.fetched = threading.Event()

    def fetch_offers(self, regions: Sequence[str] | None = None) -> list[Offer]:
        if self.armed.is_set():
            self.order.append("poll")
            self.fetched.set()
        return super().fetch_offers(regions)


def test_a_takeover_runs_its_reconcile_pass_before_the_polls(tmp_path: Path) -> None:
    # The polls are CPU-bound and would slow the takeover's pass down, sharing the
    # interpreter: they wait for it. The takeover's pass below waits (3 s at most) for a
    # poll that runs beside it; none may come.
    source = RecordedSource()
    config = make_config(tmp_path / "data", loops={"deliver_s": 3600, "watch_s": 3600})
    with running(config, sources={"local": source}) as daemon:

        def quiet() -> bool:  # the start's polls and passes are over
            polled = {p.name for p in daemon.polls} <= daemon._polled
            return polled and daemon.reconcile.passes >= 1 and daemon.scheduler._in_flight == 0

        wait_until(quiet, timeout=20, what="the start's loops to end")

        def slow_pass(ctx: object) -> None:
            if source.armed.is_set():
                source.order.append("pass")
                source.fetched.wait(3)
                source.order.append("pass ended")

        daemon.reconcile.reconcilers.append(slow_pass)
        source.armed.set()
        # A takeover, as the election reports one (this daemon's SQLite lock never moves).
        daemon.leadership._set_leading(False)
        daemon.leadership._set_leading(True)
        wait_until(
            lambda: source.order.count("poll") >= 2, timeout=20, what=f"polls: {source.order}"
        )
        # (A pass the polls' prices woke may follow them: only the takeover's order counts.)
        assert source.order[:4] == ["pass", "pass ended", "poll", "poll"]


def test_a_replica_that_leads_starts_no_local_cloud_while_it_has_no_instance(
    tmp_path: Path,
) -> None:
    config = make_config(tmp_path / "data")
    with running(config, sources=None) as daemon:
        assert daemon.leadership.is_leader
        assert not (config.effective_data_dir / "local-cloud").exists()


def test_in_memory_sqlite_needs_no_lock() -> None:
    assert sqlite_lock_path("sqlite://") is None
    assert sqlite_lock_path("sqlite:///:memory:") is None


# -- real processes ------------------------------------------------------------------------


class Balancer:
    """A loopback TCP balancer: each connection goes to the first backend that accepts it,
    as a Service sends traffic only to live pods."""

    def __init__(self) -> None:
        self.backends: list[tuple[str, int]] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        for backend in list(self.backends):
            try:
                upstream = socket.create_connection(backend, timeout=1)
            except OSError:
                continue
            upstream.settimeout(None)
            threading.Thread(target=_pipe, args=(upstream, client), daemon=True).start()
            _pipe(client, upstream)
            return
        client.close()

    def close(self) -> None:
        self._stop = True
        self._sock.close()


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()


@pytest.fixture
def cluster(tmp_path: Path, postgres_schema: tuple[str, str]) -> Iterator[dict[str, Any]]:
    """A shared data directory (token, policies, local cloud), a schema, a balancer."""
    url, schema = postgres_schema
    sep = "&" if "?" in url else "?"
    database_url = f"{url}{sep}options=-csearch_path%3D{schema}"
    data = tmp_path / "data"
    (data / "policies").mkdir(parents=True)
    (data / "policies" / "local-eu.yaml").write_text(POLICY)
    balancer = Balancer()
    replicas: list[DaemonProcess] = []
    out = {
        "data": data,
        "url": database_url,
        "schema": schema,
        "balancer": balancer,
        "replicas": replicas,
        "store": Store(url, schema=schema),
    }
    try:
        yield out
    finally:
        for replica in replicas:
            replica.stop()
        for record in StateDir(data / "local-cloud").all():
            if not record.ended:
                power_off(record)
        balancer.close()
        out["store"].close()


def add_replica(cluster: dict[str, Any], **env: str) -> DaemonProcess:
    env = {
        "GPUOPT_API__PUBLIC_URL": cluster["balancer"].url,
        "GPUOPT_LOOPS__RECONCILE_S": "0.5",
        "GPUOPT_PROVIDERS__LOCAL__SPOT_INTERVAL_S": "3600",
        **env,
    }
    log = cluster["data"].parent / f"replica-{len(cluster['replicas'])}.log"
    replica = DaemonProcess(
        cluster["data"], env={"GPUOPT_DATABASE_URL": cluster["url"], **env}, log=log
    )
    cluster["replicas"].append(replica)
    cluster["balancer"].backends.append(("127.0.0.1", replica.port))
    return replica


def submit(replica: DaemonProcess, name: str, ckpt: Path) -> int:
    body = {
        "name": name,
        "policy": "local-eu",
        "workdir": str(ROOT),
        "run": (
            f"{sys.executable} examples/train_with_checkpoints.py --engine numpy --steps 100000 "
            "--checkpoint-every 50 --step-sleep 0.02 --log-every 1000"
        ),
        "checkpoint_dir": str(ckpt),
        "probes": "none",
    }
    with replica.client() as client:
        response = client.post("/jobs", json=body)
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


def job_state(replica: DaemonProcess, name: str) -> str:
    with replica.client() as client:
        return str(client.get(f"/jobs/{name}").json()["state"])


def launches(cluster: dict[str, Any], job_id: int) -> list[str]:
    """Instances the local cloud started for the job (its records, ended ones included)."""
    return sorted(
        r.key
        for r in StateDir(cluster["data"] / "local-cloud").all()
        if r.key.startswith(f"{job_id}-")
    )


def wait_running(cluster: dict[str, Any], replica: DaemonProcess, name: str, job_id: int) -> None:
    """Wait for the job to run; on a timeout, fail with what the job and the cloud show."""
    try:
        wait_until(lambda: job_state(replica, name) == "running", timeout=60, what="the job")
    except AssertionError:
        with replica.client() as client:
            job = client.get(f"/jobs/{name}").json()
            events = [e["message"] for e in client.get("/events").json()["events"]]
        attempts = cluster["store"].jobs.attempts(job_id)
        raise AssertionError(
            f"job {name} is {job['state']} ({job['reason']}); attempts {attempts}; "
            f"launches {launches(cluster, job_id)}; events {events}; log:\n"
            f"{replica.output()}"
        ) from None


def leaders(replicas: list[DaemonProcess]) -> list[DaemonProcess]:
    return [r for r in replicas if r.role() == "leader"]


@pytest.mark.postgres
@pytest.mark.slow
def test_two_daemons_one_leader_sigkill_takeover_no_double_launch(
    cluster: dict[str, Any], tmp_path: Path
) -> None:
    a = add_replica(cluster)
    wait_until(lambda: a.role() == "leader", timeout=30, what="the first daemon to lead")
    b = add_replica(cluster)
    wait_until(lambda: b.role() == "follower", timeout=30, what="the second daemon to follow")
    assert leaders([a, b]) == [a]
    rows = {r.id: r.role for r in cluster["store"].replicas.seen()}
    assert sorted(rows.values()) == ["follower", "leader"]
    with b.client() as client:  # any replica lists them all, from the shared store
        listed = client.get("/replicas").json()
    leader_id = next(i for i, role in rows.items() if role == "leader")
    assert listed["leader"] == leader_id and listed["answered_by"] != leader_id
    assert [(r["role"], r["alive"]) for r in listed["replicas"]] == [
        ("leader", True),
        ("follower", True),
    ]
    assert listed["replicas"][1]["api_url"] == cluster["balancer"].url

    job_id = submit(b, "ha-job", tmp_path / "ckpt")  # through the follower
    wait_running(cluster, b, "ha-job", job_id)
    assert launches(cluster, job_id) == [f"{job_id}-1"]

    a.proc.kill()  # SIGKILL: no clean-up, the lock goes with the session
    killed_at = time.monotonic()
    wait_until(lambda: b.role() == "leader", timeout=TAKEOVER_LIMIT_S, what="the takeover")
    took = time.monotonic() - killed_at
    assert took < TAKEOVER_LIMIT_S

    # The new leader reconciles the running job several times and launches nothing.
    seen = b.reconcile_passes()
    wait_until(lambda: b.reconcile_passes() >= seen + 4, timeout=30, what="reconcile passes")
    assert job_state(b, "ha-job") == "running"
    assert launches(cluster, job_id) == [f"{job_id}-1"]
    with b.client() as client:
        assert client.get("/replicas").json()["leader"] == listed["answered_by"]
    assert [at.number for at in cluster["store"].jobs.attempts(job_id)] == [1]


@pytest.mark.postgres
@pytest.mark.slow
def test_a_launch_in_flight_when_the_leader_dies_is_not_repeated(
    cluster: dict[str, Any], tmp_path: Path
) -> None:
    # Slow ticks: only wake-ups (a submit, a takeover) run passes, so the timing is ours.
    slow = {"GPUOPT_LOOPS__RECONCILE_S": "600"}
    a = add_replica(cluster, **slow)
    wait_until(lambda: a.role() == "leader", timeout=30, what="the first daemon to lead")
    b = add_replica(cluster, **slow)
    wait_until(lambda: b.role() == "follower", timeout=30, what="the second daemon to follow")
    # The first launch call is throttled: the attempt is recorded, its key taken, no instance.
    cloud_state = StateDir(cluster["data"] / "local-cloud")
    add_fault(cloud_state, "*", "throttled", 1)

    job_id = submit(b, "inflight", tmp_path / "ckpt")  # the follower NOTIFYs the leader
    attempt = wait_until(
        lambda: next(iter(cluster["store"].jobs.attempts(job_id)), None),
        timeout=20,
        what="the leader to record the attempt (woken through NOTIFY)",
    )
    wait_until(
        lambda: not any(f["remaining"] for f in cloud_state.faults()),
        timeout=20,
        what="the leader's launch call (throttled)",
    )
    attempt = cluster["store"].jobs.attempts(job_id)[0]
    assert attempt.state == "launching" and attempt.instance_id is None
    a.proc.kill()
    killed_at = time.monotonic()
    wait_until(lambda: b.role() == "leader", timeout=TAKEOVER_LIMIT_S, what="the takeover")
    assert time.monotonic() - killed_at < TAKEOVER_LIMIT_S
    wait_running(cluster, b, "inflight", job_id)
    # The new leader retried the same attempt with the same key: one instance, one attempt.
    assert launches(cluster, job_id) == [f"{job_id}-1"]
    assert [at.key for at in cluster["store"].jobs.attempts(job_id)] == [attempt.key]


def test_a_second_sqlite_daemon_process_exits_with_a_clear_message(tmp_path: Path) -> None:
    data, command = tmp_path / "data", ("daemon", "--port", "0")
    first = start_gpuopt(data, *command)
    try:
        assert first.stdout is not None
        url = first.stdout.readline().split()[3]
        second = run_gpuopt(data, *command)
        assert second.returncode == 2
        assert second.stdout == ""
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1, second.stderr
        assert lines[0].startswith(f"gpuopt: error: another gpuopt daemon (pid {first.pid} on ")
        assert f"is already using the SQLite database {tmp_path / 'data' / 'gpuopt.db'}" in lines[0]
        assert httpx.get(f"{url}/healthz", timeout=5).json()["status"] == "ok"  # unharmed
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=30) == 0
        # Once the first has gone, the lock is free again.
        third = start_gpuopt(data, *command)
        assert third.stdout is not None
        assert third.stdout.readline().startswith("gpuopt: API at ")
        third.send_signal(signal.SIGTERM)
        assert third.wait(timeout=30) == 0
    finally:
        if first.poll() is None:
            first.kill()


def test_a_lone_sqlite_daemon_lists_itself_as_the_leader(tmp_path: Path) -> None:
    with running(make_config(tmp_path)) as daemon, api(daemon) as client:
        listed = client.get("/replicas").json()
        assert daemon.readiness()[1]["role"] == "leader"
    assert listed["leader"] == listed["answered_by"] == daemon.leadership.replica
    assert [(r["role"], r["pid"], r["alive"]) for r in listed["replicas"]] == [
        ("leader", os.getpid(), True)
    ]


def test_a_sqlite_migration_waits_for_the_daemon_and_the_daemon_for_a_migration(
    tmp_path: Path,
) -> None:
    from typer.testing import CliRunner

    from optimizer.cli import app

    url = f"sqlite:///{tmp_path / 'gpuopt.db'}"
    path = sqlite_lock_path(url)
    with Store(url) as db:
        db.create_all()
        daemon_lock = SqliteLock(db, path)
        daemon_lock.claim()
        try:
            refused = CliRunner().invoke(app, ["db", "upgrade"], env={"GPUOPT_DATABASE_URL": url})
        finally:
            daemon_lock.release()
        assert refused.exit_code == 2
        assert refused.stderr.strip().splitlines() == [
            f"gpuopt: error: another gpuopt daemon (pid {os.getpid()} on "
            f"{socket.gethostname()}, since {_holder_since(path)}) is using the SQLite "
            f"database {tmp_path / 'gpuopt.db'}; stop it before migrating"
        ]

        migration = SqliteLock(db, path, purpose="db upgrade")
        migration.claim()
        try:
            with pytest.raises(DaemonError, match=r"^gpuopt db upgrade \(pid \d+ on .*"):
                SqliteLock(db, path).claim()
        finally:
            migration.release()
        again = SqliteLock(db, path)
        again.claim()  # free again: a daemon may start
        again.release()


def _holder_since(path: Path | None) -> str:
    import json

    assert path is not None
    return str(json.loads(path.read_text())["since"])
