"""The deadline strategies by name."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from policies.deadline.gpuopt import Gpuopt
from policies.deadline.model import DeadlineStrategy
from policies.deadline.strategies import Greedy, UniformProgress

STRATEGIES: Mapping[str, type[DeadlineStrategy]] = MappingProxyType(
    {c.name: c for c in (Gpuopt, Greedy, UniformProgress)}
)
DEFAULT_STRATEGY = "gpuopt"


def strategy(name: str = DEFAULT_STRATEGY) -> DeadlineStrategy:
    """The strategy of that name (KeyError naming the known ones otherwise)."""
    try:
        return STRATEGIES[name]()
    except KeyError:
        known = ", ".join(sorted(STRATEGIES))
        raise KeyError(f"unknown deadline strategy {name!r} (known: {known})") from None
