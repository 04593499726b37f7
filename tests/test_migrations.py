"""Schema migrations on SQLite and PostgreSQL: head matches the table definitions, downgrades
work, databases made before migrations are recognised, the daemon refuses what it must not
touch, `gpuopt db` drives it all, and concurrent upgrades take turns."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, inspect, text
from sqlmodel import SQLModel
from typer.testing import CliRunner

from optimizer.cli import app
from optimizer.model import EventKind
from optimizer.store import Store, migrate, token_sha256
from optimizer.store.migrate import SchemaError, State
from tests.helpers import run_gpuopt, start_gpuopt

T0 = datetime(2026, 1, 15, 12, 0, tzinfo=UTC)
NEWER_TABLES = (
    "replica",
    "job_log",
    "cost_line",
    "price_hourly",
    "probe_result",
    "gpu_sample",
    "checkpoint",
    "checkpoint_restore",
    "attempt_progress",
)  # made after the baseline
OLD_TABLES = [t for name, t in SQLModel.metadata.tables.items() if name not in NEWER_TABLES]


@dataclass
class Database:
    """One empty test database: `url` alone reaches it (a PostgreSQL schema rides in the
    URL's libpq options, so the CLI and a daemon process find it too)."""

    url: str
    schema: str | None

    def open(self) -> Store:
        return Store(self.url)


@pytest.fixture(autouse=True)
def clean_env(daemon_env: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No GPUOPT_* setting from the shell reaches the CLI under test (daemon_env), and its data
    directory is the test's own."""
    monkeypatch.setenv("GPUOPT_DATA_DIR", str(tmp_path / "data"))


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Database:
    if request.param == "sqlite":
        return Database(f"sqlite:///{tmp_path / 'gpuopt.db'}", None)
    url, schema = request.getfixturevalue("postgres_schema")
    sep = "&" if "?" in url else "?"
    return Database(f"{url}{sep}options={quote(f'-csearch_path={schema}')}", schema)


@pytest.fixture
def store(database: Database) -> Iterator[Store]:
    """An empty database's store (no tables: the migrations make them)."""
    with database.open() as db:
        yield db


def schema_diff(engine: Engine) -> list[Any]:
    """What autogenerate would change to reach the table definitions ([] = nothing)."""

    def ours(name: str | None, kind: str, _parent: Any) -> bool:
        return not (kind == "table" and name == migrate.VERSION_TABLE)

    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn,
            opts={"compare_type": True, "compare_server_default": True, "include_name": ours},
        )
        return list(compare_metadata(context, SQLModel.metadata))


def catalog(engine: Engine) -> dict[str, Any]:
    """Every table's columns, keys, indexes and constraint names, as the engine reports them."""
    with engine.connect() as conn:
        found = inspect(conn)
        out: dict[str, Any] = {}
        for name in sorted(found.get_table_names()):
            if name == migrate.VERSION_TABLE:
                continue
            out[name] = {
                "columns": [
                    (c["name"], str(c["type"]), c["nullable"], c.get("default"))
                    for c in found.get_columns(name)
                ],
                "pk": found.get_pk_constraint(name),
                "fks": sorted(
                    (fk["name"] or "", tuple(fk["constrained_columns"]), fk["referred_table"])
                    for fk in found.get_foreign_keys(name)
                ),
                "indexes": sorted(
                    (i["name"] or "", tuple(i["column_names"]), i["unique"])
                    for i in found.get_indexes(name)
                ),
                "uniques": sorted(
                    (u["name"] or "", tuple(u["column_names"]))
                    for u in found.get_unique_constraints(name)
                ),
            }
        return out


def versions(engine: Engine) -> list[str] | None:
    """The alembic_version rows, or None when there is no such table."""
    with engine.connect() as conn:
        if not inspect(conn).has_table(migrate.VERSION_TABLE):
            return None
        return [r[0] for r in conn.execute(text("SELECT version_num FROM alembic_version"))]


def tables(engine: Engine) -> set[str]:
    with engine.connect() as conn:
        return set(inspect(conn).get_table_names())


def seed(db: Store) -> int:
    """A job and one of its events, through the store as any gpuopt would write them."""
    job = db.jobs.add_job("train", "small", {"run": "python train.py"}, at=T0)
    db.events.add_event("job_submitted", "submitted", job_id=job, at=T0)
    return job


def make_like_72238f0(db: Store) -> None:
    """What gpuopt made before migrations: create_all over its tables, no revision."""
    SQLModel.metadata.create_all(db.engine, tables=OLD_TABLES)
    drop_later_columns(db.engine)


def drop_later_columns(engine: Engine) -> None:
    """Take away what revisions after 0003 added to what create_all makes today."""
    with engine.begin() as conn:
        conn.execute(text("DROP INDEX ix_attempt_token_sha256"))
        conn.execute(text("ALTER TABLE job DROP COLUMN cancel_requested_at"))
        conn.execute(text("ALTER TABLE job DROP COLUMN removed_at"))
        for table in (
            *("attempt_progress", "checkpoint", "checkpoint_restore"),
            *("job_log", "cost_line", "price_hourly", "probe_result", "gpu_sample"),
        ):
            conn.execute(text(f"DROP TABLE IF EXISTS {table}"))
        for column in (
            *("launched_at", "terminated_at", "terminated_by", "disk_gib"),
            *("log_bytes", "log_dropped_bytes"),
            *("gang", "node_rank", "nodes", "address", "internode_status", "internode_reason"),
            *("placement_released_at", "spare", "promoted_at"),
        ):
            conn.execute(text(f"ALTER TABLE attempt DROP COLUMN {column}"))
        for column in ("fabric", "fabric_interfaces"):
            conn.execute(text(f"ALTER TABLE latest_price DROP COLUMN {column}"))


def indexes(engine: Engine, table: str) -> dict[str, tuple[tuple[str, ...], bool]]:
    """A table's indexes: name -> (columns, unique)."""
    with engine.connect() as conn:
        return {
            i["name"] or "": (tuple(c or "" for c in i["column_names"]), bool(i["unique"]))
            for i in inspect(conn).get_indexes(table)
        }


def cli(*args: str, url: str) -> Any:
    return CliRunner().invoke(app, ["db", *args], env={"GPUOPT_DATABASE_URL": url})


# -- head against the table definitions --------------------------------------------------------


HEAD = "0013"


def test_head_and_history_are_the_hand_written_revisions() -> None:
    assert migrate.head() == HEAD
    assert [r.id for r in migrate.history()] == [
        "0001",
        "0002",
        "0003",
        "0004",
        "0005",
        "0006",
        "0007",
        "0008",
        "0009",
        "0010",
        "0011",
        "0012",
        HEAD,
    ]


def test_the_head_read_from_the_scripts_text_is_alembics() -> None:
    # The daemon's start reads the head from the scripts' text, without Alembic.
    from optimizer.store import migrate_scripts

    assert migrate_scripts.head() == migrate_scripts._alembic_head() == HEAD


def test_the_recorded_revision_read_by_plain_sql_is_alembics(store: Store) -> None:
    from optimizer.store.migrate_scripts import recorded

    with store.engine.connect() as conn:
        assert recorded(conn) == MigrationContext.configure(conn).get_current_heads() == ()
    migrate.upgrade(store.engine)
    with store.engine.connect() as conn:
        assert recorded(conn) == MigrationContext.configure(conn).get_current_heads() == (HEAD,)


def test_migrations_to_head_make_exactly_the_table_definitions(store: Store) -> None:
    assert migrate.status(store.engine).state is State.EMPTY
    done = migrate.upgrade(store.engine)
    assert (done.found.state, done.revision) == (State.EMPTY, HEAD)
    assert schema_diff(store.engine) == []
    assert versions(store.engine) == [HEAD]
    assert migrate.status(store.engine).state is State.CURRENT


def test_create_all_makes_what_the_migrations_make(store: Store) -> None:
    migrate.upgrade(store.engine)
    migrated = catalog(store.engine)
    migrate.downgrade(store.engine, "base")
    assert tables(store.engine) <= {migrate.VERSION_TABLE}
    store.create_all()  # the fast path tests use: table definitions, stamped at head
    assert catalog(store.engine) == migrated
    assert versions(store.engine) == [HEAD]
    assert migrate.current(store.engine) == HEAD


def test_downgrade_to_base_and_upgrade_again(store: Store) -> None:
    migrate.upgrade(store.engine)
    back = migrate.downgrade(store.engine, "0001")
    assert (back.found.revision, back.revision) == (HEAD, "0001")
    assert "replica" not in tables(store.engine)
    assert {d[1].name for d in schema_diff(store.engine) if d[0] == "add_table"} == set(
        NEWER_TABLES
    )
    assert migrate.status(store.engine).state is State.OLDER

    migrate.downgrade(store.engine, "base")
    assert tables(store.engine) <= {migrate.VERSION_TABLE}
    assert migrate.status(store.engine).state is State.EMPTY

    migrate.upgrade(store.engine)
    assert schema_diff(store.engine) == []
    assert migrate.current(store.engine) == HEAD


def test_0003_renames_stored_event_kinds_and_the_downgrade_names_them_back(store: Store) -> None:
    migrate.upgrade(store.engine)
    migrate.downgrade(store.engine, "0002")
    job = seed(store)  # job_submitted, as gpuopt before 0003 spelled it
    for kind in ("price_drop", "job.state", "daemon.leader", "job.failed", "someone.else"):
        store.events.add_event(kind, "m", job_id=job, at=T0)

    migrate.upgrade(store.engine)
    renamed = ["job.submitted", "price.dropped", "job.state_changed", "leader.elected"]
    unchanged = ["job.failed", "someone.else"]  # already today's name, or not gpuopt's
    assert [e.kind for e in store.events.recent(job_id=job)] == renamed + unchanged
    assert {e.kind for e in store.events.recent(job_id=job)} - set(EventKind) == {"someone.else"}

    migrate.downgrade(store.engine, "0002")
    assert [e.kind for e in store.events.recent(job_id=job)] == [
        "job_submitted",
        "price_drop",
        "job.state",
        "daemon.leader",
        *unchanged,
    ]


def test_0004_adds_the_cancel_request_to_jobs_and_the_downgrade_drops_it(store: Store) -> None:
    migrate.upgrade(store.engine)
    migrate.downgrade(store.engine, "0003")
    assert "cancel_requested_at" not in columns(store.engine, "job")
    job = seed(store)

    migrate.upgrade(store.engine)
    assert "cancel_requested_at" in columns(store.engine, "job")
    found = store.jobs.get_job("train")
    assert found is not None and found.id == job and found.cancel_requested_at is None
    asked, recorded = store.jobs.request_cancel("train", at=T0)
    assert recorded and asked is not None and asked.cancel_requested_at == T0

    migrate.downgrade(store.engine, "0003")
    assert "cancel_requested_at" not in columns(store.engine, "job")
    with store.engine.connect() as conn:
        rows = conn.execute(text("SELECT id, name, state FROM job")).all()
    assert [tuple(r) for r in rows] == [(job, "train", "pending")]


def attempt_keys(engine: Engine) -> set[str]:
    """The attempts' keys, read as any revision has them (the store reads today's columns)."""
    with engine.connect() as conn:
        return set(conn.execute(text("SELECT idempotency_key FROM attempt")).scalars())


def columns(engine: Engine, table: str) -> set[str]:
    with engine.connect() as conn:
        return {c["name"] for c in inspect(conn).get_columns(table)}


def test_0005_adds_job_logs_and_removal_and_the_downgrade_drops_them(store: Store) -> None:
    migrate.upgrade(store.engine)
    migrate.downgrade(store.engine, "0004")
    assert "job_log" not in tables(store.engine)
    assert "removed_at" not in columns(store.engine, "job")
    job = seed(store)
    with store.engine.begin() as conn:  # an attempt as 0004 wrote it
        conn.execute(
            text(
                "INSERT INTO attempt (job_id, number, idempotency_key, provider, region, zone,"
                " instance_type, market, usd_per_hour, state, started_at, token_sha256,"
                " instance_gone, preempted) VALUES (:job, 1, 'train-1', 'local', 'r', '', 't',"
                " 'spot', 1.0, 'running', :at, '', false, false)"
            ),
            {"job": job, "at": T0},
        )

    migrate.upgrade(store.engine)
    assert "job_log" in tables(store.engine)
    assert {"seq", "stream", "text", "nbytes"} <= columns(store.engine, "job_log")
    found = store.jobs.get_job("train")
    assert found is not None and found.id == job and found.removed_at is None
    attempt = store.jobs.attempt("train-1")  # its output counts start at nothing
    assert attempt is not None and (attempt.log_bytes, attempt.log_dropped_bytes) == (0, 0)

    migrate.downgrade(store.engine, "0004")
    assert "job_log" not in tables(store.engine)
    assert "removed_at" not in columns(store.engine, "job")
    assert not {"log_bytes", "log_dropped_bytes"} & columns(store.engine, "attempt")
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT name FROM job")).scalars().all() == ["train"]


def test_0006_adds_the_cost_ledger_and_the_downgrade_drops_it(store: Store) -> None:
    migrate.upgrade(store.engine)
    migrate.downgrade(store.engine, "0005")
    assert not {"cost_line", "price_hourly"} & tables(store.engine)
    assert "launched_at" not in columns(store.engine, "attempt")
    seed(store)

    migrate.upgrade(store.engine)
    assert {"cost_line", "price_hourly"} <= tables(store.engine)
    added = {"launched_at", "terminated_at", "terminated_by", "disk_gib"}
    assert added <= columns(store.engine, "attempt")
    assert store.jobs.get_job("train") is not None

    migrate.downgrade(store.engine, "0005")
    assert not {"cost_line", "price_hourly"} & tables(store.engine)
    assert not added & columns(store.engine, "attempt")


def test_0007_adds_probe_results_and_gpu_samples_and_the_downgrade_drops_them(
    store: Store,
) -> None:
    migrate.upgrade(store.engine)
    migrate.downgrade(store.engine, "0006")
    assert not {"probe_result", "gpu_sample"} & tables(store.engine)
    seed(store)
    migrate.upgrade(store.engine)
    assert {"probe_result", "gpu_sample"} <= tables(store.engine)
    assert {"tflops", "copy_gbps", "status"} <= columns(store.engine, "probe_result")
    assert {"util_mean", "span_s", "xids"} <= columns(store.engine, "gpu_sample")
    migrate.downgrade(store.engine, "0006")
    assert not {"probe_result", "gpu_sample"} & tables(store.engine)
    assert store.jobs.get_job("train") is not None


def test_0008_adds_fabric_and_gangs_and_the_downgrade_drops_them(store: Store) -> None:
    migrate.upgrade(store.engine)
    migrate.downgrade(store.engine, "0007")
    gang = {"gang", "node_rank", "nodes", "address", "internode_status", "internode_reason"}
    assert not gang & columns(store.engine, "attempt")
    assert "fabric" not in columns(store.engine, "latest_price")
    job = seed(store)
    with store.engine.begin() as conn:  # an attempt as 0007 wrote it
        conn.execute(
            text(
                "INSERT INTO attempt (job_id, number, idempotency_key, provider, region, zone,"
                " instance_type, market, usd_per_hour, state, started_at, token_sha256,"
                " instance_gone, preempted, log_bytes, log_dropped_bytes) VALUES (:job, 1,"
                " 'train-1', 'local', 'r', '', 't', 'spot', 1.0, 'running', :at, '', false,"
                " false, 0, 0)"
            ),
            {"job": job, "at": T0},
        )

    migrate.upgrade(store.engine)
    assert gang <= columns(store.engine, "attempt")
    assert {"fabric", "fabric_interfaces"} <= columns(store.engine, "latest_price")
    attempt = store.jobs.attempt("train-1")  # a single node, as every attempt before
    assert attempt is not None
    assert (attempt.gang, attempt.node_rank, attempt.nodes) == (None, 0, 1)

    migrate.downgrade(store.engine, "0007")
    assert not gang & columns(store.engine, "attempt")
    assert not {"fabric", "fabric_interfaces"} & columns(store.engine, "latest_price")
    with store.engine.connect() as conn:
        keys = conn.execute(text("SELECT idempotency_key FROM attempt")).scalars().all()
    assert keys == ["train-1"]


def test_0009_adds_the_placement_release_time_and_the_downgrade_drops_it(store: Store) -> None:
    migrate.upgrade(store.engine)
    migrate.downgrade(store.engine, "0008")
    assert "placement_released_at" not in columns(store.engine, "attempt")
    job = seed(store)
    with store.engine.begin() as conn:  # a gang's node as 0008 wrote it
        conn.execute(
            text(
                "INSERT INTO attempt (job_id, number, idempotency_key, provider, region, zone,"
                " instance_type, market, usd_per_hour, state, started_at, token_sha256,"
                " instance_gone, preempted, log_bytes, log_dropped_bytes, gang, node_rank,"
                " nodes) VALUES (:job, 2, 'train-1-n1', 'aws', 'r', '', 't', 'spot', 1.0,"
                " 'ended', :at, '', true, false, 0, 0, 1, 1, 2)"
            ),
            {"job": job, "at": T0},
        )

    migrate.upgrade(store.engine)
    node = store.jobs.attempt("train-1-n1")  # its placement is not known deleted: None
    assert node is not None and node.placement_released_at is None
    assert [[a.key for a in rows] for rows in store.jobs.unreleased_gangs(["aws"])] == [
        ["train-1-n1"]
    ]

    migrate.downgrade(store.engine, "0008")
    assert "placement_released_at" not in columns(store.engine, "attempt")


def test_0010_indexes_the_agent_token_and_the_downgrade_drops_it(store: Store) -> None:
    migrate.upgrade(store.engine)
    migrate.downgrade(store.engine, "0009")
    assert "ix_attempt_token_sha256" not in indexes(store.engine, "attempt")
    job = seed(store)
    with store.engine.begin() as conn:  # an attempt as 0009 wrote it
        conn.execute(
            text(
                "INSERT INTO attempt (job_id, number, idempotency_key, provider, region, zone,"
                " instance_type, market, usd_per_hour, state, started_at, token_sha256,"
                " instance_gone, preempted, log_bytes, log_dropped_bytes, node_rank, nodes)"
                " VALUES (:job, 2, 'train-2', 'aws', 'r', '', 't', 'spot', 1.0, 'running', :at,"
                " :token, false, false, 0, 0, 0, 1)"
            ),
            {"job": job, "at": T0, "token": token_sha256("secret")},
        )

    migrate.upgrade(store.engine)
    assert indexes(store.engine, "attempt")["ix_attempt_token_sha256"] == (("token_sha256",), False)
    found = store.jobs.attempt_by_token(token_sha256("secret"))
    assert found is not None and found.key == "train-2"

    migrate.downgrade(store.engine, "0009")
    assert "ix_attempt_token_sha256" not in indexes(store.engine, "attempt")
    assert "train-2" in attempt_keys(store.engine)


def test_0011_adds_the_checkpoint_tables_and_the_downgrade_drops_them(store: Store) -> None:
    migrate.upgrade(store.engine)
    migrate.downgrade(store.engine, "0010")
    assert not {"checkpoint", "checkpoint_restore"} & tables(store.engine)
    job = seed(store)
    with store.engine.begin() as conn:  # an attempt as 0010 wrote it
        conn.execute(
            text(
                "INSERT INTO attempt (job_id, number, idempotency_key, provider, region, zone,"
                " instance_type, market, usd_per_hour, state, started_at, token_sha256,"
                " instance_gone, preempted, log_bytes, log_dropped_bytes, node_rank, nodes)"
                " VALUES (:job, 1, 'train-1', 'aws', 'us-east-1', '', 't', 'spot', 1.0,"
                " 'running', :at, '', false, false, 0, 0, 0, 1)"
            ),
            {"job": job, "at": T0},
        )

    migrate.upgrade(store.engine)
    assert {"checkpoint", "checkpoint_restore"} <= tables(store.engine)
    assert indexes(store.engine, "checkpoint")["ix_checkpoint_job"] == (
        ("job_id", "committed_at"),
        False,
    )
    attempt = store.jobs.attempt("train-1")
    assert attempt is not None
    assert store.checkpoints.add_checkpoint(
        job_id=job,
        attempt_id=attempt.id,
        name="step-000500",
        step=500,
        size_bytes=3 * 2**40,  # past 32 bits: a BIGINT
        files=4,
        uri="s3://team-ckpt/r/data/step-000500",
        provider="aws",
        region="us-east-1",
        committed_at=T0,
        upload_s=12.5,
        final=True,
    )
    [row] = store.checkpoints.checkpoints(job)
    assert (row.size_bytes, row.final, row.deleted_at) == (3 * 2**40, True, None)

    migrate.downgrade(store.engine, "0010")
    assert not {"checkpoint", "checkpoint_restore"} & tables(store.engine)
    assert "train-1" in attempt_keys(store.engine)


def test_0012_adds_attempt_progress_and_the_downgrade_drops_it(store: Store) -> None:
    migrate.upgrade(store.engine)
    migrate.downgrade(store.engine, "0011")
    assert "attempt_progress" not in tables(store.engine)
    job = seed(store)
    with store.engine.begin() as conn:  # an attempt as 0011 wrote it
        conn.execute(
            text(
                "INSERT INTO attempt (job_id, number, idempotency_key, provider, region, zone,"
                " instance_type, market, usd_per_hour, state, started_at, token_sha256,"
                " instance_gone, preempted, log_bytes, log_dropped_bytes, node_rank, nodes)"
                " VALUES (:job, 1, 'train-1', 'aws', 'us-east-1', '', 'g5.xlarge', 'spot', 1.0,"
                " 'running', :at, '', false, false, 0, 0, 0, 1)"
            ),
            {"job": job, "at": T0},
        )

    migrate.upgrade(store.engine)
    assert indexes(store.engine, "attempt_progress")["ix_attempt_progress_job"] == (
        ("job_id",),
        False,
    )
    attempt = store.jobs.attempt("train-1")
    assert attempt is not None
    big = 3 * 2**40  # past 32 bits: a BIGINT
    for step, minutes in ((big, 0), (big + 600, 30)):
        store.progress.record(
            job_id=job,
            attempt_id=attempt.id,
            instance_type="g5.xlarge",
            step=step,
            total=big * 2,
            at=T0 + timedelta(minutes=minutes),
        )
    [row] = store.progress.of_job(job)
    assert (row.first_step, row.step, row.total, row.reports) == (big, big + 600, big * 2, 2)

    migrate.downgrade(store.engine, "0011")
    assert "attempt_progress" not in tables(store.engine)
    assert "train-1" in attempt_keys(store.engine)


def test_0013_adds_the_warm_spare_columns_and_the_downgrade_drops_them(store: Store) -> None:
    migrate.upgrade(store.engine)
    migrate.downgrade(store.engine, "0012")
    assert {"spare", "promoted_at"}.isdisjoint(columns(store.engine, "attempt"))
    job = seed(store)
    with store.engine.begin() as conn:  # an attempt as 0012 wrote it
        conn.execute(
            text(
                "INSERT INTO attempt (job_id, number, idempotency_key, provider, region, zone,"
                " instance_type, market, usd_per_hour, state, started_at, token_sha256,"
                " instance_gone, preempted, log_bytes, log_dropped_bytes, node_rank, nodes)"
                " VALUES (:job, 1, 'train-1', 'aws', 'us-east-1', '', 'g5.xlarge', 'spot', 1.0,"
                " 'launched', :at, '', false, false, 0, 0, 0, 1)"
            ),
            {"job": job, "at": T0},
        )

    migrate.upgrade(store.engine)
    old = store.jobs.attempt("train-1")
    assert old is not None
    assert (old.spare, old.promoted_at, old.idle_spare) == (False, None, False)
    with store.engine.begin() as conn:  # a spare as 0013 writes it
        conn.execute(
            text(
                "INSERT INTO attempt (job_id, number, idempotency_key, provider, region, zone,"
                " instance_type, market, usd_per_hour, state, started_at, token_sha256,"
                " instance_gone, preempted, spare)"
                " VALUES (:job, 2, 'train-2', 'aws', 'us-east-1', 'b', 'g5.xlarge', 'spot', 1.0,"
                " 'launched', :at, '', false, false, true)"
            ),
            {"job": job, "at": T0},
        )
    spare = store.jobs.attempt("train-2")
    assert spare is not None and spare.idle_spare
    store.jobs.update_attempt("train-2", promoted_at=T0 + timedelta(minutes=5))
    promoted = store.jobs.attempt("train-2")
    assert promoted is not None
    assert (promoted.spare, promoted.promoted_at) == (True, T0 + timedelta(minutes=5))
    assert not promoted.idle_spare

    migrate.downgrade(store.engine, "0012")
    assert {"spare", "promoted_at"}.isdisjoint(columns(store.engine, "attempt"))
    assert attempt_keys(store.engine) == {"train-1", "train-2"}


def test_a_failed_migration_leaves_nothing_behind(store: Store) -> None:
    with store.engine.begin() as conn:  # a stranger's index takes the name 0002 needs
        conn.execute(text("CREATE TABLE squatter (x INTEGER)"))
        conn.execute(text("CREATE INDEX ix_replica_heartbeat_at ON squatter (x)"))
    with pytest.raises(SchemaError, match="the migration to 0013 failed and was rolled back"):
        migrate.upgrade(store.engine)
    assert tables(store.engine) - {migrate.VERSION_TABLE} == {"squatter"}
    assert not versions(store.engine)
    assert migrate.status(store.engine).state is State.EMPTY


# -- databases made before migrations --------------------------------------------------------


def test_an_unversioned_database_is_refused_then_upgraded_with_its_rows(store: Store) -> None:
    make_like_72238f0(store)
    job = seed(store)
    before = catalog(store.engine)

    found = migrate.status(store.engine)
    assert (found.state, found.revision) == (State.UNVERSIONED, None)
    with pytest.raises(SchemaError) as refused:
        migrate.ensure_ready(store.engine)
    assert str(refused.value) == (
        "the database has no schema revision (an earlier gpuopt made its tables), this gpuopt "
        "needs 0013: run gpuopt db upgrade"
    )
    assert catalog(store.engine) == before and versions(store.engine) is None

    done = migrate.upgrade(store.engine)
    assert (done.found.state, done.adopted, done.revision) == (State.UNVERSIONED, "0001", HEAD)
    assert migrate.ensure_ready(store.engine).state is State.CURRENT
    assert schema_diff(store.engine) == []
    assert store.jobs.get_job("train").id == job  # type: ignore[union-attr]
    assert [e.kind for e in store.events.recent(job_id=job)] == ["job.submitted"]  # renamed by 0003


def test_an_unversioned_database_with_the_replica_table_is_recognised_as_0002(
    store: Store,
) -> None:
    SQLModel.metadata.create_all(store.engine)  # what a3190c4 made
    drop_later_columns(store.engine)
    seed(store)
    done = migrate.upgrade(store.engine)
    assert (done.adopted, done.revision) == ("0002", HEAD)
    assert versions(store.engine) == [HEAD]
    assert store.jobs.get_job("train") is not None


def test_unversioned_tables_unlike_the_baseline_are_refused_untouched(store: Store) -> None:
    SQLModel.metadata.create_all(
        store.engine, tables=[t for t in OLD_TABLES if t.name != "poll_status"]
    )
    drop_later_columns(store.engine)
    with store.engine.begin() as conn:
        conn.execute(text("ALTER TABLE job ADD COLUMN owner VARCHAR"))
    before = catalog(store.engine)
    with pytest.raises(SchemaError) as refused:
        migrate.upgrade(store.engine)
    message = str(refused.value)
    assert "no table poll_status" in message and "job has unexpected owner" in message
    assert "\n" not in message
    assert catalog(store.engine) == before and versions(store.engine) is None


# -- older and newer revisions -----------------------------------------------------------------


def test_a_database_at_0001_is_refused_until_gpuopt_db_upgrade(database: Database) -> None:
    with database.open() as db:
        migrate.upgrade(db.engine)
        migrate.downgrade(db.engine, "0001")
        job = seed(db)
        with pytest.raises(SchemaError) as refused:
            migrate.ensure_ready(db.engine)
        assert str(refused.value) == (
            "the database is at revision 0001, this gpuopt needs 0013: run gpuopt db upgrade"
        )
        assert "replica" not in tables(db.engine)

    done = cli("upgrade", url=database.url)
    assert done.exit_code == 0, done.output
    assert done.stdout.endswith(": upgraded from 0001 to 0013\n")

    with database.open() as db:
        assert migrate.ensure_ready(db.engine).revision == HEAD
        assert db.jobs.get_job("train").id == job  # type: ignore[union-attr]
        assert schema_diff(db.engine) == []


def stamp_unknown(db: Store, revision: str = "0099") -> None:
    db.create_all()
    seed(db)
    with db.engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = :r"), {"r": revision})


def test_a_newer_database_is_refused_and_left_alone(store: Store) -> None:
    stamp_unknown(store)
    before = (catalog(store.engine), versions(store.engine))
    newer = (
        "the database was migrated by a newer gpuopt: revision 0099 is unknown to this version "
        "(head 0013); upgrade gpuopt"
    )
    for attempt in (migrate.ensure_ready, migrate.upgrade, Store.create_all):
        target = store if attempt is Store.create_all else store.engine
        with pytest.raises(SchemaError) as refused:
            attempt(target)  # type: ignore[operator]
        assert str(refused.value) == newer
    assert (catalog(store.engine), versions(store.engine)) == before
    assert migrate.status(store.engine).state is State.NEWER


def test_create_all_refuses_an_older_database(store: Store) -> None:
    migrate.upgrade(store.engine)
    migrate.downgrade(store.engine, "0001")
    with pytest.raises(SchemaError, match="run gpuopt db upgrade"):
        store.create_all()
    assert "replica" not in tables(store.engine)


def test_the_daemon_refuses_a_newer_database_in_one_line(
    database: Database, tmp_path: Path
) -> None:
    with database.open() as db:
        stamp_unknown(db)
        before = (catalog(db.engine), versions(db.engine))
    settings = {"GPUOPT_DATABASE_URL": database.url}
    done = run_gpuopt(tmp_path / "data", "daemon", "--port", "0", env=settings)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("gpuopt: error:")]
    assert errors == [
        "gpuopt: error: the database was migrated by a newer gpuopt: revision 0099 is unknown "
        "to this version (head 0013); upgrade gpuopt"
    ]
    assert "Traceback" not in done.stderr
    assert "gpuopt: API at" not in done.stdout
    with database.open() as db:
        assert (catalog(db.engine), versions(db.engine)) == before


