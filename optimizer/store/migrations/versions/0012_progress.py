"""Progress reports: table `attempt_progress`.

One row per attempt whose job reported its progress (docs/progress.md): the first report the
daemon took and the newest, as (step, time), the run's total steps where the job gave them,
the number of reports, and the attempt's instance type (speeds are per type).

Existing attempts have none. The downgrade drops the table.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "attempt_progress",
        sa.Column("attempt_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("instance_type", sa.String(), nullable=False),
        sa.Column("first_step", sa.BigInteger(), nullable=False),
        sa.Column("first_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("total", sa.BigInteger(), nullable=True),
        sa.Column("reports", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["attempt_id"], ["attempt.id"]),
        sa.ForeignKeyConstraint(["job_id"], ["job.id"]),
        sa.PrimaryKeyConstraint("attempt_id"),
    )
    op.create_index("ix_attempt_progress_job", "attempt_progress", ["job_id"])


def downgrade() -> None:
    op.drop_table("attempt_progress")  # its index goes with it
