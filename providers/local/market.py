"""The local cloud's market controls: pinned prices and pools without capacity.

Drills and tests need to play the market: make a pool dear or cheap, take its capacity away
and give it back. Both live in the state directory (`market.json`), so any process can set
them (`gpuopt local price`, `gpuopt local capacity`) for the cloud a daemon runs:

- a **pin** holds a pool's price at `usd` instead of the simulated walk (or the list price):
  for good, or for `for_s` seconds. A pin set with a duration from another process counts
  from when the running cloud first sees it (it stamps `until` from its own clock, which may
  be a test's injected one); `LocalCloud.pin_price` stamps it at once;
- a pool marked **unavailable** keeps its price listed (AWS goes on publishing the spot
  price of a pool it has no capacity in) but every launch in it fails with
  `InsufficientInstanceCapacity` until it is marked available again. Running instances are
  not touched;
- a spot pool (or every spot pool, `*`) may follow a **capacity trace** (trace.py): the
  number of spot instances obtainable there changes over time, its clock started by the
  running cloud as a pin's is; the cloud refuses launches past the count and interrupts the
  newest running instances when the count drops below them (cloud.py).

A pool is named `type@zone` for a spot pool (`g4dn.xlarge@eu-central-1-a`) and
`type@region` for the on-demand one (`g4dn.xlarge@eu-central-1`), as `pool_name` spells it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from optimizer.model import Offer
from providers.local.state import StateDir, read_json, write_json
from providers.local.trace import CapacityTrace

EVERY_SPOT_POOL = "*"  # a trace every spot pool follows (`gpuopt local capacity --trace` alone)

MARKET_FILE = "market.json"


def pool_name(offer: Offer) -> str:
    """`type@zone` for a zonal (spot) offer, `type@region` for a regional (on-demand) one."""
    return f"{offer.instance_type}@{offer.zone or offer.region}"


def check_pool(name: str, offers: Sequence[Offer]) -> str:
    """`name` if it names one of `offers`' pools; else a ValueError that says what does."""
    instance_type, at, where = name.partition("@")
    if not at or not instance_type or not where:
        raise ValueError(
            f"{name!r} is not a pool: write TYPE@ZONE for a spot pool "
            "(g4dn.xlarge@eu-central-1-a) or TYPE@REGION for an on-demand one"
        )
    names = {pool_name(o) for o in offers}
    if name in names:
        return name
    same_type = sorted(n for n in names if n.startswith(f"{instance_type}@"))
    if not same_type:
        raise ValueError(f"the local cloud offers no instance type {instance_type!r}")
    # The pools of the same type nearby (a region's zones), else every pool of the type.
    near = [n for n in same_type if n.partition("@")[2].startswith(where.rsplit("-", 1)[0])]
    shown = near or same_type
    listed = ", ".join(shown[:8]) + (f" and {len(shown) - 8} more" if len(shown) > 8 else "")
    raise ValueError(f"the local cloud has no pool {name!r}; pools of {instance_type}: {listed}")


@dataclass(frozen=True, slots=True)
class Pin:
    """A pool's price held at `usd`; `until` (epoch s, the cloud's clock) None: no end yet —
    for good when `for_s` is None, else not yet stamped by the running cloud."""

    usd: float
    for_s: float | None = None
    until: float | None = None

    def active(self, now: float) -> bool:
        return self.until is None or now < self.until

    def to_json(self) -> dict[str, Any]:
        return {"usd": self.usd, "for_s": self.for_s, "until": self.until}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Pin:
        for_s, until = data.get("for_s"), data.get("until")
        return cls(
            float(data["usd"]),
            None if for_s is None else float(for_s),
            None if until is None else float(until),
        )


@dataclass(frozen=True, slots=True)
class Market:
    """What `market.json` holds: pins by pool name, the pools without capacity, and the spot
    capacity traces by pool name (`*`: every spot pool without one of its own)."""

    pins: Mapping[str, Pin]
    unavailable: frozenset[str]
    traces: Mapping[str, CapacityTrace] = field(default_factory=dict)

    def prices(self, now: float) -> dict[str, float]:
        """The pinned price of every pool whose pin holds at `now`."""
        return {name: pin.usd for name, pin in self.pins.items() if pin.active(now)}

    def trace(self, name: str) -> CapacityTrace | None:
        """The trace a spot pool's capacity follows (its own, else the one for every pool)."""
        return self.traces.get(name) or self.traces.get(EVERY_SPOT_POOL)

    def to_json(self) -> dict[str, Any]:
        return {
            "pins": {name: pin.to_json() for name, pin in sorted(self.pins.items())},
            "unavailable": sorted(self.unavailable),
            "traces": {name: t.to_json() for name, t in sorted(self.traces.items())},
        }