def test_the_daemon_creates_an_empty_database_through_the_migrations(store: Store) -> None:
    assert migrate.ensure_ready(store.engine).state is State.CURRENT
    assert versions(store.engine) == [HEAD]
    assert schema_diff(store.engine) == []
    assert migrate.ensure_ready(store.engine).revision == HEAD  # and again: nothing to do


# -- the command line --------------------------------------------------------------------------


def test_db_current_says_revision_head_and_status(database: Database) -> None:
    empty = cli("current", url=database.url)
    assert empty.exit_code == 0, empty.output
    assert "revision  none\nhead      0013\nstatus    empty:" in empty.stdout

    created = cli("upgrade", url=database.url)
    assert created.stdout.endswith(": created at 0013\n")
    again = cli("upgrade", url=database.url)
    assert again.stdout.endswith(": already at 0013; nothing to do\n")

    shown = cli("current", "--json", url=database.url)
    assert json.loads(shown.stdout) == {
        "database": migrate.display_url(database.url),
        "revision": HEAD,
        "head": HEAD,
        "state": "current",
        "message": "the database is at 0013, the newest revision this gpuopt knows",
    }

    down = cli("downgrade", "0001", url=database.url)
    assert down.stdout.endswith(": downgraded from 0013 to 0001\n")
    older = cli("current", url=database.url)
    assert "status    older: the database is at revision 0001" in older.stdout


