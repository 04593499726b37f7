"""Warm spares: `attempt.spare` and `attempt.promoted_at`.

A job with `warm_spare: true` keeps one extra instance booted, registered and probed beside
its running attempt (optimizer/jobs/spares.py). The spare is an attempt row with `spare`
true; `promoted_at` is when it took the job over (an interruption or a relaunch of the
running attempt), None while it idles. The ledger labels the lines of a spare that never took
over as the warm spare's.

Existing rows get `spare` false and no promotion: every attempt before this revision ran the
job. The downgrade drops both columns; the rows of spares stay as plain attempts (ended ones
are history; a live spare would be taken for the job's attempt, so stop the daemon's jobs'
spares, or let them end, before downgrading).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "attempt", sa.Column("spare", sa.Boolean(), nullable=False, server_default=sa.false())
    )
    op.add_column("attempt", sa.Column("promoted_at", sa.DateTime(timezone=True)))


def downgrade() -> None:
    # Plain DROP COLUMN (SQLite 3.35 and later), as 0004 says why.
    op.drop_column("attempt", "promoted_at")
    op.drop_column("attempt", "spare")
