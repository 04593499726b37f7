"""Multi-node jobs: the offers' inter-node fabric, and gangs of attempts.

- `latest_price.fabric`, `latest_price.fabric_interfaces`: the fabric an offer's type has
  (`none`, `efa`, `gpudirect_tcpx`, …) and how many of its interfaces an instance carries.
- `attempt.gang`, `attempt.node_rank`, `attempt.nodes`: the nodes of one multi-node attempt
  are one attempt row each (their own instance, key, token and reports); `gang` is the
  number of the gang's rank-0 row (null for a single-node attempt), `nodes` the gang's size.
- `attempt.address`: the address the node's agent reported, where the other nodes reach it.
- `attempt.internode_status`, `attempt.internode_reason`: the inter-node probe's verdict.

Existing rows are single-node attempts and offers without a fabric. The downgrade drops the
columns (a gang's rows then read as separate attempts).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_ATTEMPT = (
    sa.Column("gang", sa.Integer()),
    sa.Column("node_rank", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("nodes", sa.Integer(), nullable=False, server_default="1"),
    sa.Column("address", sa.String()),
    sa.Column("internode_status", sa.String()),
    sa.Column("internode_reason", sa.Text()),
)


def upgrade() -> None:
    op.add_column(
        "latest_price", sa.Column("fabric", sa.String(), nullable=False, server_default="none")
    )
    op.add_column(
        "latest_price",
        sa.Column("fabric_interfaces", sa.Integer(), nullable=False, server_default="0"),
    )
    for column in _ATTEMPT:
        op.add_column("attempt", column)


def downgrade() -> None:
    # Plain DROP COLUMN (SQLite 3.35 and later), as 0004 says why.
    for column in reversed(_ATTEMPT):
        op.drop_column("attempt", column.name)
    op.drop_column("latest_price", "fabric_interfaces")
    op.drop_column("latest_price", "fabric")