def test_db_current_does_not_create_a_missing_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "nowhere" / "gpuopt.db"
    shown = cli("current", url=f"sqlite:///{path}")
    assert shown.exit_code == 0, shown.output
    assert "status    empty:" in shown.stdout
    assert not path.parent.exists()


def test_db_commands_read_the_daemon_config_file(tmp_path: Path) -> None:
    config = tmp_path / "gpuopt.yaml"
    config.write_text(f"database_url: sqlite:///{tmp_path / 'from-config.db'}\n")
    done = CliRunner().invoke(app, ["db", "upgrade", "--config", str(config)])
    assert done.exit_code == 0, done.output
    assert (tmp_path / "from-config.db").is_file()


def test_db_history_lists_the_revisions_with_the_head_marked() -> None:
    shown = CliRunner().invoke(app, ["db", "history"])
    assert shown.exit_code == 0
    lines = shown.stdout.splitlines()
    assert [line.split()[0] for line in lines] == [
        "0001",
        "0002",
        "0003",
        "0004",
        "0005",
        "0006",
        "0007",
        "0008",
        "0009",
        "0010",
        "0011",
        "0012",
        HEAD,
    ]
    assert lines[-1].endswith("(head)") and not lines[0].endswith("(head)")


def test_db_downgrade_refuses_base_and_unknown_revisions(database: Database) -> None:
    cli("upgrade", url=database.url)
    base = cli("downgrade", "base", url=database.url)
    assert base.exit_code == 2
    assert base.stderr.startswith("gpuopt: error: downgrading to base would drop every table")
    unknown = cli("downgrade", "0042", url=database.url)
    assert unknown.exit_code == 2
    assert unknown.stderr == (
        "gpuopt: error: unknown revision '0042'; "
        "this gpuopt knows 0001, 0002, 0003, 0004, 0005, 0006, 0007, 0008, 0009, 0010, 0011, "
        "0012, 0013\n"
    )
    assert cli("current", "--json", url=database.url).stdout.count(f'"{HEAD}"') == 2


