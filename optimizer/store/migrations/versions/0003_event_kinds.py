"""Event kinds spelled `noun.verb`: stored events get today's names.

`price_drop` becomes `price.dropped`, and so on, so the history, `GET /events?kind=` and the
alerts still pending read in one spelling.

Data only; the schema is unchanged. The names are written out here, not imported, so the
revision means the same whatever later code calls things. The downgrade writes the earlier
names back (`job.cancelled` becomes `job_cancelled`, the one name the API gave it).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

RENAMED = {  # earlier name -> today's
    "best_offer_changed": "best_offer.changed",
    "no_candidates": "best_offer.lost",
    "price_drop": "price.dropped",
    "bid_cap_crossed": "bid_cap.crossed",
    "policy_loaded": "policy.loaded",
    "policy_invalid": "policy.rejected",
    "policy_removed": "policy.removed",
    "policy_deleted_in_use": "policy.kept",
    "poll_failed": "poll.failed",
    "poll_recovered": "poll.recovered",
    "provider_disabled": "provider.disabled",
    "provider.quota": "provider.quota_exceeded",
    "provider.auth": "provider.auth_failed",
    "job_submitted": "job.submitted",
    "job_cancelled": "job.cancelled",
    "job.state": "job.state_changed",
    "job.pending": "job.deferred",
    "job.no_policy": "job.policy_missing",
    "job.launch_timeout": "job.launch_timed_out",
    "budget.warning": "budget.threshold_crossed",
    "daemon.leader": "leader.elected",
}

_EVENT = sa.table("event", sa.column("kind", sa.String()))


def _rename(pairs: dict[str, str]) -> None:
    """One pass over the table: the column is not indexed."""
    kind = _EVENT.c.kind
    op.execute(
        _EVENT.update()
        .where(kind.in_(list(pairs)))
        .values(kind=sa.case(pairs, value=kind, else_=kind))
    )


def upgrade() -> None:
    _rename(RENAMED)


def downgrade() -> None:
    _rename({new: old for old, new in RENAMED.items()})
