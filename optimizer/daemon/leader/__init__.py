"""Leadership: which daemon process runs the loops that act (poll, queue, reconcile, deliver).

Every replica serves the API; only the leader polls prices, reconciles jobs and sends
alerts, so no two processes launch the same job or send the same alert.

- **PostgreSQL**: replicas compete for a session-level advisory lock held on a dedicated
  connection (outside the pool). The lock is keyed by the schema, so deployments sharing a
  database in different schemas elect separately. PostgreSQL frees the lock the moment the
  leader's session ends: a clean stop, a crash or SIGKILL (the kernel closes the socket),
  or, when the leader's host vanishes, the server's TCP keepalives giving up (set on the
  session to about 12 s). Followers wait for the lock in the server (`pg_advisory_lock`,
  in rounds of `check_s` under a `lock_timeout`), so PostgreSQL hands it to one of them the
  moment it is freed: a takeover does not wait for a follower's next round.
- **Lease**: the leader re-confirms the lock in `pg_locks` every `check_s` and counts as
  leader only while its last confirmation is younger than `lease_s`. A leader cut off from
  the database stops acting after `lease_s`, before the server drops its session and a
  follower can win; launches also carry idempotency keys, so a launch in flight across a
  takeover is not repeated.
- **Wake-ups**: a follower that receives an agent's interruption notice sends
  `NOTIFY gpuopt_wakeup` (payload: its schema); the leader LISTENs on its lock connection
  and runs a reconcile pass at once, so recovery does not wait for the next tick. A leader
  that stops cleanly unlocks, which grants the lock to a waiting follower at once (a rolling
  update hands over without waiting a round), and announces its release on the same
  channel for followers of older versions, which poll.
- **SQLite**: one daemon per database file. The first takes an exclusive `flock` on
  `<database>.lock` and leads for its lifetime; a second one exits with a message naming
  the holder. The kernel drops the lock when the holder exits, however it exits.

The connection that holds the lock must be a real session: a pooler in transaction mode
(pgbouncer's default) would hand the lock to whoever gets the server connection next.
"""

from optimizer.daemon.leader.base import (
    HEARTBEAT_S,
    STALE_AFTER,
    WAKEUP_CHANNEL,
    Election,
    first_line,
    replica_id,
)
from optimizer.daemon.leader.choose import make_leadership
from optimizer.daemon.leader.postgres import LOCK_KEY_SQL, PostgresElection
from optimizer.daemon.leader.sqlite import SqliteLock, sqlite_lock_path

__all__ = [
    "HEARTBEAT_S",
    "LOCK_KEY_SQL",
    "STALE_AFTER",
    "WAKEUP_CHANNEL",
    "Election",
    "PostgresElection",
    "SqliteLock",
    "first_line",
    "make_leadership",
    "replica_id",
    "sqlite_lock_path",
]
