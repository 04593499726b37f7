"""Which channels an event goes to: routes match event kinds (globs) and a minimum severity.

A kind's earlier spellings (`optimizer.model.LEGACY_EVENT_KINDS`, e.g. `price_drop` for
`price.dropped`) are matched too, so routes written before kinds were spelled `noun.verb`
route the same events as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from fnmatch import fnmatchcase
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from optimizer.model import EventKind, legacy_names

Severity = Literal["info", "warning", "critical"]
SEVERITIES: tuple[str, ...] = ("info", "warning", "critical")
_RANK = {name: i for i, name in enumerate(SEVERITIES)}


def severity_rank(severity: str) -> int:
    """info < warning < critical; an unknown severity ranks as critical, so it is not lost."""
    return _RANK.get(severity, len(SEVERITIES) - 1)


class Route(BaseModel):
    """Send events whose kind matches `kinds` (and none of `exclude_kinds`) and whose
    severity is at least `min_severity` to `channels` (every channel when left out)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kinds: list[str] = Field(
        default_factory=lambda: ["*"], min_length=1, examples=[["job.*", "budget.*"]]
    )
    exclude_kinds: list[str] = Field(
        default_factory=list, examples=[[EventKind.JOB_SUBMITTED.value]]
    )
    min_severity: Severity = "info"
    channels: list[str] | None = Field(None, examples=[["ops"]])

    def matches(self, kind: str, severity: str) -> bool:
        names = (kind, *legacy_names(kind))
        return (
            severity_rank(severity) >= severity_rank(self.min_severity)
            and _any_match(names, self.kinds)
            and not _any_match(names, self.exclude_kinds)
        )


def _any_match(names: Sequence[str], globs: Iterable[str]) -> bool:
    return any(fnmatchcase(name, glob) for glob in globs for name in names)


DEFAULT_ROUTES = (Route(),)
"""With channels configured and no routes: every event to every channel."""


class Router:
    """Routes compiled against the configured channel names."""

    def __init__(self, routes: Sequence[Route], channels: Iterable[str]) -> None:
        self.channels = tuple(channels)
        self.routes = tuple(routes) if routes else DEFAULT_ROUTES

    def channels_for(self, kind: str, severity: str) -> tuple[str, ...]:
        """The channels an event goes to, in configuration order, each once."""
        if not self.channels:
            return ()
        chosen: set[str] = set()
        for route in self.routes:
            if route.matches(kind, severity):
                chosen.update(self.channels if route.channels is None else route.channels)
        return tuple(name for name in self.channels if name in chosen)
