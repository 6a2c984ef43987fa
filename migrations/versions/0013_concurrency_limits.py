"""Concurrency limits: the key a limited task's job runs under, a lock row per (task, key) that
limited claims hold while they count, and a queue's limit of running jobs.

The claim index now holds only jobs without a limit key (MariaDB/MySQL: the key is a column of
the by-status claim index), and limited jobs have an index of their own: blocked limited jobs
never sit in the way of the plain claim.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.mysql import VARBINARY

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

#: Compared exactly everywhere: UTF-8 bytes on MariaDB/MySQL (as in sqlqueue/_types.exact_text).
_KEY = sa.String(255).with_variant(VARBINARY(1020), "mysql", "mariadb")
_MYSQL = ("mysql", "mariadb")
_CLAIMABLE = sa.text("status IN ('queued', 'failed')")
_CLAIMABLE_UNLIMITED = sa.text("status IN ('queued', 'failed') AND limit_key IS NULL")
_CLAIMABLE_LIMITED = sa.text("status IN ('queued', 'failed') AND limit_key IS NOT NULL")

#: MariaDB/MySQL: full Unicode, text keys compared byte for byte (as in sqlqueue/_schema.py).
_MYSQL_TABLE: dict[str, Any] = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def upgrade() -> None:
    op.add_column("sqlqueue_jobs", sa.Column("limit_key", _KEY, nullable=True))
    if op.get_bind().dialect.name in _MYSQL:
        op.drop_index("ix_sqlqueue_jobs_claim_by_status", table_name="sqlqueue_jobs")
        op.create_index(
            "ix_sqlqueue_jobs_claim_by_status",
            "sqlqueue_jobs",
            ["queue", "status", "limit_key", "priority", "next_run_at", "id"],
        )
        op.create_index(
            "ix_sqlqueue_jobs_limit_by_status",
            "sqlqueue_jobs",
            ["job_type", "limit_key", "status", "priority", "next_run_at", "id"],
        )
    else:
        _claim_index(_CLAIMABLE_UNLIMITED)
        op.create_index(
            "ix_sqlqueue_jobs_limit",
            "sqlqueue_jobs",
            ["job_type", "limit_key", "priority", "next_run_at", "id"],
            postgresql_where=_CLAIMABLE_LIMITED,
            sqlite_where=_CLAIMABLE_LIMITED,
        )
    op.add_column("sqlqueue_queues", sa.Column("max_running", sa.Integer(), nullable=True))
    op.create_table(
        "sqlqueue_limit_keys",
        sa.Column("job_type", sa.String(200), nullable=False),
        sa.Column("limit_key", _KEY, nullable=False),
        sa.PrimaryKeyConstraint("job_type", "limit_key", name="pk_sqlqueue_limit_keys"),
        **_MYSQL_TABLE,
    )


def downgrade() -> None:
    op.drop_table("sqlqueue_limit_keys")
    with op.batch_alter_table("sqlqueue_queues") as batch:
        batch.drop_column("max_running")
    if op.get_bind().dialect.name in _MYSQL:
        op.drop_index("ix_sqlqueue_jobs_limit_by_status", table_name="sqlqueue_jobs")
        op.drop_index("ix_sqlqueue_jobs_claim_by_status", table_name="sqlqueue_jobs")
        op.create_index(
            "ix_sqlqueue_jobs_claim_by_status",
            "sqlqueue_jobs",
            ["queue", "status", "priority", "next_run_at", "id"],
        )
    else:
        op.drop_index("ix_sqlqueue_jobs_limit", table_name="sqlqueue_jobs")
        _claim_index(_CLAIMABLE)
    with op.batch_alter_table("sqlqueue_jobs") as batch:
        batch.drop_column("limit_key")


def _claim_index(where: sa.TextClause) -> None:
    """The claim index again, over the claimable rows ``where`` says (PostgreSQL, SQLite)."""
    op.drop_index("ix_sqlqueue_jobs_claim", table_name="sqlqueue_jobs")
    op.create_index(
        "ix_sqlqueue_jobs_claim",
        "sqlqueue_jobs",
        ["queue", "priority", "next_run_at", "id"],
        postgresql_where=where,
        sqlite_where=where,
    )
