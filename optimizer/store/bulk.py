"""Price history in bulk, as columns, across both tiers: what a backtest replays.

A month of history is millions of points, so each tier is read with one statement over the
whole table (no ORDER BY: the database would sort millions of rows; the points are put in
order here, in numpy), and the points go straight into arrays:

- SQLite: the driver's rows in large batches, each batch into one numpy record array. The
  pool comes back as the `latest_price` row's id (a join on a 3,000-row index, cheaper than
  five strings per row), the time as whole epoch seconds.
- PostgreSQL: `COPY (SELECT …) TO STDOUT` in the binary format, whose records of four
  fixed-width fields numpy decodes 32 MiB at a time: no Python object per field (the driver
  still hands over each row's bytes apart, as libpq receives COPY data a row at a time).

Both tiers are read in one snapshot of the store (a read transaction), so an hour the
retention pass folds meanwhile is seen once, in one tier or the other.

The two tiers read as the ledger reads them (`history.points_in_effect`): raw points where they
are kept, and each hourly row as one point at the start of its hour, at its median. Where an
hourly row and a raw point of one pool fall on the same instant, the raw point comes after it
(and so is the one in effect); raw points of one pool and instant keep the order they were
written in (their id).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import Connection, select, text

from optimizer.model import OFFER_FIELDS, Offer
from optimizer.store.engine import StoreError, table
from optimizer.store.tables import POOL_COLUMNS, LatestPrice, PriceHistory, PriceHourly

_LATEST = table(LatestPrice)
_RAW = table(PriceHistory)
_HOURLY = table(PriceHourly)
_STORED = tuple(name for name in OFFER_FIELDS if name in LatestPrice.model_fields)

BATCH_ROWS = 65_536  # rows per fetch from SQLite
COPY_BYTES = 32 << 20  # bytes of COPY data decoded at once on PostgreSQL

# One point as read (POINT): the pool's latest_price id, epoch seconds, USD/h, the row's own id.
POINT = np.dtype([("pool", "<i8"), ("at", "<i8"), ("usd", "<f8"), ("seq", "<i8")])
# The same as a record of PostgreSQL's binary COPY format: a 16-bit field count, then each
# field's 32-bit length and its bytes, all big-endian
# (https://www.postgresql.org/docs/current/sql-copy.html, "Binary Format").
_COPY_RECORD = np.dtype(
    [
        ("fields", ">i2"),
        ("n_pool", ">i4"),
        ("pool", ">i8"),
        ("n_at", ">i4"),
        ("at", ">i8"),
        ("n_usd", ">i4"),
        ("usd", ">f8"),
        ("n_seq", ">i4"),
        ("seq", ">i8"),
    ]
)
_COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
_COPY_TRAILER = b"\xff\xff"


@dataclass(frozen=True, slots=True)
class PriceColumns:
    """Points of the pools the store lists: `pool[i]` (a row of `offers`) cost
    `usd_per_hour[i]` from `at[i]` (epoch seconds). Every pool in `offers` has a point; its
    offer is its latest (for its hardware). Points are in time order, ties as the module
    docstring says; `hourly` of them stand for an hour's summary."""

    offers: list[Offer]
    pool: np.ndarray  # int64
    at: np.ndarray  # int64
    usd_per_hour: np.ndarray  # float64
    hourly: int


def _offer(row: Any) -> Offer:
    values = row._mapping
    fields = {name: values[name] for name in _STORED}
    fields["zone"] = fields["zone"] or None
    return Offer(**fields)


_FIRST = datetime(1, 1, 1, tzinfo=UTC)  # bounds the drivers can send, for no bound
_LAST = datetime(9999, 12, 31, tzinfo=UTC)


def _whole_seconds(at: datetime) -> datetime:
    return at.replace(microsecond=0)


