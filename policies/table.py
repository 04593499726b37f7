"""Offers as columns: what the ranking engine reads, built once per poll.

An `OfferTable` holds one numpy column per field of `optimizer.model.Offer`, read from the
dataclass's own field list, so a field added to the Offer gets its column without a change
here. Fields annotated `int` or `float` become number arrays; every other field (text, the
enums, times, optional values) is dictionary-encoded: an int32 code per row into a list of
the distinct values in first-seen order. A price list repeats a few hundred regions, types
and times across 100k rows, so the rules check each distinct value once and spread the
verdict with one indexing step (`Codes.lookup`).

Why numpy and not Arrow: measured on 100k offers (docs/policies.md, "The columnar engine"),
numpy's element-wise steps are 2 to 5 times faster than pyarrow.compute's on arrays this
size, where each call's fixed cost dominates, and the engine makes dozens of them per
evaluation; Arrow only won at dictionary-encoding Python strings, which the table uses it for
on the text columns built when first read. The columns every evaluation reads are built from
each row's shape, encoded once (`OfferTable.from_offers`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from functools import cache
from itertools import count
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from optimizer.model import (
    ROW_FIELDS,
    ROW_FORMAT,
    SHAPE_FIELDS,
    Fabric,
    Interconnect,
    Market,
    Offer,
    packed_rows,
)

if TYPE_CHECKING:
    import numpy as np
else:
    from optimizer.common.lazy import numpy as np

# Annotations (as written, `from __future__ import annotations`) that make a number column.
_NUMBER_TYPES = {"int": "int64", "float": "float64"}

# Text-typed Offer fields, by annotation: encoded by Arrow.
_TEXT_TYPES = frozenset({"str", "str | None"})

# Enum-typed Offer fields, by annotation: encoded by their values.
_ENUMS: dict[str, type[Enum]] = {"Market": Market, "Interconnect": Interconnect, "Fabric": Fabric}

__all__ = ["SHAPE_FIELDS", "Codes", "OfferTable"]

# The fields every evaluation reads, built with the table; the rest when first read.
EAGER = (*SHAPE_FIELDS, "usd_per_hour", "observed_at")

# An offer's packed row (optimizer.model.ROW_FORMAT) as numpy reads it.
_ROW_TYPES = list(zip(ROW_FIELDS, ("<i8", "<i8", "<f8"), strict=True))
assert ROW_FORMAT.format == "<qqd"  # the same three, as struct spells them


@dataclass(frozen=True, slots=True)
class Codes:
    """A dictionary-encoded column: `values[codes[i]]` is row i's value."""

    codes: np.ndarray  # int32, one per row
    values: tuple[Any, ...]  # distinct values, first-seen order

    def lookup(self, table: Sequence[Any] | np.ndarray, dtype: Any = None) -> np.ndarray:
        """Per-row values from a per-distinct-value `table` (one entry per `values`)."""
        return np.asarray(table, dtype=dtype)[self.codes]

    def map(self, fn: Callable[[Any], Any], dtype: Any = None) -> np.ndarray:
        """`fn` of each row's value, computed once per distinct value."""
        return self.lookup([fn(v) for v in self.values], dtype)

    def value_ranks(self, key: Callable[[Any], Any] | None = None) -> np.ndarray:
        """Per distinct value, an int64 that orders values as sorting them (by `key`) would;
        equal keys get equal ranks, so ties stay ties. Index it with `codes`."""
        keys = [(key or _same)(v) for v in self.values]
        order = sorted(range(len(keys)), key=keys.__getitem__)
        rank = np.empty(len(keys), dtype=np.int64)
        previous, current = None, -1
        for position, i in enumerate(order):
            if position == 0 or keys[i] != previous:
                current, previous = position, keys[i]
            rank[i] = current
        return rank

    def code_of(self, value: Any) -> int:
        """The code of `value`, or -1 where no row has it."""
        try:
            return self.values.index(value)
        except ValueError:
            return -1


def _same(value: Any) -> Any:
    return value


