"""Gang placements are deleted once the gang is gone: `attempt.placement_released_at`.

A multi-node attempt's nodes launch into one placement the provider makes for the gang (an
AWS cluster placement group, a GCP compact resource policy). The reconciler deletes it once
every node's instance has ended, and records when on every row of the gang; None while it
may still exist.

Existing gangs' rows get None: their placements were never deleted, so the first pass after
the upgrade deletes those of gangs that are over (one already gone counts as deleted). The
downgrade drops the column.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("attempt", sa.Column("placement_released_at", sa.DateTime(timezone=True)))


def downgrade() -> None:
    # Plain DROP COLUMN (SQLite 3.35 and later), as 0004 says why.
    op.drop_column("attempt", "placement_released_at")