def test_an_unreachable_database_is_one_line_without_its_password() -> None:
    url = "postgresql://gpuopt:hunter2@127.0.0.1:1/gpuopt"
    for command in ("current", "upgrade"):
        done = cli(command, url=url)
        assert done.exit_code == 2
        assert done.stderr.startswith(
            "gpuopt: error: cannot reach the database "
            "postgresql+psycopg://gpuopt:***@127.0.0.1:1/gpuopt: "
        )
        assert done.stderr.count("\n") == 1
        assert "hunter2" not in done.output


@pytest.mark.postgres
def test_db_current_never_prints_the_password(postgres_schema: tuple[str, str]) -> None:
    url, schema = postgres_schema
    user, _, rest = url.partition("@")
    with_password = f"{user}:hunter2@{rest}?options={quote(f'-csearch_path={schema}')}"
    for command in (["current"], ["current", "--json"], ["upgrade"]):
        done = cli(*command, url=with_password)
        assert done.exit_code == 0, done.output
        assert "hunter2" not in done.output and ":***@" in done.stdout


# -- concurrency -------------------------------------------------------------------------------


def open_once(database: Database) -> None:
    """Connect once, so a new SQLite file is already in WAL mode: two first connections
    switching it at the same moment can see "database is locked", a race of the file's
    creation rather than of the migration under test."""
    with database.open() as db:
        assert migrate.status(db.engine).state is State.EMPTY


