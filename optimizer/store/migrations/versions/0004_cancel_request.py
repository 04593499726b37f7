"""job.cancel_requested_at: a cancel is a request that the reconciler decides.

Before it, the API wrote `cancelled` into `job.state` itself, racing the reconcile pass.
The downgrade drops the column: a job whose cancel was asked for but not yet decided keeps
running under the older gpuopt (cancel it again there).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("job", sa.Column("cancel_requested_at", sa.DateTime(timezone=True)))


def downgrade() -> None:
    # A plain ALTER TABLE … DROP COLUMN (SQLite 3.35 and later): copying the table, as a
    # batch operation does, trips the foreign keys of the rows that point at it.
    op.drop_column("job", "cancel_requested_at")
