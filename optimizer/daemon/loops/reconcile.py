"""The reconcile loop: each pass loads the live jobs once and hands them to every reconciler.

The hook is `ReconcileLoop.reconcilers`, a list of callables taking a `ReconcileContext`
(both defined in optimizer/jobs/context.py); the daemon appends the job reconciler there.
Reconcilers must be idempotent (a pass may run twice for one cause) and record what they
change in the store themselves. One reconciler raising is logged and counted; the others
still run.

Waking: `wakeup.set()` (from an API handler, an agent event, a policy change) runs a pass
now instead of at the next tick. A wake during a pass makes that pass run once more when it
ends, so no wake is lost and passes never overlap. A reconciler that knows when its next
decision falls due asks for a pass at that instant (`ctx.wake_at`, the loop's `alarm`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from optimizer.alerts.outbox import Emitter
from optimizer.clock import Clock
from optimizer.daemon.alarm import Alarm
from optimizer.daemon.metrics import Metrics
from optimizer.daemon.policies import PolicyRegistry
from optimizer.daemon.providers import ProviderHandle
from optimizer.jobs.context import ReconcileContext, Reconciler
from optimizer.store import Store

log = logging.getLogger(__name__)

MAX_BACK_TO_BACK = 10  # passes one wake-up storm may chain before yielding to the next tick


@dataclass
class PassReport:
    jobs: int = 0
    errors: list[str] = field(default_factory=list)


class Wakeup(threading.Event):
    """A threading.Event whose `set()` also asks the reconcile loop for a pass right away."""

    def __init__(self) -> None:
        super().__init__()
        self._notify: Callable[[], None] | None = None

    def connect(self, notify: Callable[[], None]) -> None:
        self._notify = notify

    def set(self) -> None:
        super().set()
        notify = self._notify
        if notify is not None:
            notify()


class ReconcileLoop:
    """Runs the reconcilers over the live jobs; `run_once()` is one pass."""

    name = "reconcile"

    def __init__(
        self,
        store: Store,
        registry: PolicyRegistry,
        emitter: Emitter,
        clock: Clock,
        *,
        providers: Mapping[str, ProviderHandle] | None = None,
        metrics: Metrics | None = None,
        reconcilers: list[Reconciler] | None = None,
        leading: Callable[[], bool] | None = None,
    ) -> None:
        self.store = store
        self.leading = leading or (lambda: True)
        self.registry = registry
        self.emitter = emitter
        self.clock = clock
        self.providers = dict(providers or {})
        self.metrics = metrics
        self.reconcilers: list[Reconciler] = list(reconcilers or [])
        self.wakeup = Wakeup()
        self.passes = 0  # completed passes, for tests and the bench
        self._lock = threading.Lock()
        self._running = False
        self._trigger: Callable[[], None] | None = None
        self.wakeup.connect(self._woken)
        self.alarm = Alarm(self.wakeup.set, clock)  # a pass at an instant (ctx.wake_at)

    def add(self, reconciler: Reconciler) -> None:
        """Append a reconciler; it runs from the next pass on."""
        self.reconcilers.append(reconciler)

    def attach(self, trigger: Callable[[], None]) -> None:
        """How a wake-up gets a pass started (the scheduler runs the job now)."""
        self._trigger = trigger

    def _woken(self) -> None:
        with self._lock:
            if self._running:
                return  # the pass in progress sees the flag when it ends and runs again
        if self._trigger is not None:
            self._trigger()

    def tick(self) -> None:
        """The scheduled job: a pass, and another while wake-ups arrived during one.

        Never two passes at once: a tick that finds one running returns at once, and the
        running one passes again if a wake-up came (the flag is set before the trigger).
        """
        with self._lock:
            if self._running:
                return
            self._running = True
        try:
            for _ in range(MAX_BACK_TO_BACK):
                self.wakeup.clear()
                self.run_once()
                with self._lock:
                    if not self.wakeup.is_set():
                        self._running = False
                        return
        finally:
            with self._lock:
                self._running = False

    def run_once(self) -> PassReport:
        """One pass over the live jobs."""
        started = time.perf_counter()
        jobs = tuple(self.store.jobs.live_jobs())
        ctx = ReconcileContext(
            now=self.clock(),
            jobs=jobs,
            policies=self.registry.with_jobs(jobs),
            store=self.store,
            providers=self.providers,
            emitter=self.emitter,
            clock=self.clock,
            leading=self.leading,
            wake_at=self.alarm.at,
        )
        report = PassReport(jobs=len(ctx.jobs))
        for reconciler in list(self.reconcilers):
            try:
                reconciler(ctx)
            except Exception as exc:
                label = getattr(reconciler, "__name__", type(reconciler).__name__)
                log.exception("reconciler %s failed", label)
                report.errors.append(f"{label}: {type(exc).__name__}: {exc}")
                if self.metrics is not None:
                    self.metrics.loop_runs.labels(f"reconcile:{label}", "error").inc()
        self.passes += 1
        if self.metrics is not None:
            self.metrics.reconcile_jobs.set(len(ctx.jobs))
        log.debug(
            "reconcile pass: %d live jobs, %d reconcilers, %.3fs",
            len(ctx.jobs),
            len(self.reconcilers),
            time.perf_counter() - started,
        )
        return report
