"""Which offer sources a command reads: live clouds when asked for and usable, else the snapshot.

A cloud that cannot run here (no credentials, no project) is reported in one line and its
part of the bundled snapshot stands in, so gpuopt keeps working without credentials. The
local cloud's offers are its simulated prices at this moment, the same the daemon's local
cloud lists (the spot walk is a function of the seed, the pool and the time).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from fnmatch import fnmatchcase

from optimizer.model import Market, Offer
from providers import registry
from providers.base import OfferSource, ProviderDisabled, ProviderError, ProviderSettings
from providers.snapshot import Gap, SnapshotSource, gaps


def live_providers() -> tuple[str, ...]:
    """The providers `gpuopt offers --provider` asks live (the registry's `live_offers`)."""
    return tuple(n for n, e in registry.entries().items() if e.capabilities.live_offers)


@dataclass
class Gathered:
    """Offers from every source asked for, with one note per source that could not run (and
    per market wanted that the snapshot, where it stood in, has no rows of: `lacking`)."""

    offers: list[Offer] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    lacking: list[Gap] = field(default_factory=list)


def expand_regions(provider: str, globs: Sequence[str]) -> list[str] | None:
    """The provider's known regions matching the globs; None (all regions) without globs."""
    if not globs:
        return None
    from policies import regions

    known = [r.name for r in regions.all_regions(provider)]
    exact = [g for g in globs if not any(c in g for c in "*?[")]
    matched = [name for name in known if any(fnmatchcase(name, g) for g in globs)]
    return sorted(set(matched) | set(exact))


def _live(
    provider: str, commitments: bool, at: datetime | None = None
) -> tuple[OfferSource | None, str | None]:
    """A live source for the provider, or (None, why it cannot run here).

    Built as the daemon builds it (the registry's builder, the same settings and endpoints,
    the daemon's data directory, where the local cloud would keep its state: reading its
    offers creates nothing there), without a spec cache; with `commitments`, asking for
    committed offers too where the provider has them; `at`: offers as of that time where the
    provider can tell (the local cloud's simulated prices are a function of the time).
    """
    from optimizer.daemon.settings import data_dir

    entry = registry.find(provider)
    if entry is None or not entry.capabilities.live_offers:
        return None, f"no live adapter for {provider!r}"
    try:
        settings = ProviderSettings(
            data_dir=data_dir(), commitments=commitments and entry.capabilities.commitments
        )
        if at is not None:
            settings = replace(settings, clock=lambda: at)
        return entry.build(settings), None
    except ProviderDisabled as exc:
        return None, str(exc)


def gather(
    providers: Sequence[str],
    region_globs: Sequence[str],
    *,
    commitments: bool = False,
    snapshot_for_rest: bool = False,
    at: datetime | None = None,
) -> Gathered:
    """Offers for `gpuopt offers`: the snapshot by default, live clouds when named (with their
    committed offers when `commitments`: those take calls of their own). `snapshot_for_rest`:
    the snapshot's rows of every provider not asked live are added too (a policy that names
    the local cloud beside clouds gpuopt does not call unasked)."""
    out = Gathered()
    live = [p for p in providers if p in live_providers()]
    fallback: set[str] = set()
    if snapshot_for_rest:
        fallback = set(registry.names()) - set(live)
    for provider in live:
        source, why = _live(provider, commitments, at)
        if source is None:
            out.notes.append(f"{provider}: disabled ({why}); showing the bundled snapshot")
            fallback.add(provider)
            continue
        try:
            out.offers.extend(source.fetch_offers(expand_regions(provider, region_globs)))
        except ProviderError as exc:
            out.notes.append(f"{provider}: {exc.__class__.__name__}: {exc}; showing the snapshot")
            fallback.add(provider)
            continue
        out.names.append(source.name)
        out.notes.extend(f"{provider}: {p}" for p in source.problems)
    if not live or fallback:
        snapshot = SnapshotSource()
        rows = snapshot.fetch_offers()
        if live:
            rows = [o for o in rows if o.provider in fallback]
        out.offers.extend(rows)
        out.names.append(snapshot.name)
        if commitments:  # wanted, and the snapshot has none: say so, and why
            stand_in = fallback if live else set(registry.names())
            out.lacking = [g for g in gaps(Market.COMMITTED) if stand_in & set(g.providers)]
            out.notes.extend(str(gap) for gap in out.lacking)
    return out
