"""Agent tokens are looked up by an index: `ix_attempt_token_sha256`.

Every `/agent/` request is authenticated by its token's SHA-256 before its body is read
(`Jobs.attempt_by_token`); without an index that lookup scanned the attempt table, for
unauthenticated requests too. The index is not unique: rows written before agents had
tokens hold an empty string. The downgrade drops it.
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_attempt_token_sha256", "attempt", ["token_sha256"])


def downgrade() -> None:
    op.drop_index("ix_attempt_token_sha256", table_name="attempt")
