"""Price histories for `gpuopt backtest` and `gpuopt advise-bid`: a catalog CSV (or Arrow IPC,
or Parquet) with many `observed_at` per pool, or the store's price history, both tiers
(docs/backtest.md).

A history of months holds millions of points, so the CSV is read by Arrow's CSV reader into
columns, never into an Offer per row: one Offer per pool (its first row) carries the pool's
hardware. Where Arrow rejects a file, the catalog's own reader reads it again to say where and
why, as `FILE:LINE:COLUMN: FIELD: problem` (docs/catalog-format.md).
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np

from optimizer.catalog import OPTIONAL, REQUIRED, CatalogError, iter_offers, write_catalog
from optimizer.common.errors import Problem
from optimizer.common.times import EARLIEST_SECONDS, LATEST_SECONDS, SPAN
from optimizer.model import OFFER_FIELDS, Offer
from optimizer.store import Store
from optimizer.store.bulk import PriceColumns
from policies.backtest import History
from policies.table import OfferTable
from providers import registry

POOL = ("provider", "region", "zone", "instance_type", "market")
_TEXT = frozenset(POOL) | {"gpu_model", "interconnect", "source", "fabric", "interruption_bucket"}
PARQUET = ".parquet"  # a history in Parquet: the catalog's columns, one row per point
ARROW = (".arrow", ".feather")  # the same as an Arrow IPC file, read in place (memory-mapped)
CSV_BLOCK = 16 << 20  # bytes of CSV parsed at once: fewer, larger blocks cost less memory churn


def _comment_lines(path: Path) -> int:
    """Lines before the header: comments (`#`) and blank lines."""
    skipped = 0
    with path.open(encoding="utf-8") as stream:
        for line in stream:
            if line.strip() and not line.lstrip().startswith("#"):
                break
            skipped += 1
    return skipped


def _not_utf8(path: Path) -> CatalogError | None:
    """Where `path` first stops being UTF-8 text (its line, and the byte's column), if it does:
    binary data named .csv, or text in another encoding."""
    with path.open("rb") as stream:
        for number, raw in enumerate(stream, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                return CatalogError.at(
                    str(path),
                    f"not UTF-8 text (byte 0x{raw[exc.start]:02x}): a history is a UTF-8 "
                    "catalog CSV, a Parquet file (.parquet) or an Arrow IPC file (.arrow)",
                    line=number,
                    column=exc.start + 1,
                )
    return None


def _located(path: Path, exc: Exception) -> CatalogError:
    """For a CSV: the catalog reader's own error for the file, else a plain one naming it."""
    try:
        with path.open(encoding="utf-8", newline="") as stream:
            for _ in iter_offers(stream, path=str(path)):
                pass
    except CatalogError as located:
        return located
    except UnicodeDecodeError:
        return _not_utf8(path) or CatalogError([Problem(str(path), "not UTF-8 text")])
    except OSError as error:
        return CatalogError([Problem(str(path), f"cannot read: {error.strerror or error}")])
    return CatalogError([Problem(str(path), _first_line(exc))])


# Arrow's CSV errors, read with use_threads=False so they carry the row: "In CSV column #12:
# Row #3: CSV conversion error to timestamp[us, tz=UTC]: invalid value 'x'" and "CSV parse
# error: Row #5: Expected 21 columns, got 20: <the row>". Row numbers count the file's lines
# from 1 (skipped comment lines included); column numbers count from 0.
_ARROW_VALUE = re.compile(
    r"In CSV column #(?P<column>\d+): Row #(?P<row>\d+): CSV conversion error to "
    r"(?P<type>[^:]+): invalid value '(?P<value>.*)'",
    re.DOTALL,
)
_ARROW_ROW = re.compile(
    r"CSV parse error: Row #(?P<row>\d+): Expected (?P<want>\d+) columns, got (?P<got>\d+)"
)


def _arrow_located(file: Path, exc: Exception) -> CatalogError | None:
    """Arrow's CSV error as FILE:LINE:COLUMN with the column's name and what it should hold,
    without reading the file again (the catalog reader's pass is the fallback, and takes
    seconds on a large history); None where the message does not say the row."""
    text = _first_line(exc)
    value = _ARROW_VALUE.search(text)
    if value is not None:
        column = int(value["column"])
        header = _header(file)
        name = header[column] if column < len(header) else ""
        return CatalogError.at(
            str(file),
            f"{value['value']!r} is not {_WHAT.get(value['type'].split('[')[0], 'valid')}",
            line=int(value["row"]),
            column=column + 1,
            field=name,
        )
    row = _ARROW_ROW.search(text)
    if row is not None:
        said = f"expected {row['want']} values, found {row['got']}"  # the catalog reader's words
        return CatalogError.at(str(file), said, line=int(row["row"]))
    return None


_WHAT = {
    "timestamp": "a time (ISO 8601 with a UTC offset, e.g. 2026-04-23T00:00:00Z)",
    "int64": "a whole number",
    "double": "a number",
}


def _header(file: Path) -> list[str]:
    """The CSV's column names (the first line that is not a comment or blank)."""
    with file.open(encoding="utf-8", newline="") as stream:
        for line in stream:
            if line.strip() and not line.lstrip().startswith("#"):
                return next(csv.reader([line]))
    return []


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def column_types() -> dict[str, Any]:
    """Every catalog column's Arrow type, so a reader infers none: numbers as the Offer types
    them, the time in microseconds (gpuopt writes times with fractions of a second; `_check`
    floors them to whole seconds), and text dictionary-encoded as it is read (a month holds a
    few thousand distinct values in millions of rows)."""
    import pyarrow as pa

    text = pa.dictionary(pa.int32(), pa.string())
    types: dict[str, Any] = {}
    for name, declared in Offer.__dataclass_fields__.items():
        kind = str(declared.type).replace(" | None", "")
        if name == "observed_at":
            types[name] = pa.timestamp("us", tz="UTC")
        elif kind in ("int", "float"):
            types[name] = pa.int64() if kind == "int" else pa.float64()
        else:
            types[name] = text
    return types


def _read_table(file: Path, types: dict[str, Any]) -> Any:
    """The file's table with the catalog's column types (a pyarrow.Table); CatalogError
    naming the file (and for a CSV the line, for a typed file the column) when it cannot be
    read as a history."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    columnar = file.suffix == PARQUET or file.suffix in ARROW
    try:
        if file.suffix in ARROW:
            with pa.memory_map(str(file)) as source:
                table = pa.ipc.open_file(source).read_all()  # no copy: the file is mapped
        elif file.suffix == PARQUET:
            import pyarrow.parquet as pq

            strings = [n for n in pq.read_schema(file).names if n in _TEXT]
            table = pq.read_table(file, read_dictionary=strings)
        else:
            table = pcsv.read_csv(
                pa.memory_map(str(file)),
                read_options=pcsv.ReadOptions(
                    skip_rows=_comment_lines(file), use_threads=False, block_size=CSV_BLOCK
                ),
                convert_options=pcsv.ConvertOptions(column_types=types, strings_can_be_null=False),
            )
    except UnicodeDecodeError as exc:
        raise _located(file, exc) from None
    except OSError as exc:  # not readable (permissions), or pyarrow's I/O errors
        raise CatalogError.at(str(file), f"cannot read: {_first_line(exc)}") from None
    except pa.ArrowException as exc:
        if columnar:
            raise CatalogError.at(str(file), f"not a history: {_first_line(exc)}") from None
        raise _arrow_located(file, exc) or _located(file, exc) from None
    if columnar:
        table = _conform(file, table, types)
    return table


def _conform(file: Path, table: Any, types: dict[str, Any]) -> Any:
    """A Parquet or Arrow table cast column by column to the catalog's types; a column that
    will not cast is named with what it should hold. A dictionary-encoded hardware column
    (as `history_table` writes them) has only its dictionary cast: those columns are read
    from each pool's first row alone, so the rows need no decoding."""
    import pyarrow as pa

    columns = {}
    for name in table.column_names:
        column = table.column(name)
        wanted = types.get(name)
        if wanted is not None and column.type != wanted:
            try:
                if (
                    pa.types.is_dictionary(column.type)
                    and not pa.types.is_dictionary(wanted)
                    and name not in _PER_ROW
                ):
                    column = pa.chunked_array(
                        [
                            pa.DictionaryArray.from_arrays(
                                chunk.indices, chunk.dictionary.cast(wanted)
                            )
                            for chunk in column.chunks
                        ],
                        pa.dictionary(column.type.index_type, wanted),
                    )
                else:
                    column = column.cast(wanted)
            except pa.ArrowException as exc:
                raise CatalogError.at(
                    str(file),
                    f"a column of {column.type} cannot be read as {_WANTED.get(name, wanted)}: "
                    f"{_first_line(exc)}",
                    field=name,
                ) from None
        columns[name] = column
    return pa.table(columns)


# The columns read row by row (the others only at each pool's first row).
_PER_ROW = frozenset({"observed_at", "usd_per_hour"})
# What a column holds, said for people (the others are text).
_WANTED = {"observed_at": "a time (timestamp)", "usd_per_hour": "a number"}


def _row_problem(file: Path, row: int, field: str, message: str) -> CatalogError:
    """A typed file's bad value: its row (from 1) and column; for a CSV the catalog reader
    says the line."""
    if file.suffix == PARQUET or file.suffix in ARROW:
        return CatalogError.at(str(file), f"row {row + 1}: {message}", field=field)
    return _located(file, ValueError(f"{field}: row {row + 1}: {message}"))


def _check(file: Path, table: Any) -> tuple[np.ndarray, np.ndarray]:
    """The columns a history needs, a time for every row inside the span gpuopt reads, and a
    finite, non-negative price for every row; CatalogError at the first row that breaks one.
    Returns the times (epoch seconds) and prices."""
    import pyarrow.compute as pc

    names = set(table.column_names)
    missing = sorted(REQUIRED - names)
    unknown = sorted(names - set(OFFER_FIELDS))
    if missing or unknown:
        if file.suffix == PARQUET or file.suffix in ARROW:
            said = [f"lacks required column(s): {', '.join(missing)}"] if missing else []
            said += [f"has unknown column(s): {', '.join(unknown)}"] if unknown else []
            raise CatalogError.at(str(file), "; ".join(said))
        raise _located(file, ValueError(f"columns: missing {missing}, unknown {unknown}"))
    if table.num_rows == 0:
        raise CatalogError([Problem(str(file), "no price points")])
    times = table.column("observed_at")
    if times.null_count:
        row = int(np.flatnonzero(pc.is_null(times).to_numpy(zero_copy_only=False))[0])
        raise _row_problem(file, row, "observed_at", "missing value")
    at = np.floor_divide(times.cast("int64").to_numpy(), 1_000_000)  # microseconds
    outside = (at < EARLIEST_SECONDS) | (at >= LATEST_SECONDS)
    if outside.any():
        row = int(np.flatnonzero(outside)[0])
        raise _row_problem(file, row, "observed_at", f"a time not {SPAN}")
    price = table.column("usd_per_hour").to_numpy().astype(np.float64, copy=False)
    bad = ~np.isfinite(price) | (price < 0)  # a null reads as NaN
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise _row_problem(file, row, "usd_per_hour", "not a finite number >= 0")
    return at, price


def read_history(path: str | Path) -> History:
    """A history file's points (module docstring); CatalogError naming the file, and the line,
    row or column where known, when it is not a history."""
    import pyarrow as pa
    import pyarrow.compute as pc

    file = Path(path)
    if not file.is_file():
        raise CatalogError([Problem(str(file), "no such file")])
    table = _read_table(file, column_types())
    at, price = _check(file, table)
    names = set(table.column_names)
    key = np.zeros(table.num_rows, dtype=np.int64)
    width = 1
    # One dictionary per pool column across chunks (only these: the hardware columns are
    # read from each pool's first row alone). A column left out (zone) is one value.
    pooled = table.select([name for name in POOL if name in names])
    for column in pooled.unify_dictionaries().columns:
        if not pa.types.is_dictionary(column.type):
            column = pc.dictionary_encode(column)
        encoded = column.combine_chunks()
        size = len(encoded.dictionary) + 1  # the last code: null (a zone not known)
        if width * size >= 1 << 40:  # keep the packed key small: number what is seen so far
            key, _ = _dense_ids(key)
            width = int(key.max()) + 1
        np.multiply(key, size, out=key)
        codes = encoded.indices
        if codes.null_count:
            codes = pc.fill_null(codes, size - 1)
        np.add(key, codes.to_numpy(zero_copy_only=False), out=key)
        width *= size
    pool, first = _dense_ids(key)
    columns = [c for c in OFFER_FIELDS if c in names]
    picked = pa.array(first)
    rows = pa.table({c: table.column(c).take(picked) for c in columns})
    offers = []
    for row, values in zip(first.tolist(), rows.to_pylist(), strict=True):
        try:
            for name, default in OPTIONAL.items():
                if values.get(name) in ("", None):
                    values[name] = default
            if values["fabric"] is None or values["fabric_interfaces"] is None:
                facts = registry.get(values["provider"]).hardware_facts()
                spec = facts.fabric(values["instance_type"])
                values["fabric"] = values["fabric"] or spec.fabric
                if values["fabric_interfaces"] is None:
                    values["fabric_interfaces"] = spec.interfaces
            offers.append(Offer(**values))
        except (TypeError, ValueError, AttributeError, KeyError) as exc:
            raise _row_problem(file, row, _field_of(exc), _first_line(exc)) from None
    return History(OfferTable.from_offers(offers), pool, at, price)


def _field_of(exc: BaseException) -> str:
    """The Offer field an OfferError names first (`gpu_count must be ...`), if any."""
    word = str(exc).split(" ", 1)[0]
    return word if word in OFFER_FIELDS else ""


def _dense_ids(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(id per row, first row of each id) for the distinct values of `key`, ids in key order.
    Keys are packed dictionary codes, so a table as long as the largest key beats a sort of
    millions of rows; past 64 Mi keys, numpy's unique sorts instead."""
    n = len(key)
    top = int(key.max()) + 1
    if top <= 1 << 26:
        present = np.zeros(top, dtype=bool)
        present[key] = True
        distinct = np.flatnonzero(present)
        ids = np.empty(top, dtype=np.int64)
        ids[distinct] = np.arange(len(distinct))
        pool = ids[key]
        first = np.full(len(distinct), n, dtype=np.int64)
        np.minimum.at(first, pool, np.arange(n, dtype=np.int64))
        return pool, first
    _, first, pool = np.unique(key, return_index=True, return_inverse=True)
    return pool.reshape(-1), first


def store_history(
    store: Store, since: datetime | None = None, until: datetime | None = None
) -> History:
    """The store's price history from `since` to `until` across both tiers (raw points, and
    each hourly summary as its median from the hour's start), each pool's hardware from its
    latest offer; a pool the store no longer lists is left out."""
    return columns_history(store.prices.history_columns(since, until))


def columns_history(found: PriceColumns) -> History:
    """The store's columns as a History."""
    return History(OfferTable.from_offers(found.offers), found.pool, found.at, found.usd_per_hour)


def history_table(history: History) -> Any:
    """The points as an Arrow table with the catalog's columns (a pyarrow.Table): every
    column but the price and the time dictionary-encoded, from the pools' own values."""
    import pyarrow as pa
    import pyarrow.compute as pc

    pools = history.pools.offers
    pool = pa.array(history.pool.astype(np.int32))
    columns: dict[str, Any] = {}
    for name in OFFER_FIELDS:
        if name == "usd_per_hour":
            columns[name] = pa.array(history.usd_per_hour)
        elif name == "observed_at":
            columns[name] = pa.array(history.at, pa.int64()).cast(pa.timestamp("s", tz="UTC"))
        else:
            values = [getattr(o, name) for o in pools]
            values = [v.value if isinstance(v, Enum) else v for v in values]
            if all(v is None for v in values) and name in OPTIONAL:
                continue  # a column left out reads as not known
            encoded = pc.dictionary_encode(pa.array(values))
            indices = pc.take(encoded.indices, pool)  # a pool's null stays null
            columns[name] = pa.DictionaryArray.from_arrays(indices, encoded.dictionary)
    return pa.table(columns)


def write_history(history: History, path: str | Path, *, comment: str = "") -> int:
    """Write the points to `path`: Arrow IPC (.arrow, .feather), Parquet (.parquet), else a
    catalog CSV. Returns how many points were written."""
    file = Path(path)
    if file.suffix in ARROW or file.suffix == PARQUET:
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = history_table(history)
        if file.suffix == PARQUET:
            pq.write_table(table, file)
        else:
            with pa.OSFile(str(file), "wb") as sink, pa.ipc.new_file(sink, table.schema) as out:
                out.write_table(table)
        return int(table.num_rows)
    with file.open("w", encoding="utf-8", newline="") as stream:
        return write_catalog(history_offers(history), stream, comments=[comment] if comment else [])


def history_offers(history: History) -> Iterator[Offer]:
    """Every point as an Offer (the pool's hardware at the point's price and time), oldest
    first: what `gpuopt prices export` writes."""
    from dataclasses import replace

    from policies.backtest import instant

    offers = history.pools.offers
    for i in np.argsort(history.at, kind="stable").tolist():
        yield replace(
            offers[int(history.pool[i])],
            usd_per_hour=float(history.usd_per_hour[i]),
            observed_at=instant(int(history.at[i])),
        )
