"""gpuopt's schema migrations (Alembic scripts); `optimizer.store.migrate` runs them.

The scripts ship in the wheel as package data: `env.py`, `script.py.mako` and `versions/`.
A new revision is hand-written (autogenerate against a database at head is a fine first
draft, see `env.py`) and must leave the schema exactly as `SQLModel.metadata.create_all`
makes it; tests/test_migrations.py checks that on SQLite and PostgreSQL.
"""
