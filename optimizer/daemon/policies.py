"""The policies in force: an immutable mapping swapped whole, so readers never see half an edit.

Besides the policy files, a job submitted with inline resources runs under its own effective
policy (policies/inline.py), stored with the job (`POLICY_DOCUMENT` in its stored spec):
`for_job` and `with_jobs` give it as a `LoadedPolicy` of status `inline`, under the job's
policy name, so every reader that looks a job's policy up by name finds it.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from optimizer.clock import utc_text
from policies.inline import load_document
from policies.schema import Policy

if TYPE_CHECKING:
    from optimizer.store import JobRecord

ACTIVE = "active"  # the file on disk is this version
FILE_INVALID = "file_invalid"  # the file has a bad edit; this last good version stays
FILE_DELETED = "file_deleted"  # the file is gone but a live job runs under this policy
INLINE = "inline"  # a job's own policy: its inline resources over the default policy
# The key of a job's stored spec that holds its effective policy, when it has its own.
POLICY_DOCUMENT = "policy_document"


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

    def __init__(self, default: str | None = None) -> None:
        # The daemon's `policies.default`: the policy inline resources are written over.
        self.default = default
        self._inline: dict[tuple[str, str], LoadedPolicy] = {}
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

    def for_job(self, job: JobRecord) -> LoadedPolicy | None:
        """The policy the job runs under: its own (inline resources), else the loaded
        policy its row names (None when that is not loaded)."""
        own = self._own(job)
        return own if own is not None else self.get(job.policy)

    def with_jobs(self, jobs: Iterable[JobRecord]) -> Mapping[str, LoadedPolicy]:
        """The policies in force and the jobs' own policies, by name (a reconcile pass's)."""
        own = {j.policy: p for j in jobs if (p := self._own(j)) is not None}
        if not own:
            return self.snapshot()
        return MappingProxyType({**self.snapshot(), **own})

    def _own(self, job: JobRecord) -> LoadedPolicy | None:
        doc = job.spec.get(POLICY_DOCUMENT) if isinstance(job.spec, dict) else None
        if not isinstance(doc, dict):
            return None
        sha = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
        key = (job.policy, sha)
        with self._lock:
            found = self._inline.get(key)
        if found is not None:
            return found
        try:
            policy = load_document(doc)
        except ValueError:  # a document an earlier version wrote that no longer loads
            return None
        found = LoadedPolicy(
            job.policy, policy, f"job {job.given_name}", sha, job.created_at, status=INLINE
        )
        with self._lock:
            if len(self._inline) > 4096:  # ended jobs' documents: read again when asked
                self._inline.clear()
            self._inline[key] = found
        return found

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