def _encode(column: Iterable[Any], size: int) -> Codes:
    """Dictionary-encode `size` values in one pass: a missing value takes the next code as
    it is first seen (the dict's default factory), so each row is hashed once and nothing
    per row outlives the pass (a list of 100k tuples kept alive wakes the garbage
    collector's full passes)."""
    index: defaultdict[Any, int] = defaultdict(count().__next__)
    codes = np.fromiter(map(index.__getitem__, column), dtype=np.int32, count=size)
    return Codes(codes, tuple(index))


def _first_seen(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(id per row, first row of each id) for the distinct int `keys`, ids numbered in the
    order of their first rows (as `_encode` numbers values). Runs of equal keys (the offers
    of one poll share its time) are grouped as one key each; keys from a narrow range (shape
    numbers) by a table as long as the range; others by a sort."""
    size = len(keys)
    if size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    if len(starts) * 2 <= size:
        ids, first = _first_seen(keys[starts])
        return np.repeat(ids, np.diff(starts, append=size)), starts[first]
    low = int(keys.min())
    span = int(keys.max()) - low + 1
    if span <= 4 * size:
        at = keys - low
        first_at = np.full(span, size, dtype=np.int64)
        np.minimum.at(first_at, at, np.arange(size, dtype=np.int64))
        present = np.flatnonzero(first_at < size)
        order = np.argsort(first_at[present])
        code = np.empty(span, dtype=np.int64)
        code[present[order]] = np.arange(len(order), dtype=np.int64)
        return code[at], first_at[present[order]]
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    order = np.argsort(first)
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    return rank[inverse.reshape(-1)], first[order].astype(np.int64)


# Rows from which a text column is encoded by Arrow. Its hash table is faster than a dict
# on long columns (a quarter at 100k rows, docs/policies.md) and no faster on the local
# cloud's 1,275 offers (0.17 against 0.18 ms for three columns), and importing it costs a
# daemon 40 MiB of memory (bench/daemon.py): a shorter column is encoded by a dict.
ARROW_FROM_ROWS = 20_000


def _encode_text(column: list[str | None]) -> Codes:
    """A text column through Arrow's hash table: a quarter faster than a dict at 100k rows
    (the one step where Arrow beat numpy and plain Python, docs/policies.md). A column
    shorter than ARROW_FROM_ROWS through a dict, with the same codes (first-seen order,
    None a value of its own)."""
    if len(column) < ARROW_FROM_ROWS:
        index = {value: code for code, value in enumerate(dict.fromkeys(column))}
        codes = np.fromiter(map(index.__getitem__, column), np.int32, len(column))
        return Codes(codes, tuple(index))
    import pyarrow as pa
    import pyarrow.compute as pc

    found = pc.dictionary_encode(pa.array(column, type=pa.string()), null_encoding="encode")
    codes = found.indices.to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
    return Codes(codes, tuple(found.dictionary.to_pylist()))


@cache
def _field_types() -> dict[str, str]:
    return {name: str(f.type) for name, f in Offer.__dataclass_fields__.items()}


@cache
def _shape_getter() -> Callable[[Offer], tuple[Any, ...]]:
    """A row's SHAPE_FIELDS as one tuple (the enums are `StrEnum`s: they hash as their text)."""
    return attrgetter(*SHAPE_FIELDS)


@dataclass(frozen=True, slots=True, eq=False)
class OfferTable:
    """Offers in columns, and the offers themselves (candidates and rejections hold them)."""

    offers: Sequence[Offer]  # as given: a tuple, or a list the caller no longer changes
    numbers: dict[str, np.ndarray]  # int and float fields
    codes: dict[str, Codes]  # every other field
    _memo: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_offers(cls, offers: Iterable[Offer]) -> OfferTable:
        """Build the columns every evaluation reads; the others (the tie-break's, fields no
        rule reads) are built the first time they are read.

        Each offer carries its row packed when it was made (its shape's number, its time and
        its price, `optimizer.model.ROW_FORMAT`): one join of those bytes gives the three
        columns, and the numbers are grouped by numpy. The shape columns are then built over
        the few thousand distinct shapes, read from each one's first row, not over the rows.
        Reading a tuple of the shape fields from every row and hashing it cost three quarters
        of the build (bench/ranking.py)."""
        # A list is kept as it is, not copied: a copy of 100k offers touches each one's
        # reference count, a third of a one-shot ranking's time (bench/ranking.py). So a
        # caller that passes a list does not change it while the table or a ranking of it
        # is read (the daemon's kept table is built from a tuple).
        rows = offers if isinstance(offers, tuple | list) else tuple(offers)
        table = cls(rows, {}, {})
        packed = np.frombuffer(packed_rows(rows), dtype=np.dtype(_ROW_TYPES))
        table.numbers["usd_per_hour"] = packed["usd_per_hour"].copy()
        table._build_shapes(packed["shape"])
        ids, first = _first_seen(packed["observed_us"])
        times = tuple(rows[i].observed_at for i in first.tolist())
        table.codes["observed_at"] = Codes(ids.astype(np.int32), times)
        return table

    def _build_shapes(self, numbers: np.ndarray) -> None:
        """The SHAPE_FIELDS columns and `shape_ids`, from the rows' shape numbers
        (`from_offers`). The numbers' shapes are grouped by value too: two numbers may stand
        for one shape (optimizer.model says when), never one number for two."""
        shape_of, first = _first_seen(numbers)
        found = _encode(
            map(_shape_getter(), map(self.offers.__getitem__, first.tolist())), len(first)
        )
        if len(found.values) < len(first):  # numbers of one shape: one id for them
            _, merged = np.unique(found.codes, return_index=True)
            shape_of, first = found.codes.astype(np.int64)[shape_of], first[merged]
        shapes = list(zip(*found.values, strict=True)) if found.values else []
        columns: dict[str, np.ndarray | Codes] = {}
        for position, name in enumerate(SHAPE_FIELDS):
            per_shape = list(shapes[position]) if shapes else []
            kind = _field_types()[name]
            dtype = _NUMBER_TYPES.get(kind)
            if dtype is not None:
                columns[name] = np.asarray(per_shape, dtype=dtype)
                continue
            column = _encode(per_shape, len(per_shape))
            enum = _ENUMS.get(kind)
            values = column.values if enum is None else tuple(map(enum, column.values))
            columns[name] = Codes(column.codes, values)
        # Per shape; a row's column is spread from them when first read (`_build`).
        self._memo["shape_columns"] = columns
        self._memo["shape_ids"] = (shape_of, first)

    def _build(self, name: str) -> None:
        per_shape = self._memo.get("shape_columns", {}).get(name)
        if per_shape is not None:
            shape_of = self._memo["shape_ids"][0]
            if isinstance(per_shape, Codes):
                self.codes[name] = Codes(per_shape.codes[shape_of], per_shape.values)
            else:
                self.numbers[name] = per_shape[shape_of]
            return
        kind = _field_types()[name]
        rows = self.offers
        dtype = _NUMBER_TYPES.get(kind)
        enum = _ENUMS.get(kind)
        if dtype is not None:
            self.numbers[name] = np.fromiter(map(attrgetter(name), rows), dtype, len(rows))
        elif enum is not None:
            found = _encode(map(attrgetter(name), rows), len(rows))
            self.codes[name] = Codes(found.codes, tuple(map(enum, found.values)))
        elif kind in _TEXT_TYPES:
            self.codes[name] = _encode_text(list(map(attrgetter(name), rows)))
        else:
            self.codes[name] = _encode(map(attrgetter(name), rows), len(rows))

    def take(self, rows: np.ndarray) -> OfferTable:
        """The table of `rows` (ascending row indexes), without reading an offer again: its
        columns are this table's, indexed (a dictionary keeps every value, also those no row
        of the subset has), and so are its shapes; what depends on the rows is rebuilt when
        first read. Ranks the same as a table built from those offers."""
        picked = np.asarray(rows, dtype=np.int64)
        for name in self._memo.get("shape_columns", {}):  # spread to the rows, to index them
            if name not in self.numbers and name not in self.codes:
                self._build(name)
        offers = tuple(map(self.offers.__getitem__, picked.tolist()))
        numbers = {name: column[picked] for name, column in self.numbers.items()}
        codes = {name: Codes(c.codes[picked], c.values) for name, c in self.codes.items()}
        # A value's rank depends on the dictionary alone (kept whole): carried as it is.
        memo = {k: v for k, v in self._memo.items() if k.startswith("ranks:")}
        shapes = self._memo.get("shape_ids")
        if shapes is not None:
            _, first, ids = np.unique(shapes[0][picked], return_index=True, return_inverse=True)
            memo["shape_ids"] = (ids.reshape(-1).astype(np.int64), first.astype(np.int64))
        return OfferTable(offers, numbers, codes, memo)

    def __len__(self) -> int:
        return len(self.offers)

    def number(self, name: str) -> np.ndarray:
        """An int or float field's column."""
        found = self.numbers.get(name)
        if found is None:
            self._build(name)
            found = self.numbers[name]
        return found

    def column(self, name: str) -> Codes:
        """Any other field's column, dictionary-encoded."""
        found = self.codes.get(name)
        if found is None:
            self._build(name)
            found = self.codes[name]
        return found

    def shape_number(self, name: str) -> np.ndarray:
        """An int or float shape field, one value per shape (`shape_ids`)."""
        found = self._memo.get("shape_columns", {}).get(name)
        if found is None:
            return self.number(name)[self.shape_ids()[1]]  # type: ignore[no-any-return]
        return found  # type: ignore[no-any-return]

    def shape_column(self, name: str) -> Codes:
        """Any other shape field, one code per shape (`shape_ids`), with the row column's
        values."""
        found = self._memo.get("shape_columns", {}).get(name)
        if found is None:
            column = self.column(name)
            return Codes(column.codes[self.shape_ids()[1]], column.values)
        return found  # type: ignore[no-any-return]

    def memo(self, key: str, build: Callable[[], Any]) -> Any:
        """A value derived from the columns alone, built once per table."""
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = build()
        return found

    def shape_ids(self) -> tuple[np.ndarray, np.ndarray]:
        """(shape id per row, first row of each shape): rows that agree on SHAPE_FIELDS share
        an id, so the offer-independent rules run once per shape."""
        return self.memo("shape_ids", lambda: _group(self, SHAPE_FIELDS))  # type: ignore[no-any-return]

    def group(self, names: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(group id per row, first row of each group) over the named columns."""
        return self.memo("group:" + ",".join(names), lambda: _group(self, names))  # type: ignore[no-any-return]


def _group(table: OfferTable, names: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Dense ids for the distinct combinations of the named columns, by one lexsort: over
    the shapes' first rows where the names are shape fields (the same ids and first rows:
    shapes are numbered in the order of their first rows, and the sort is stable)."""
    shapes = table._memo.get("shape_ids")
    if shapes is not None and len(shapes[1]) < len(table) and set(names) <= set(SHAPE_FIELDS):
        shape_of, first = shapes
        ids, groups = _group_rows(table, names, len(first), per_shape=True)
        return ids[shape_of], first[groups]
    return _group_rows(table, names, len(table), per_shape=False)


def _group_rows(
    table: OfferTable, names: Sequence[str], n: int, *, per_shape: bool
) -> tuple[np.ndarray, np.ndarray]:
    """`_group` over the rows, or over the shapes (`per_shape`): ids per row (or shape), and
    the first row (or shape) of each group."""
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    keys: list[np.ndarray] = []
    combined = np.zeros(n, dtype=np.int64)
    width = 1
    for name in names:
        if _NUMBER_TYPES.get(_field_types()[name]) is None:
            column = table.shape_column(name) if per_shape else table.column(name)
            values, size = column.codes.astype(np.int64), max(len(column.values), 1)
        else:
            keys.append(table.shape_number(name) if per_shape else table.number(name))
            continue
        if width * size >= 2**62:  # the packed key would overflow: start another
            keys.append(combined)
            combined, width = np.zeros(n, dtype=np.int64), 1
        combined = combined * size + values
        width *= size
    keys.append(combined)
    order = np.lexsort(keys[::-1])
    changed = np.zeros(n, dtype=bool)
    changed[0] = True
    for key in keys:
        ordered = key[order]
        changed[1:] |= ordered[1:] != ordered[:-1]
    sorted_ids = np.cumsum(changed) - 1
    ids = np.empty(n, dtype=np.int64)
    ids[order] = sorted_ids
    # lexsort is stable: a group's first row in sorted order is its first in the table.
    return ids, order[changed]