EMPTY = Market({}, frozenset())


def load(state: StateDir) -> Market:
    """The market controls in the state directory (none when it has no file)."""
    data = read_json(state.root / MARKET_FILE)
    if not isinstance(data, dict):
        return EMPTY
    pins = {str(k): Pin.from_json(v) for k, v in (data.get("pins") or {}).items()}
    traces = {str(k): CapacityTrace.from_json(v) for k, v in (data.get("traces") or {}).items()}
    return Market(pins, frozenset(str(n) for n in data.get("unavailable") or ()), traces)


def save(state: StateDir, market: Market) -> None:
    """Write the controls (call under the state lock)."""
    state.ensure()
    write_json(state.root / MARKET_FILE, market.to_json())


def pin(
    state: StateDir, name: str, usd: float | None, *, for_s: float | None, now: float | None
) -> Pin | None:
    """Pin the pool's price at `usd` (None: unpin it). `now` stamps a duration's end at once;
    None leaves it for the running cloud to stamp (`stamp`)."""
    if usd is not None and not usd > 0:
        raise ValueError(f"--usd must be a price above 0, got {usd}")
    if for_s is not None and not for_s > 0:
        raise ValueError(f"--for must be a duration above 0, got {for_s:g} s")
    with state.locked():
        market = load(state)
        pins = dict(market.pins)
        made: Pin | None = None
        if usd is None:
            pins.pop(name, None)
        else:
            until = None if for_s is None or now is None else now + for_s
            made = pins[name] = Pin(float(usd), for_s, until)
        save(state, replace(market, pins=pins))
    return made


def set_capacity(state: StateDir, name: str, *, available: bool) -> None:
    """Give the pool capacity back (and stop any trace of its own), or take it away
    (launches in it fail)."""
    with state.locked():
        market = load(state)
        unavailable = set(market.unavailable)
        traces = dict(market.traces)
        if available:
            unavailable.discard(name)
            traces.pop(name, None)
        else:
            unavailable.add(name)
        save(state, replace(market, unavailable=frozenset(unavailable), traces=traces))


def follow_trace(
    state: StateDir, name: str, trace: CapacityTrace | None, *, now: float | None
) -> None:
    """Make a spot pool's capacity (`*`: every spot pool's) follow `trace` (None: stop
    following one). `now` starts its clock at once; None leaves it for the running cloud
    to start (`stamp`)."""
    with state.locked():
        market = load(state)
        traces = dict(market.traces)
        if trace is None:
            if name == EVERY_SPOT_POOL:
                traces.clear()
            else:
                traces.pop(name, None)
        else:
            traces[name] = replace(trace, start=now)
        save(state, replace(market, traces=traces))


def stamp(state: StateDir, now: float) -> None:
    """The running cloud's upkeep: start the clock of pins set with a duration and of
    capacity traces from another process, and drop pins that have run out. Writes only when
    something changed."""
    market = load(state)
    if not any(
        (p.until is None and p.for_s is not None) or not p.active(now) for p in market.pins.values()
    ) and all(t.start is not None for t in market.traces.values()):
        return
    with state.locked():
        market = load(state)
        pins: dict[str, Pin] = {}
        for name, held in market.pins.items():
            if held.until is None and held.for_s is not None:
                held = Pin(held.usd, held.for_s, now + held.for_s)
            if held.active(now):
                pins[name] = held
        traces = {
            name: t if t.start is not None else replace(t, start=now)
            for name, t in market.traces.items()
        }
        save(state, replace(market, pins=pins, traces=traces))


__all__ = [
    "EMPTY",
    "EVERY_SPOT_POOL",
    "MARKET_FILE",
    "Market",
    "Pin",
    "check_pool",
    "follow_trace",
    "load",
    "pin",
    "pool_name",
    "save",
    "set_capacity",
    "stamp",
]
