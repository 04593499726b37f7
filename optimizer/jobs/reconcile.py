"""The managed-jobs reconciler: one pass is a describe step, one view, then passes in order.

In the manner of Karpenter's disruption controller: each pass over the jobs is its own
module, registered below in the order it runs with why it sits there; every pass after the
describe step reads one view (`views.PassView`) built once per pass; decisions are values
(`machine.decide`'s `Decision`, `migration.plan`'s `Move`) that the passes apply through the
providers (acting.py, launch.py). Launch errors are typed (`launch.LaunchOutcome`):
capacity → the next offer now with the pool cooled down; quota → the pool cooled down and
the provider/region skipped, with an alert; throttled → retried next pass with the same
idempotency key; auth → the provider sits out, with an alert.

Each pass keeps one failure to itself: a provider's describe, a policy's or a job's
gathering for moves, a job's handling (the job is failed with why), an attempt's clean-up.
The database going away ends the pass: the next one tries again.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Protocol

from optimizer.jobs.acting import Acting
from optimizer.jobs.bootstrap import AgentSettings
from optimizer.jobs.cleanup import STOP_GRACE, CleanUp
from optimizer.jobs.context import ReconcileContext
from optimizer.jobs.deadlines import Deadlines
from optimizer.jobs.describe import Describe
from optimizer.jobs.machine import REGISTER_TIMEOUT
from optimizer.jobs.measured import DEFAULT_WINDOW, ProbeWindow
from optimizer.jobs.migration_inputs import InForce, WindowName, in_force_now, window_now
from optimizer.jobs.moving import Moves
from optimizer.jobs.per_job import ABANDONED, PerJob
from optimizer.jobs.spares import Spares
from optimizer.jobs.views import PassView
from optimizer.jobs.watch import Watch


class Pass(Protocol):
    """One pass over the view: idempotent; it records what it changes in the store itself,
    and keeps a failure of one job, policy or attempt to that one."""

    def __call__(self, ctx: ReconcileContext, view: PassView) -> None: ...


class JobReconciler:
    """The daemon's reconciler of managed jobs (a `Reconciler`, optimizer/jobs/context.py)."""

    name = "jobs"

    def __init__(
        self,
        daemon_url: Callable[[], str],
        *,
        agent: AgentSettings | None = None,
        register_timeout: timedelta = REGISTER_TIMEOUT,
        probe_window: ProbeWindow = DEFAULT_WINDOW,
        in_force: InForce = in_force_now,
        window_name: WindowName = window_now,
        decide_every: timedelta | None = None,
    ) -> None:
        self.acting = Acting(daemon_url, agent=agent, probe_window=probe_window)
        self.launcher = self.acting.launcher
        # Provider event queues (AWS EventBridge → SQS) are read by their own loop
        # (optimizer/daemon/loops/queue.py), which records notices and wakes this one.
        # What the clouds report on every open attempt: instances they ended, and the billing
        # facts (launch and termination times, who ended it). First, and before the view is
        # built, so that the view sees the attempts the clouds ended (describe.py).
        self.describe = Describe(self.acting)
        # Which running jobs to move (moving.py): planned over every live job at once, since a
        # policy's disruption budget spans its jobs; the moves are left in the view.
        self.moves = Moves(
            self.acting, probe_window=probe_window, in_force=in_force, window_name=window_name
        )
        # Each job with a deadline (deadlines.py): its situation, the deadline strategy's
        # decision, the at-risk and missed events; a move it asks for replaces or drops the
        # migration pass's, and the per-job pass launches on the markets it chose. After the
        # migration pass, before the per-job pass.
        self.deadlines = Deadlines(self.acting, decide_every=decide_every)
        # The utilization watch (watch.py): consulted by the per-job pass for each running
        # job before it decides, as its verdict is one of the state machine's inputs.
        self.watch = Watch(self.acting)
        # Each live job decided and applied (per_job.py), a planned move instead where the job
        # is healthy and running; after the migration pass, whose moves it applies.
        self.per_job = PerJob(self.acting, self.watch, register_timeout=register_timeout)
        # Each job's warm spare kept, replaced or released (spares.py): after the per-job pass,
        # which promotes a spare in place of a launch, so a new one is launched in the same
        # pass; before the clean-up, which reclaims the instances of spares it ended.
        self.spares = Spares(self.acting, register_timeout=register_timeout)
        # Ended attempts' instances stopped, reclaimed or left to the cloud, and gangs'
        # placements deleted (cleanup.py). Last: the per-job pass has just ended attempts.
        self.clean_up = CleanUp(self.acting)

    def passes(self) -> tuple[Pass, ...]:
        """The passes over the view, in the order they run (see `__init__` for why)."""
        return (self.moves, self.deadlines, self.per_job, self.spares, self.clean_up)

    def __call__(self, ctx: ReconcileContext) -> None:
        self.describe(ctx)
        self.acting.buffer.clear()
        view = PassView.read(ctx)  # read after describe, which may have ended attempts
        for step in self.passes():
            step(ctx, view)


__all__ = ["ABANDONED", "STOP_GRACE", "JobReconciler", "Pass"]