def _statement(dialect: str, tier: Any, time: str, usd: str) -> str:
    """One tier's points joined to their pool's latest row, times within the bounds."""
    on = " AND ".join(f"lp.{name} = t.{name}" for name in POOL_COLUMNS)
    if dialect == "sqlite":
        epoch = (
            f"unixepoch(t.{time})"  # SQLite 3.38+
            if sqlite3.sqlite_version_info >= (3, 38)
            else f"CAST(strftime('%s', t.{time}) AS INTEGER)"
        )
        # CROSS JOIN keeps the tier's table as the outer loop: one scan of it, and a lookup
        # in latest_price's small pool index per row (the other way round, every point is a
        # random read of the big table).
        return (
            f"SELECT lp.id, {epoch}, t.{usd}, t.id FROM {tier.name} AS t "
            f"CROSS JOIN {_LATEST.name} AS lp ON {on} "
            f"WHERE t.{time} >= ? AND t.{time} < ?"
        )
    return (
        f"SELECT lp.id::bigint, floor(extract(epoch FROM t.{time}))::bigint, "
        f"t.{usd}::float8, t.id::bigint FROM {tier.name} AS t JOIN {_LATEST.name} AS lp "
        f"ON {on} WHERE t.{time} >= %s AND t.{time} < %s"
    )


def _read_sqlite(conn: Connection, sql: str, bounds: tuple[datetime, datetime]) -> np.ndarray:
    process = _RAW.c.observed_at.type.bind_processor(conn.dialect)
    params = tuple(process(b) if process else b for b in bounds)
    raw: Any = conn.connection.driver_connection  # sqlite3's own connection
    cursor = raw.cursor()
    try:
        cursor.execute(sql, params)
        parts = []
        while batch := cursor.fetchmany(BATCH_ROWS):
            parts.append(np.fromiter(batch, dtype=POINT, count=len(batch)))
    finally:
        cursor.close()
    return np.concatenate(parts) if parts else np.empty(0, dtype=POINT)


def _decode_copy(data: bytes | bytearray | memoryview, count: int) -> np.ndarray:
    records = np.frombuffer(data, dtype=_COPY_RECORD, count=count)
    widths = ("n_pool", "n_at", "n_usd", "n_seq")
    if (records["fields"] != 4).any() or any((records[w] != 8).any() for w in widths):
        raise StoreError("price history COPY: a record of unexpected shape")
    out = np.empty(count, dtype=POINT)
    for name in ("pool", "at", "usd", "seq"):
        out[name] = records[name]
    return out


def _read_copy(conn: Connection, sql: str, bounds: tuple[datetime, datetime]) -> np.ndarray:
    raw: Any = conn.connection.driver_connection  # psycopg's own connection
    size = _COPY_RECORD.itemsize
    parts: list[np.ndarray] = []
    held = bytearray()
    start = -1  # where records begin in `held`, once the header is read
    with (
        raw.cursor() as cursor,
        cursor.copy(f"COPY ({sql}) TO STDOUT (FORMAT BINARY)", bounds) as copy,
    ):
        for chunk in copy:
            held += chunk
            if start < 0:
                if len(held) < len(_COPY_SIGNATURE) + 8:
                    continue
                if not held.startswith(_COPY_SIGNATURE):
                    raise StoreError("price history COPY: not PostgreSQL's binary format")
                extension = int.from_bytes(held[15:19], "big")
                start = 19 + extension
            if len(held) - start >= COPY_BYTES:
                count = (len(held) - start) // size
                with memoryview(held) as view:  # released before `held` is cut
                    parts.append(_decode_copy(view[start : start + count * size], count))
                del held[: start + count * size]
                start = 0
    body = held[max(start, 0) :]
    if start < 0 or not body.endswith(_COPY_TRAILER) or (len(body) - 2) % size:
        raise StoreError("price history COPY: the data ended early")
    count = (len(body) - 2) // size
    parts.append(_decode_copy(body, count))
    return np.concatenate(parts)


