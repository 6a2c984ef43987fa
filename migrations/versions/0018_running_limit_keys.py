"""Limited claims count a key's running jobs through an index of their own: the running jobs
under a limit key, by task and key (PostgreSQL, SQLite; a partial index, so it holds only the
jobs running under a limit).

The walk over a task's keys asked which keys were full by grouping every running job of the
task (a scan that grew with the running jobs: 2,000 rows at 1,000 full keys); it now probes each
key it walks, as the count under a key's lock does. MariaDB/MySQL (no partial indexes) count
through ``ix_sqlqueue_jobs_limit_by_status`` already (task, key, status first).

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

_RUNNING_LIMITED = sa.text("status = 'running' AND limit_key IS NOT NULL")


def _partial_indexes() -> bool:
    return op.get_bind().dialect.name in ("postgresql", "sqlite")


def upgrade() -> None:
    if _partial_indexes():
        op.create_index(
            "ix_sqlqueue_jobs_limit_running",
            "sqlqueue_jobs",
            ["job_type", "limit_key"],
            postgresql_where=_RUNNING_LIMITED,
            sqlite_where=_RUNNING_LIMITED,
        )


def downgrade() -> None:
    if _partial_indexes():
        op.drop_index("ix_sqlqueue_jobs_limit_running", table_name="sqlqueue_jobs")
