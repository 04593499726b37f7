"""The daemon's loops (poll, reconcile, deliver, watch, queue, retention).

Each has `run_once()` (one iteration) for the scheduler.
"""

from optimizer.daemon.loops.deliver import DeliverLoop
from optimizer.daemon.loops.poll import PollLoop
from optimizer.daemon.loops.reconcile import ReconcileLoop, Wakeup
from optimizer.daemon.loops.retention import RetentionLoop
from optimizer.daemon.loops.watch import PolicyWatcher

__all__ = [
    "DeliverLoop",
    "PolicyWatcher",
    "PollLoop",
    "ReconcileLoop",
    "RetentionLoop",
    "Wakeup",
]
