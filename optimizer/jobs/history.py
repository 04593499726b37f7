"""Price histories for `gpuopt backtest` and `gpuopt advise-bid`: a catalog CSV with many
`observed_at` per pool, or the store's raw price points (docs/backtest.md).

A history of months holds millions of points, so the CSV is read by Arrow's CSV reader into
columns, never into an Offer per row: one Offer per pool (its first row) carries the pool's
hardware. Where Arrow rejects a file, the catalog's own reader reads it again to say where and
why, as `FILE:LINE:COLUMN: FIELD: problem` (docs/catalog-format.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import numpy as np

from optimizer import hardware
from optimizer.catalog import OPTIONAL, REQUIRED, CatalogError, iter_offers
from optimizer.common.errors import Problem
from optimizer.model import OFFER_FIELDS, Offer
from optimizer.store import Store
from policies.backtest import History, seconds
from policies.table import OfferTable

POOL = ("provider", "region", "zone", "instance_type", "market")
PARQUET = ".parquet"  # a history in Parquet: the catalog's columns, one row per point


def _comment_lines(path: Path) -> int:
    """Lines before the header: comments (`#`) and blank lines."""
    skipped = 0
    with path.open(encoding="utf-8") as stream:
        for line in stream:
            if line.strip() and not line.lstrip().startswith("#"):
                break
            skipped += 1
    return skipped


def _located(path: Path, exc: Exception) -> CatalogError:
    """The catalog reader's own error for the file, else a plain one naming it."""
    try:
        with path.open(encoding="utf-8", newline="") as stream:
            for _ in iter_offers(stream, path=str(path)):
                pass
    except CatalogError as located:
        return located
    return CatalogError([Problem(str(path), str(exc))])


def read_history(path: str | Path) -> History:
    """A catalog CSV's points as a History (module docstring); CatalogError when it is bad."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pcsv

    file = Path(path)
    if not file.is_file():
        raise CatalogError([Problem(str(file), "no such file")])
    types: dict[str, pa.DataType] = {
        "observed_at": pa.timestamp("s", tz="UTC"),
        "zone": pa.string(),
    }
    for name, declared in Offer.__dataclass_fields__.items():  # numbers as the Offer types them
        kind = str(declared.type).replace(" | None", "")
        if kind in ("int", "float"):
            types[name] = pa.int64() if kind == "int" else pa.float64()
    try:
        if file.suffix == PARQUET:
            import pyarrow.parquet as pq

            table = pq.read_table(file)
            table = table.cast(
                pa.schema([pa.field(f.name, types.get(f.name, f.type)) for f in table.schema])
            )
        else:
            table = pcsv.read_csv(
                file,
                read_options=pcsv.ReadOptions(skip_rows=_comment_lines(file), use_threads=False),
                convert_options=pcsv.ConvertOptions(
                    column_types=types, strings_can_be_null=False, auto_dict_encode=True
                ),
            )
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OSError) as exc:
        if file.suffix == PARQUET:
            raise CatalogError([Problem(str(file), f"not a history: {exc}")]) from None
        raise _located(file, exc) from None
    except UnicodeDecodeError as exc:
        raise _located(file, exc) from None
    table = table.unify_dictionaries()  # one dictionary per column across chunks
    names = set(table.column_names)
    missing = sorted(REQUIRED - names)
    unknown = sorted(names - set(OFFER_FIELDS))
    if missing or unknown:
        raise _located(file, ValueError(f"columns: missing {missing}, unknown {unknown}"))
    if table.num_rows == 0:
        raise CatalogError([Problem(str(file), "no price points")])
    price = table.column("usd_per_hour").to_numpy()
    if (
        table.column("observed_at").null_count
        or not np.all(np.isfinite(price))
        or (price < 0).any()
    ):
        raise _located(file, ValueError("a missing time or a bad price"))
    key = np.zeros(table.num_rows, dtype=np.int64)
    for name in POOL:
        column = table.column(name)
        if not pa.types.is_dictionary(column.type):
            column = pc.dictionary_encode(column)
        encoded = column.combine_chunks()
        size = max(len(encoded.dictionary), 1)
        key = key * size + encoded.indices.to_numpy(zero_copy_only=False)
    _, first, pool = np.unique(key, return_index=True, return_inverse=True)
    rows = table.take(pa.array(first))
    columns = [c for c in OFFER_FIELDS if c in names]
    offers = []
    try:
        for values in rows.select(columns).to_pylist():
            for name, default in OPTIONAL.items():
                if values.get(name) in ("", None):
                    values[name] = default
            if values["fabric"] is None or values["fabric_interfaces"] is None:
                spec = hardware.instance_fabric(values["provider"], values["instance_type"])
                values["fabric"] = values["fabric"] or spec.fabric
                if values["fabric_interfaces"] is None:
                    values["fabric_interfaces"] = spec.interfaces
            offers.append(Offer(**values))
    except (TypeError, ValueError) as exc:
        raise _located(file, exc) from None
    at = table.column("observed_at").cast(pa.int64()).to_numpy()
    return History(OfferTable.from_offers(offers), pool.reshape(-1), at, price)


def store_history(store: Store, since: datetime | None = None) -> History:
    """The store's raw price points since `since`, with each pool's hardware from its latest
    offer (a pool the store no longer lists is left out)."""
    offers = {o.pool: o for o in store.prices.latest_offers()}
    index: dict[tuple[object, ...], int] = {}
    first: list[Offer] = []
    pool: list[int] = []
    at: list[int] = []
    price: list[float] = []
    for key, observed, usd in store.prices.history_points(since):
        found = index.get(key)
        if found is None:
            offer = offers.get(key)
            if offer is None:
                continue
            found = index[key] = len(first)
            first.append(offer)
        pool.append(found)
        at.append(seconds(observed))
        price.append(usd)
    return History(
        OfferTable.from_offers(first),
        np.array(pool, dtype=np.int64),
        np.array(at, dtype=np.int64),
        np.array(price, dtype=np.float64),
    )


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
