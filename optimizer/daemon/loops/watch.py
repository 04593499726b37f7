"""The watch loop: reload policy files when they change, keep the last good version of a
broken one, and keep a deleted policy in force while a live job still runs under it.

A changed file is read once its size and mtime have held still for one pass (so a file is
not read half-written), hashed, and only parsed when its content changed. Every change is
recorded as a policy version and an event in one transaction; a restart reads those back,
so it neither repeats alerts nor forgets the last good version of a file broken meanwhile.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

from optimizer.alerts.outbox import Emitter
from optimizer.clock import Clock
from optimizer.common.documents import NotARegularFile, read_limited
from optimizer.daemon.metrics import Metrics
from optimizer.daemon.policies import (
    ACTIVE,
    FILE_DELETED,
    FILE_INVALID,
    LoadedPolicy,
    PolicyRegistry,
    RejectedFile,
)
from optimizer.model import EventKind
from optimizer.store import NewEvent, PolicyVersionRecord, Store
from policies.loader import PolicyError, parse_policy
from policies.schema import Policy

log = logging.getLogger(__name__)

SUFFIXES = (".yaml", ".yml")
Stat = tuple[int, int]  # (mtime_ns, size)


@dataclass
class _Seen:
    stat: Stat
    sha256: str
    name: str | None  # the policy this file provides (its last good version's name)


@dataclass
class _Pass:
    """What one pass changed, written to the store together."""

    policies: dict[str, LoadedPolicy]
    rejected: dict[str, RejectedFile]
    versions: list[PolicyVersionRecord] = field(default_factory=list)
    events: list[NewEvent] = field(default_factory=list)
    outcomes: list[str] = field(default_factory=list)
    in_use: set[str] | None = None  # policies live jobs use, read once per pass when needed
    in_force: dict[str, PolicyVersionRecord] | None = None  # at the last run (start only)


def _version(
    path: str,
    name: str | None,
    sha: str,
    outcome: str,
    at: datetime,
    *,
    text: str | None = None,
    problems: list[str] | None = None,
) -> PolicyVersionRecord:
    return PolicyVersionRecord(0, path, name, sha, outcome, text, problems or [], at)


class PolicyWatcher:
    """Owns the registry's contents; `run_once()` is one pass of the watch loop."""

    def __init__(
        self,
        directory: Path,
        registry: PolicyRegistry,
        store: Store,
        emitter: Emitter,
        clock: Clock,
        *,
        metrics: Metrics | None = None,
        on_change: Callable[[], None] | None = None,
        records: Callable[[], bool] | None = None,
    ) -> None:
        self.directory = directory
        self.registry = registry
        self.store = store
        self.emitter = emitter
        self.clock = clock
        self.metrics = metrics
        self.on_change = on_change
        # Whether this process writes what it sees (versions, events, alerts): with several
        # replicas every one loads the policies, but only the leader records them.
        self.records = records or (lambda: True)
        self._seen: dict[str, _Seen] = {}
        self._pending: dict[str, Stat] = {}
        self._started = False
        self._missing_logged = False
        self._resync = False

    # -- the pass ----------------------------------------------------------------------------

    def run_once(self) -> list[str]:
        """One scan; returns the outcomes (loaded, rejected, removed, kept) of what changed.

        The first call loads every file at once and restores what the store remembers."""
        if self._resync:
            self._resync, self._started = False, False
            self._seen.clear()
            self._pending.clear()
        initial = not self._started
        files = self._scan()
        if files is None:
            return []
        work = _Pass(dict(self.registry.snapshot()), dict(self.registry.rejected()))
        known = self.store.policies.latest_policy_versions() if initial else {}
        for path, stat in sorted(files.items()):
            self._consider(path, stat, work, initial=initial, known=known)
        for path in sorted(set(self._seen) - set(files)):
            self._deleted(path, work)
        if initial:
            self._restore_orphans(work)
        self._sweep_orphans(work)
        self._started = True
        self._commit(work)
        return work.outcomes

    def resync(self) -> None:
        """Make the next pass a first one again: compare every file with what the store
        recorded. A replica that becomes the leader calls it, so changes made while no leader
        was recording (this replica only loaded them) are recorded now."""
        self._resync = True

    def _scan(self) -> dict[str, Stat] | None:
        try:
            entries = list(os.scandir(self.directory))
        except FileNotFoundError:
            if not self._missing_logged:
                log.warning(
                    "policy directory %s does not exist; policies unchanged", self.directory
                )
                self._missing_logged = True
            return None
        self._missing_logged = False
        found: dict[str, Stat] = {}
        for entry in entries:
            name = entry.name
            if name.startswith(".") or not name.endswith(SUFFIXES):
                continue  # hidden files and editors' swap and backup files
            try:
                # Directories and FIFOs named *.yaml too: a pass reports them as bad files
                # rather than skip them, so a policy that is not where it seems is noticed.
                st = entry.stat()
            except OSError:
                continue
            found[str(Path(self.directory) / name)] = (st.st_mtime_ns, st.st_size)
        return found

    def _consider(
        self,
        path: str,
        stat: Stat,
        work: _Pass,
        *,
        initial: bool,
        known: Mapping[str, PolicyVersionRecord],
    ) -> None:
        seen = self._seen.get(path)
        if seen is not None and seen.stat == stat:
            self._pending.pop(path, None)
            return
        if not initial and self._pending.get(path) != stat:
            self._pending[path] = stat  # changed since the last pass: wait for it to settle
            return
        self._pending.pop(path, None)
        odd: str | None = None
        try:
            raw = read_limited(path)
        except NotARegularFile as exc:
            odd, raw = exc.kind, f"not a regular file: {exc.kind}".encode()
        except OSError as exc:
            log.warning("cannot read policy file %s: %s", path, exc.strerror or exc)
            return
        sha = hashlib.sha256(raw).hexdigest()
        if seen is not None and seen.sha256 == sha:
            seen.stat = stat  # touched, not changed
            return
        previous = known.get(path)
        already = previous is not None and previous.sha256 == sha
        policy: Policy | None = None
        problems: list[str] = []
        if odd is not None:
            problems = [f"{path}: is a {odd}, not a policy file"]
        else:
            try:
                policy = parse_policy(raw, path=path)
            except PolicyError as exc:
                problems = [str(p) for p in exc.problems]
        if policy is not None:
            holder = work.policies.get(policy.name)
            owner = None
            if holder is not None and holder.path != path and holder.status != FILE_DELETED:
                owner = holder.path  # a kept, deleted policy gives way to a new file
            if owner is not None:
                problems = [f"{path}: name: policy {policy.name!r} is already defined in {owner}"]
                policy = None
        if policy is None:
            quiet = already and previous is not None and previous.outcome == "rejected"
            self._rejected_file(path, stat, sha, problems, seen, work, quiet=quiet, initial=initial)
            return
        now = self.clock()
        old_name = seen.name if seen is not None else None
        if old_name is not None and old_name != policy.name:
            self._drop_name(old_name, path, work)
        work.policies[policy.name] = LoadedPolicy(policy.name, policy, path, sha, now)
        work.rejected.pop(path, None)
        self._seen[path] = _Seen(stat, sha, policy.name)
        if already and previous is not None and previous.outcome == "loaded":
            return  # unchanged while the daemon was down
        updated = old_name == policy.name or (previous is not None and previous.name == policy.name)
        text = raw.decode("utf-8")
        work.versions.append(_version(path, policy.name, sha, "loaded", now, text=text))
        verb = "updated" if updated else "loaded"
        work.events.append(
            self.emitter.draft(
                EventKind.POLICY_LOADED,
                f"policy {policy.name} {verb} from {path}",
                policy=policy.name,
                data={"path": path, "sha256": sha, "change": verb},
            )
        )
        work.outcomes.append("loaded")

    def _rejected_file(
        self,
        path: str,
        stat: Stat,
        sha: str,
        problems: list[str],
        seen: _Seen | None,
        work: _Pass,
        *,
        quiet: bool,
        initial: bool,
    ) -> None:
        name = seen.name if seen is not None else None
        kept = work.policies.get(name) if name else None
        if kept is None and initial:
            kept = self._last_good(path, work)  # what this file had in force at the last run
        if kept is not None and kept.path == path:
            holder = work.policies.get(kept.name)
            if holder is None or holder.path == path:
                work.policies[kept.name] = replace(
                    kept, status=FILE_INVALID, problems=tuple(problems)
                )
                name = kept.name
        self._seen[path] = _Seen(stat, sha, name)
        work.rejected[path] = RejectedFile(path, sha, tuple(problems), name)
        if quiet:
            return  # rejected before the restart; its alert was raised then
        now = self.clock()
        work.versions.append(_version(path, None, sha, "rejected", now, problems=problems))
        stays = (
            f"the last good version of policy {name} stays in force"
            if name
            else "no earlier version to keep"
        )
        work.events.append(
            self.emitter.draft(
                EventKind.POLICY_REJECTED,
                f"{path}: edit rejected, {stays}:\n" + "\n".join(problems),
                severity="warning",
                policy=name,
                data={"path": path, "sha256": sha, "problems": problems, "kept": name},
                dedupe_key=f"policy-invalid:{path}:{sha}",
            )
        )
        work.outcomes.append("rejected")

    def _last_good(self, path: str, work: _Pass) -> LoadedPolicy | None:
        """The version from `path` in force at the last run (not one retired since), parsed
        again from the store's copy."""
        for record in self._in_force(work).values():
            if record.path == path:
                return self._revive(record)
        return None

    def _in_force(self, work: _Pass) -> dict[str, PolicyVersionRecord]:
        if work.in_force is None:
            work.in_force = self.store.policies.policies_in_force()
        return work.in_force

    def _revive(self, record: PolicyVersionRecord) -> LoadedPolicy | None:
        if record.text is None:
            return None
        try:
            policy = parse_policy(record.text, path=record.path)
        except PolicyError as exc:
            log.warning("stored version of %s no longer parses: %s", record.path, exc)
            return None
        return LoadedPolicy(policy.name, policy, record.path, record.sha256, self.clock())

    def _deleted(self, path: str, work: _Pass) -> None:
        seen = self._seen.pop(path)
        self._pending.pop(path, None)
        work.rejected.pop(path, None)
        if seen.name is not None:
            self._drop_name(seen.name, path, work)

    def _drop_name(self, name: str, path: str, work: _Pass) -> None:
        """The file no longer provides `name`."""
        entry = work.policies.get(name)
        if entry is not None and entry.path == path:
            self._retire(entry, work, why=f"{path} no longer defines it")

    def _in_use(self, work: _Pass) -> set[str]:
        if work.in_use is None:
            work.in_use = self.store.jobs.policies_in_use()
        return work.in_use

    def _retire(self, entry: LoadedPolicy, work: _Pass, *, why: str) -> None:
        """Keep a policy whose file is gone while a live job uses it; remove it otherwise."""
        if entry.name in self._in_use(work):
            work.policies[entry.name] = replace(entry, status=FILE_DELETED, problems=())
            work.events.append(self._kept_event(entry))
            work.outcomes.append("kept")
        else:
            self._remove(entry, work, why=why)

    def _kept_event(self, entry: LoadedPolicy) -> NewEvent:
        return self.emitter.draft(
            EventKind.POLICY_KEPT,
            f"policy {entry.name} was deleted from {entry.path} but live jobs run under it; "
            "it stays in force until they end",
            severity="warning",
            policy=entry.name,
            data={"path": entry.path, "sha256": entry.sha256},
            dedupe_key=f"policy-deleted:{entry.name}:{entry.sha256}",
        )

    def _remove(self, entry: LoadedPolicy, work: _Pass, *, why: str) -> None:
        work.policies.pop(entry.name, None)
        now = self.clock()
        work.versions.append(_version(entry.path, entry.name, entry.sha256, "removed", now))
        work.events.append(
            self.emitter.draft(
                EventKind.POLICY_REMOVED,
                f"policy {entry.name} removed: {why}",
                policy=entry.name,
                data={"path": entry.path, "sha256": entry.sha256},
            )
        )
        work.outcomes.append("removed")

    def _restore_orphans(self, work: _Pass) -> None:
        """At start: policies in force at the last run that no file defines any more."""
        for name, record in sorted(self._in_force(work).items()):
            if name in work.policies:
                continue
            revived = self._revive(record)
            if revived is not None and revived.name == name:
                self._retire(revived, work, why="its file changed or went away while stopped")

    def _sweep_orphans(self, work: _Pass) -> None:
        orphans = [p for p in work.policies.values() if p.status == FILE_DELETED]
        for entry in orphans:
            if entry.name not in self._in_use(work):
                self._remove(entry, work, why="its file is gone and no live job uses it")

    def _commit(self, work: _Pass) -> None:
        if (work.versions or work.events) and self.records():
            self.store.policies.record_policy_changes(work.versions, work.events)
        if self.metrics is not None:
            for outcome in work.outcomes:
                self.metrics.policy_changes.labels(outcome).inc()
        before = self.registry.snapshot()
        changed = dict(before) != work.policies or dict(self.registry.rejected()) != work.rejected
        if changed:
            self.registry.swap(work.policies, work.rejected)
        for event in work.events:
            level = logging.INFO if event.severity == "info" else logging.WARNING
            log.log(level, "%s", event.message)
        if changed and self.on_change is not None and dict(before) != work.policies:
            self.on_change()


__all__ = ["ACTIVE", "FILE_DELETED", "FILE_INVALID", "PolicyWatcher"]
