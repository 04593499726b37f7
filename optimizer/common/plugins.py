"""Plug-ins found by entry-point group in the installed distributions.

gpuopt's own providers, alert channels and recovery strategies are declared in its
pyproject.toml under these groups, and another installed package adds its own the same way
(docs/extending.md), with no edit to gpuopt: the standard Python plug-in mechanism
(`importlib.metadata.entry_points`), as pytest and setuptools use it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import Generic, TypeVar

PROVIDERS = "gpuopt.providers"
ALERT_CHANNELS = "gpuopt.alert_channels"
RECOVERY_STRATEGIES = "gpuopt.recovery_strategies"
GROUPS = (PROVIDERS, ALERT_CHANNELS, RECOVERY_STRATEGIES)

T = TypeVar("T")


class PluginError(ValueError):
    """An entry point that cannot be loaded, or one that is not what its group holds."""


@cache
def _found(group: str) -> tuple[EntryPoint, ...]:
    return tuple(entry_points(group=group))


def refresh() -> None:
    """Forget what was found, so the next look reads the installed distributions again
    (after a package was installed into a running process, as tests do)."""
    _found.cache_clear()


# Names a registry added in this process beyond the installed ones (tests register their own
# provider or strategy), so that a layer that may not import the registry sees them too.
_declared: dict[str, list[str]] = {}


def declare(group: str, name: str) -> None:
    """`name` is registered under `group` in this process (the registries call this)."""
    _declared.setdefault(group, []).append(name)


def withdraw(group: str, name: str) -> None:
    if name in _declared.get(group, []):
        _declared[group].remove(name)


def names(group: str) -> tuple[str, ...]:
    """The names installed under `group`, and those registered in this process, without
    importing any plug-in: the policy loader checks the names it reads against these."""
    found = (ep.name for ep in _found(group))
    return tuple(dict.fromkeys([*found, *_declared.get(group, ())]))


def where(ep: EntryPoint) -> str:
    dist = ep.dist
    owner = f" (from {dist.name} {dist.version})" if dist is not None else ""
    return f"entry point {ep.group} {ep.name} = {ep.value}{owner}"


def load(group: str, kind: type[T], check: Callable[[T, str], None] | None = None) -> dict[str, T]:
    """Every plug-in of `group`, by name, each loaded and checked to be a `kind` (an entry
    point may name the object, or a function of no arguments that returns it). Two
    distributions declaring one name, or one that fails to import, is a PluginError naming
    the entry point and its distribution."""
    found: dict[str, T] = {}
    seen: dict[str, EntryPoint] = {}
    for ep in _found(group):
        if ep.name in seen:
            if seen[ep.name].value == ep.value:  # the same declaration seen twice on the path
                continue
            raise PluginError(f"{where(ep)}: the name is taken by {where(seen[ep.name])}")
        seen[ep.name] = ep
        try:
            obj = ep.load()
        except Exception as exc:
            raise PluginError(f"{where(ep)}: cannot be loaded: {exc}") from exc
        if not isinstance(obj, kind) and callable(obj) and not isinstance(obj, type):
            obj = obj()
        if not isinstance(obj, kind):
            raise PluginError(f"{where(ep)}: is not a {kind.__name__}")
        if check is not None:
            check(obj, ep.name)
        found[ep.name] = obj
    return found


class Table(Generic[T]):
    """The plug-ins of one group by name, as a registry holds them: the installed ones, read
    from their entry points once (and again after `reload`), then those registered in this
    process (tests; an installed package declares an entry point instead). `error` is the
    registry's own error class, for a name registered twice or (`required`) none installed."""

    def __init__(
        self,
        group: str,
        kind: type[T],
        check: Callable[[T, str], None],
        *,
        what: str,
        error: type[ValueError] = PluginError,
        required: str | None = None,
    ) -> None:
        self.group, self.kind, self.check, self.what = group, kind, check, what
        self.error, self.required = error, required
        self._all: dict[str, T] = {}
        self._local: dict[str, T] = {}
        self._loaded = False

    def all(self) -> dict[str, T]:
        """Every plug-in by name, in the order found (the registered ones last)."""
        if not self._loaded:
            found = load(self.group, self.kind, self.check)
            if not found and self.required is not None:
                raise self.error(self.required)
            taken = sorted(set(found) & set(self._local))
            if taken:
                raise self.error(f"{self.what} {taken[0]!r} is already registered")
            self._all = {**found, **self._local}
            self._loaded = True
        return self._all

    def reload(self) -> None:
        """Read the installed plug-ins again (after a package was installed into, or removed
        from, this process's path), keeping those registered here."""
        refresh()
        self._loaded = False
        self.all()

    def register(self, name: str, item: T) -> T:
        """Add a plug-in in this process; its name must be free."""
        if name in self.all():
            raise self.error(f"{self.what} {name!r} is already registered")
        self._all[name] = self._local[name] = item
        declare(self.group, name)
        return item

    def unregister(self, name: str) -> None:
        """Remove a plug-in registered in this process."""
        if self._local.pop(name, None) is not None:
            self._all.pop(name, None)
            withdraw(self.group, name)

    @contextmanager
    def registered(self, name: str, item: T) -> Iterator[T]:
        """`item` registered under `name` for the length of a `with` block."""
        self.register(name, item)
        try:
            yield item
        finally:
            self.unregister(name)
