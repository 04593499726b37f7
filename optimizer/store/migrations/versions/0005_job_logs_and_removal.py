"""job_log: the output of each attempt's job, shipped by its agent; job.removed_at.

`job_log` holds the job's stdout and stderr in the chunks the agent sent them, numbered per
attempt (`seq`, unique with the attempt, so a retried batch is stored once);
`attempt.log_bytes` and `attempt.log_dropped_bytes` count what it holds of each attempt and
what the per-job cap dropped, so the cap is kept without summing the rows. `job.removed_at`
marks a job that `gpuopt jobs rm` took off the lists: its row stays, so its attempts, events
and costs keep pointing at its id, and its name is free for a new job.

The downgrade drops them all: the shipped output and the removal marks go with them (a removed
job shows again under the older gpuopt, by the name `rm` gave it).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("job", sa.Column("removed_at", sa.DateTime(timezone=True)))
    for name in ("log_bytes", "log_dropped_bytes"):
        op.add_column(
            "attempt", sa.Column(name, sa.BigInteger(), nullable=False, server_default="0")
        )
    op.create_table(
        "job_log",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("attempt_id", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("stream", sa.String(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("nbytes", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["job.id"]),
        sa.ForeignKeyConstraint(["attempt_id"], ["attempt.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("attempt_id", "seq", name="uq_job_log_attempt_seq"),
    )
    op.create_index("ix_job_log_job_id", "job_log", ["job_id", "id"])


def downgrade() -> None:
    op.drop_table("job_log")  # its index goes with it
    op.drop_column("attempt", "log_dropped_bytes")
    op.drop_column("attempt", "log_bytes")
    # A plain ALTER TABLE … DROP COLUMN, as in 0004.
    op.drop_column("job", "removed_at")