def in_time_order(found: np.ndarray) -> np.ndarray:
    """Points (`POINT` records) in time order; within one instant, in id order (the order
    they were written in: of two points of one pool and instant, the later counts)."""
    at, seq = found["at"], found["seq"]
    if bool(np.all((at[1:] > at[:-1]) | ((at[1:] == at[:-1]) & (seq[1:] > seq[:-1])))):
        return found
    first, span, top = int(at.min()), int(at.max() - at.min()) + 1, int(seq.max()) + 1
    if span * top < 1 << 62:  # one key: a single sort, fast on the long sorted runs
        order = np.argsort((at - first) * top + seq, kind="stable")
    else:
        order = np.lexsort((seq, at))
    return found[order]


def _tier(
    conn: Connection, tier: Any, time: str, usd: str, bounds: tuple[datetime, datetime]
) -> np.ndarray:
    """One tier's points, in time order."""
    sql = _statement(conn.dialect.name, tier, time, usd)
    found = (_read_sqlite if conn.dialect.name == "sqlite" else _read_copy)(conn, sql, bounds)
    return in_time_order(found)


def _pools(found: np.ndarray, lookup: np.ndarray) -> np.ndarray:
    """Points whose pool is in `lookup` (latest_price id -> row), their pool made the row."""
    pool = np.full(len(found), -1, dtype=np.int64)
    listed = found["pool"] < len(lookup)  # a pool listed after latest_price was read: left out
    pool[listed] = lookup[found["pool"][listed]]
    keep = pool >= 0
    found = found if keep.all() else found[keep]
    found["pool"] = pool[keep]
    return found


def _one_snapshot(conn: Connection) -> None:
    """Make the reads that follow on `conn` (a connection with no transaction yet) see one
    snapshot of the store: the retention pass may fold an hour from raw points into its
    hourly row between reading one tier and the other, which would lose that hour. The
    transaction ends with the connection (rolled back: nothing was written)."""
    if conn.dialect.name == "sqlite":
        # sqlite3 opens no transaction for reads; in WAL mode one BEGIN holds a snapshot.
        raw: Any = conn.connection.driver_connection
        if not raw.in_transaction:
            raw.execute("BEGIN")
    else:
        conn.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"))


def price_columns(conn: Connection, since: datetime | None, until: datetime | None) -> PriceColumns:
    """Every point with since <= at <= until (to the whole second) of the pools `latest_price`
    lists, across both tiers (module docstring)."""
    low = _FIRST if since is None else _whole_seconds(since)
    high = _LAST if until is None else _whole_seconds(until) + timedelta(seconds=1)
    _one_snapshot(conn)
    rows = conn.execute(select(_LATEST)).all()
    ids = np.array([row.id for row in rows], dtype=np.int64)
    lookup = np.full(int(ids.max(initial=0)) + 1, -1, dtype=np.int64)
    lookup[ids] = np.arange(len(ids))
    hourly = _pools(_tier(conn, _HOURLY, "hour", "median_usd", (low, high)), lookup)
    raw = _pools(_tier(conn, _RAW, "observed_at", "usd_per_hour", (low, high)), lookup)
    # Hourly rows first: an hour's row sorts before a raw point of the same instant.
    found = np.concatenate([hourly, raw])
    if len(hourly) and len(raw) and hourly["at"][-1] > raw["at"][0]:
        found = found[np.argsort(found["at"], kind="stable")]
    # Only the pools with a point, numbered in the order latest_price was read.
    present = np.bincount(found["pool"], minlength=len(rows)) > 0
    number = np.cumsum(present) - 1
    offers = [_offer(row) for row, used in zip(rows, present.tolist(), strict=True) if used]
    return PriceColumns(
        offers,
        number[found["pool"]],
        np.ascontiguousarray(found["at"]),
        np.ascontiguousarray(found["usd"]),
        len(hourly),
    )
