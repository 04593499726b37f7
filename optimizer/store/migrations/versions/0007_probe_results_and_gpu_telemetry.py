"""Measured feedback: every probe result, and the GPU telemetry the agents send.

- `probe_result`: one per probe an attempt's agent reported, with the figures the ranking
  uses (per-dtype TFLOPS per GPU as JSON, device copy and host-link bandwidth, all-reduce
  bus bandwidth), the verdict and the full result JSON.
- `gpu_sample`: an attempt's GPU readings aggregated over a span (`span_s` 60 for the
  per-minute aggregates agents send, 3600 once downsampled), across its GPUs.

The downgrade drops both.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "probe_result",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("attempt_id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("provider", sa.String(), nullable=False),
        sa.Column("region", sa.String(), nullable=False),
        sa.Column("zone", sa.String(), nullable=False),
        sa.Column("instance_type", sa.String(), nullable=False),
        sa.Column("gpu_model", sa.String(), nullable=True),
        sa.Column("gpu_count", sa.Integer(), nullable=True),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("tflops", sa.Text(), nullable=True),
        sa.Column("copy_gbps", sa.Float(), nullable=True),
        sa.Column("host_link_gbps", sa.Float(), nullable=True),
        sa.Column("allreduce_busbw_gbps", sa.Float(), nullable=True),
        sa.Column("simulated", sa.Boolean(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("result", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(["attempt_id"], ["attempt.id"]),
        sa.ForeignKeyConstraint(["job_id"], ["job.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_probe_result_type", "probe_result", ["provider", "instance_type", "at"])
    op.create_index("ix_probe_result_attempt", "probe_result", ["attempt_id"])
    op.create_table(
        "gpu_sample",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("attempt_id", sa.Integer(), nullable=False),
        sa.Column("start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("span_s", sa.Integer(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("util_mean", sa.Float(), nullable=True),
        sa.Column("util_max", sa.Float(), nullable=True),
        sa.Column("memory_used_gib_max", sa.Float(), nullable=True),
        sa.Column("memory_total_gib", sa.Float(), nullable=True),
        sa.Column("power_w_mean", sa.Float(), nullable=True),
        sa.Column("temperature_c_max", sa.Float(), nullable=True),
        sa.Column("sm_clock_mhz_mean", sa.Float(), nullable=True),
        sa.Column("throttle_reasons", sa.BigInteger(), nullable=False),
        sa.Column("xids", sa.Text(), nullable=True),
        sa.Column("simulated", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(["attempt_id"], ["attempt.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("attempt_id", "start", "span_s", name="uq_gpu_sample_span"),
    )


def downgrade() -> None:
    op.drop_table("gpu_sample")
    op.drop_table("probe_result")  # their indexes go with them
