"""Alembic's entry point: run the migrations on the connection `optimizer.store.migrate` hands over.

That connection is already in the transaction (and, on PostgreSQL, holds the lock) the
migration must run in, and it carries the store's `search_path`, so `alembic_version` and
every table land in the store's schema. There is no alembic.ini; to draft a revision:

    from alembic import command
    from optimizer.store.migrate import alembic_config
    cfg = alembic_config()
    with engine.begin() as conn:  # a database at head
        cfg.attributes["connection"] = conn
        command.revision(cfg, "what changes", autogenerate=True, rev_id="0003")
"""

from __future__ import annotations

from alembic import context
from sqlmodel import SQLModel

import optimizer.store.tables  # noqa: F401  (puts every table on SQLModel.metadata)

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError(
        "gpuopt's migrations run on a connection from optimizer.store.migrate (gpuopt db upgrade)"
    )
context.configure(
    connection=connection,
    target_metadata=SQLModel.metadata,
    compare_type=True,
    compare_server_default=True,
)
with context.begin_transaction():
    context.run_migrations()
