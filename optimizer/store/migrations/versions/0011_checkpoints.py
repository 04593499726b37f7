"""Checkpoints in object storage: tables `checkpoint` and `checkpoint_restore`.

- `checkpoint`: one row per checkpoint an attempt's agent uploaded to the job's bucket (its
  name, step, size, file count, folder URI, the bucket's provider and region, when it was
  committed, how long the upload took, whether it was the attempt's final one, and when it
  was pruned from the bucket).
- `checkpoint_restore`: one row per checkpoint an attempt's agent fetched before the job
  started, from the bucket's provider and region to the attempt's.

Existing jobs have none. The downgrade drops both.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "checkpoint",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("attempt_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=True),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("files", sa.Integer(), nullable=False),
        sa.Column("uri", sa.Text(), nullable=False),
        sa.Column("provider", sa.String(), nullable=False),
        sa.Column("region", sa.String(), nullable=True),
        sa.Column("committed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("upload_s", sa.Float(), nullable=False),
        sa.Column("final", sa.Boolean(), nullable=False),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["attempt_id"], ["attempt.id"]),
        sa.ForeignKeyConstraint(["job_id"], ["job.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("attempt_id", "name", name="uq_checkpoint_attempt_name"),
    )
    op.create_index("ix_checkpoint_job", "checkpoint", ["job_id", "committed_at"])
    op.create_table(
        "checkpoint_restore",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("attempt_id", sa.Integer(), nullable=False),
        sa.Column("checkpoint_name", sa.String(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("fetched_bytes", sa.BigInteger(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("from_provider", sa.String(), nullable=False),
        sa.Column("from_region", sa.String(), nullable=True),
        sa.Column("to_provider", sa.String(), nullable=False),
        sa.Column("to_region", sa.String(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["attempt_id"], ["attempt.id"]),
        sa.ForeignKeyConstraint(["job_id"], ["job.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("attempt_id", "checkpoint_name", name="uq_checkpoint_restore_attempt"),
    )
    op.create_index("ix_checkpoint_restore_job", "checkpoint_restore", ["job_id"])


def downgrade() -> None:
    op.drop_table("checkpoint_restore")
    op.drop_table("checkpoint")  # their indexes go with them
