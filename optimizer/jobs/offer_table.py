"""The latest offers as one `OfferTable`, built when they change and shared by every ranking.

The launcher, `GET /offers`, the migration pass and the price signals after a poll all rank
the latest offers; reading them from the store cost more than the ranking itself
(bench/ranking.py). `latest_table` keeps one table per store and reads the store's
`offers_version` on each call: the same version, the same table. This process's own writes
reach the kept offers as they are made (`Prices.watch_writes`): each written offer replaces
its pool's kept one where it is not older (as the store's upsert does), with no read of the
store; a write that adds a pool (its place in the store's order is the store's to say) has
that provider's offers read again. Where anything else may have changed them (another
replica's poll, more writes than the store remembers), every offer is read again. The
columns are then rebuilt over the whole list, in the store's order, so the table ranks
exactly as one built from `store.prices.latest_offers()` would: a build from kept offers is
a join of their packed rows (policies/table.py, about 15 ms at 100k offers), where patching
columns in place would save little and reading a provider's offers from the store costs
most of a second at that size.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from itertools import chain, groupby
from operator import attrgetter
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

from optimizer.model import Offer, Pool
from optimizer.store import OffersVersion, Prices, Store
from policies.table import OfferTable

if TYPE_CHECKING:
    import numpy as np
else:
    from optimizer.common.lazy import numpy as np

_provider = attrgetter("provider")


class LatestTable:
    """One store's latest offers as a table, kept until its offers change."""

    def __init__(self, prices: Prices) -> None:
        # Weakly: the table is kept in a WeakKeyDictionary under `prices`, and a value that
        # held its key would keep both alive for good.
        self._prices_ref = weakref.ref(prices)
        self._lock = threading.Lock()  # one build at a time; the others wait and share it
        self._version: OffersVersion | None = None
        self._by_provider: dict[str, list[Offer]] = {}  # the store's order
        self._places: dict[Pool, tuple[str, int]] | None = None  # pool -> provider, index
        self._table = OfferTable.from_offers(())
        self._current = False  # whether _table holds _by_provider's offers
        self.builds = 0  # tables built (what a test reads to see one was kept)
        self.reads = 0  # reads of offers from the store (a test sees a write applied)
        prices.watch_writes(self._written)

    def get(self) -> OfferTable:
        """The table of the latest offers as the store holds them now."""
        prices = self._prices
        with self._lock:
            version = prices.offers_version()  # before the offers: newer offers, never older
            if version != self._version:
                self._read(prices, version)
            if not self._current:
                rows = tuple(chain.from_iterable(self._by_provider.values()))
                self._table = OfferTable.from_offers(rows)
                self._current = True
                self.builds += 1
            return self._table

    def _read(self, prices: Prices, version: OffersVersion) -> None:
        changed = None
        if self._version is not None:
            changed = prices.changed_providers(self._version, version)
        by_provider = self._reread(changed) if changed is not None else None
        if by_provider is None:
            offers = prices.latest_offers()
            by_provider = {p: list(rows) for p, rows in groupby(offers, _provider)}
        self._by_provider, self._version = by_provider, version
        self._places, self._current = None, False
        self.reads += 1

    def _written(
        self, before: OffersVersion, after: OffersVersion, offers: tuple[Offer, ...]
    ) -> None:
        """A write of this process (`Prices.watch_writes`): applied to the kept offers where
        they stood at its `before`, else left to the next `get` (it reads the store)."""
        with self._lock:
            if self._version != before:
                return
            places = self._places
            if places is None:
                places = self._places = {
                    offer.pool: (provider, index)
                    for provider, rows in self._by_provider.items()
                    for index, offer in enumerate(rows)
                }
            found = [places.get(offer.pool) for offer in offers]
            if None in found:  # a new pool: the next get reads the written providers again
                return
            for offer, (provider, index) in zip(offers, found, strict=True):  # type: ignore[misc]
                rows = self._by_provider[provider]
                if offer.observed_at >= rows[index].observed_at:
                    rows[index] = offer
            self._version, self._current = after, False

    @property
    def _prices(self) -> Prices:
        prices = self._prices_ref()
        if prices is None:
            raise RuntimeError("the store of this table is gone")
        return prices

    def _reread(self, changed: frozenset[str]) -> dict[str, list[Offer]] | None:
        """The kept offers with the `changed` providers' read again, or None where a provider
        is new or gone (its place in the store's order is not known here: read them all)."""
        out = dict(self._by_provider)
        for provider in changed:
            if provider not in out:
                return None
            rows = self._prices.latest_offers(provider=provider)
            if not rows:
                return None
            out[provider] = rows
        return out


_TABLES: WeakKeyDictionary[Prices, LatestTable] = WeakKeyDictionary()
_TABLES_LOCK = threading.Lock()


def latest_table(store: Store) -> OfferTable:
    """The latest offers of `store` as a table, built once per change of them (module
    docstring)."""
    return keeper(store).get()


def keeper(store: Store) -> LatestTable:
    """The `LatestTable` of `store` (one per store, made on first use)."""
    with _TABLES_LOCK:
        found = _TABLES.get(store.prices)
        if found is None:
            found = _TABLES[store.prices] = LatestTable(store.prices)
        return found


_POOL_COLUMNS = ("provider", "region", "zone", "instance_type", "market")


def pool_rows(table: OfferTable, pool: Iterable[object]) -> np.ndarray:
    """Which rows of `table` price `pool` (provider, region, zone, type, market), matched on
    the columns, not offer by offer (a mask; all False where no row does)."""
    match = np.ones(len(table), dtype=bool)
    for name, value in zip(_POOL_COLUMNS, pool, strict=True):
        column = table.column(name)
        code = column.code_of(value)  # a Market is its text: "spot" finds Market.SPOT
        if code < 0:
            return np.zeros(len(table), dtype=bool)
        match &= column.codes == code
    return match


def without_pools(table: OfferTable, pools: Iterable[Pool]) -> OfferTable:
    """`table` less the rows of `pools` (the table itself where it has none of them)."""
    dropped = np.zeros(len(table), dtype=bool)
    for pool in pools:
        dropped |= pool_rows(table, pool)
    if not dropped.any():
        return table
    return table.take(np.flatnonzero(~dropped))
