"""The cost ledger: billing facts on attempts, frozen cost lines, hourly price history.

- `attempt.launched_at` / `terminated_at`: the instance's launch and termination as the
  provider reports them (billing runs between them); `terminated_by` says who ended it
  (`cloud` for an interruption the cloud carried out, `gpuopt`); `disk_gib`: the root volume
  the launch created.
- `cost_line`: an ended attempt's cost per calendar month, frozen when it ends, so its
  numbers never change when the price points behind them are downsampled.
- `price_hourly`: price history older than the raw retention, one row per pool and hour
  (min, median, max and how many points).

The downgrade drops all of it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_POOL = ("provider", "region", "zone", "instance_type", "market")


def _pool_columns() -> list[sa.Column[str]]:
    return [
        sa.Column("provider", sa.String(), nullable=False),
        sa.Column("region", sa.String(), nullable=False),
        sa.Column("zone", sa.String(), nullable=False),
        sa.Column("instance_type", sa.String(), nullable=False),
        sa.Column("market", sa.String(), nullable=False),
    ]


def upgrade() -> None:
    op.add_column("attempt", sa.Column("launched_at", sa.DateTime(timezone=True)))
    op.add_column("attempt", sa.Column("terminated_at", sa.DateTime(timezone=True)))
    op.add_column("attempt", sa.Column("terminated_by", sa.String()))
    op.add_column("attempt", sa.Column("disk_gib", sa.Float()))
    op.create_table(
        "cost_line",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("attempt_id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("policy", sa.String(), nullable=False),
        *_pool_columns(),
        sa.Column("period_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("period_end", sa.DateTime(timezone=True), nullable=False),
        sa.Column("billed_seconds", sa.Float(), nullable=False),
        sa.Column("spend_usd", sa.Float(), nullable=False),
        sa.Column("storage_usd", sa.Float(), nullable=False),
        sa.Column("on_demand_usd", sa.Float(), nullable=True),
        sa.Column("overhead_seconds", sa.Float(), nullable=False),
        sa.Column("overhead_usd", sa.Float(), nullable=False),
        sa.Column("refunded", sa.Boolean(), nullable=False),
        sa.Column("frozen_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["attempt_id"], ["attempt.id"]),
        sa.ForeignKeyConstraint(["job_id"], ["job.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("attempt_id", "period_start", name="uq_cost_line_attempt_period"),
    )
    op.create_index("ix_cost_line_period", "cost_line", ["period_start"])
    op.create_table(
        "price_hourly",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        *_pool_columns(),
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("min_usd", sa.Float(), nullable=False),
        sa.Column("median_usd", sa.Float(), nullable=False),
        sa.Column("max_usd", sa.Float(), nullable=False),
        sa.Column("points", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint(*_POOL, "hour", name="uq_price_hourly_pool_hour"),
    )


def downgrade() -> None:
    op.drop_table("price_hourly")
    op.drop_table("cost_line")  # its index goes with it
    # Plain ALTER TABLE … DROP COLUMN, as in 0004.
    for column in ("disk_gib", "terminated_by", "terminated_at", "launched_at"):
        op.drop_column("attempt", column)