def test_concurrent_upgrades_take_turns(database: Database) -> None:
    """Two replicas running `gpuopt db upgrade` at once: both succeed, one migrates."""
    open_once(database)
    stores = [database.open() for _ in range(2)]
    barrier = threading.Barrier(len(stores))
    results: list[Any] = []

    def run(db: Store) -> Callable[[], None]:
        def go() -> None:
            barrier.wait()
            try:
                results.append(migrate.upgrade(db.engine))
            except Exception as exc:
                results.append(exc)

        return go

    threads = [threading.Thread(target=run(db)) for db in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    try:
        assert not [r for r in results if isinstance(r, Exception)], results
        assert sorted(r.found.state.value for r in results) == ["current", "empty"]
        assert versions(stores[0].engine) == [HEAD]
        assert schema_diff(stores[0].engine) == []
    finally:
        for db in stores:
            db.close()


def test_two_gpuopt_db_upgrade_processes_at_once(database: Database, tmp_path: Path) -> None:
    open_once(database)
    settings = {"GPUOPT_DATABASE_URL": database.url}
    procs = [start_gpuopt(tmp_path / "data", "db", "upgrade", env=settings) for _ in range(2)]
    outs = [proc.communicate(timeout=60) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outs
    said = sorted(out.rsplit(": ", 1)[-1] for out, _err in outs)
    assert said == ["already at 0013; nothing to do\n", "created at 0013\n"]
    with database.open() as db:
        assert versions(db.engine) == [HEAD]
