"""The policies in force: an immutable mapping swapped whole, so readers never see half an edit."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Any

from optimizer.clock import utc_text
from policies.schema import Policy

ACTIVE = "active"  # the file on disk is this version
FILE_INVALID = "file_invalid"  # the file has a bad edit; this last good version stays
FILE_DELETED = "file_deleted"  # the file is gone but a live job runs under this policy


@dataclass(frozen=True, slots=True)
class LoadedPolicy:
    name: str
    policy: Policy
    path: str
    sha256: str
    loaded_at: datetime
    status: str = ACTIVE
    problems: tuple[str, ...] = ()  # the file's current problems, when status is file_invalid

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": self.path,
            "sha256": self.sha256,
            "loaded_at": utc_text(self.loaded_at),
            "status": self.status,
            "problems": list(self.problems),
            "description": self.policy.description,
        }


@dataclass(frozen=True, slots=True)
class RejectedFile:
    """A policy file whose current content is invalid (whether or not a version is kept)."""

    path: str
    sha256: str
    problems: tuple[str, ...]
    kept: str | None  # the policy name still in force from this file, if any


class PolicyRegistry:
    """Thread-safe holder of the policies in force and the files currently rejected."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._policies: Mapping[str, LoadedPolicy] = MappingProxyType({})
        self._rejected: Mapping[str, RejectedFile] = MappingProxyType({})
        self._generation = 0

    def snapshot(self) -> Mapping[str, LoadedPolicy]:
        """The policies in force now; the mapping never changes after it is returned."""
        with self._lock:
            return self._policies

    def rejected(self) -> Mapping[str, RejectedFile]:
        with self._lock:
            return self._rejected

    def get(self, name: str) -> LoadedPolicy | None:
        return self.snapshot().get(name)

    @property
    def generation(self) -> int:
        """Bumped on every swap: a cheap "did anything change" for readers."""
        with self._lock:
            return self._generation

    def swap(
        self,
        policies: Mapping[str, LoadedPolicy],
        rejected: Mapping[str, RejectedFile] | None = None,
    ) -> None:
        """Replace everything at once."""
        frozen = MappingProxyType(dict(policies))
        with self._lock:
            self._policies = frozen
            if rejected is not None:
                self._rejected = MappingProxyType(dict(rejected))
            self._generation += 1

    def status_counts(self) -> dict[str, int]:
        counts = Counter(p.status for p in self.snapshot().values())
        return {status: counts.get(status, 0) for status in (ACTIVE, FILE_INVALID, FILE_DELETED)}
