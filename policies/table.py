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
evaluation; Arrow only won at dictionary-encoding Python strings, which the table does once
per poll.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from operator import attrgetter
from typing import Any

import numpy as np

from optimizer.model import Fabric, Interconnect, Market, Offer

# Annotations (as written, `from __future__ import annotations`) that make a number column.
_NUMBER_TYPES = {"int": np.int64, "float": np.float64}

# Enum-typed Offer fields, by annotation: encoded by their values.
_ENUMS: dict[str, type[Enum]] = {"Market": Market, "Interconnect": Interconnect, "Fabric": Fabric}

# Offer fields that give a row its shape: what the offer-independent rules read.
SHAPE_FIELDS = (
    "market",
    "provider",
    "region",
    "instance_type",
    "gpu_model",
    "gpu_count",
    "gpu_memory_gib",
    "interconnect",
    "vcpus",
    "ram_gib",
    "fabric",
)


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


def _encode(column: list[Any]) -> Codes:
    index = {value: code for code, value in enumerate(dict.fromkeys(column))}
    codes = np.fromiter(map(index.__getitem__, column), dtype=np.int32, count=len(column))
    return Codes(codes, tuple(index))


def _field_types() -> dict[str, str]:
    return {name: str(f.type) for name, f in Offer.__dataclass_fields__.items()}


@dataclass(frozen=True, slots=True, eq=False)
class OfferTable:
    """Offers in columns, and the offers themselves (candidates and rejections hold them)."""

    offers: tuple[Offer, ...]
    numbers: dict[str, np.ndarray]  # int and float fields
    codes: dict[str, Codes]  # every other field
    _memo: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_offers(cls, offers: Iterable[Offer]) -> OfferTable:
        """Build the columns (one pass per field, in C where numpy and dict allow)."""
        rows = offers if isinstance(offers, tuple) else tuple(offers)
        numbers: dict[str, np.ndarray] = {}
        codes: dict[str, Codes] = {}
        for name, kind in _field_types().items():
            dtype = _NUMBER_TYPES.get(kind)
            enum = _ENUMS.get(kind)
            if enum is not None:
                # An enum member hashes in Python code; its value (a str) in C, and cached.
                found = _encode(list(map(attrgetter(f"{name}._value_"), rows)))
                codes[name] = Codes(found.codes, tuple(map(enum, found.values)))
                continue
            column = list(map(attrgetter(name), rows))
            if dtype is not None:
                numbers[name] = np.fromiter(column, dtype=dtype, count=len(rows))
            elif all(isinstance(v, Hashable) for v in column[:1]):
                codes[name] = _encode(column)
        table = cls(rows, numbers, codes)
        table.shape_ids()
        return table

    def __len__(self) -> int:
        return len(self.offers)

    def number(self, name: str) -> np.ndarray:
        return self.numbers[name]

    def column(self, name: str) -> Codes:
        return self.codes[name]

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
    """Dense ids for the distinct combinations of the named columns, by one lexsort."""
    n = len(table)
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    keys: list[np.ndarray] = []
    combined = np.zeros(n, dtype=np.int64)
    width = 1
    for name in names:
        if name in table.codes:
            column = table.codes[name]
            values, size = column.codes.astype(np.int64), max(len(column.values), 1)
        else:
            keys.append(table.numbers[name])
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
