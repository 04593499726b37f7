"""How many answers may follow job logs at once: `logs.max_followers_per_job` of one job and
`logs.max_followers` in all (docs/daemon.md, Job logs). A follower beyond either is refused
with 429 naming the limit; its slot frees as soon as its answer ends, however it ends."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from optimizer.store.logs import DEFAULT_FOLLOWERS, DEFAULT_FOLLOWERS_PER_JOB


class TooManyFollowers(Exception):
    """A follower over a limit; the message names it."""


@dataclass
class FollowerSlot:
    """One follower's place; `release()` gives it back (once, however often it is called)."""

    slots: FollowerSlots
    job_id: int
    _released: bool = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.slots._release(self.job_id)


@dataclass
class FollowerSlots:
    """Counts of open followers, per job and in all, taken and given back from any thread."""

    per_job: int = DEFAULT_FOLLOWERS_PER_JOB
    total: int = DEFAULT_FOLLOWERS
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _by_job: dict[int, int] = field(default_factory=dict, repr=False)
    _open: int = 0

    def take(self, job_id: int, name: str) -> FollowerSlot:
        """A slot for a follower of `job_id` (named `name`); raises TooManyFollowers."""
        with self._lock:
            of_job = self._by_job.get(job_id, 0)
            if of_job >= self.per_job:
                raise TooManyFollowers(
                    f"job {name!r} already has {of_job} followers, the limit "
                    f"(logs.max_followers_per_job = {self.per_job}); try again once one ends"
                )
            if self._open >= self.total:
                raise TooManyFollowers(
                    f"the daemon already serves {self._open} log followers, the limit "
                    f"(logs.max_followers = {self.total}); try again once one ends"
                )
            self._by_job[job_id] = of_job + 1
            self._open += 1
        return FollowerSlot(self, job_id)

    def count(self, job_id: int | None = None) -> int:
        """Followers open now, of one job or in all."""
        with self._lock:
            return self._open if job_id is None else self._by_job.get(job_id, 0)

    def _release(self, job_id: int) -> None:
        with self._lock:
            left = self._by_job.get(job_id, 0) - 1
            if left > 0:
                self._by_job[job_id] = left
            else:
                self._by_job.pop(job_id, None)
            self._open = max(self._open - 1, 0)
