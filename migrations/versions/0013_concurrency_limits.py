"""Concurrency limits: the key a limited task's job runs under, a lock row per (task, key) that
limited claims hold while they count, and a queue's limit of running jobs.

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
_LIMITED = sa.text("limit_key IS NOT NULL")

#: MariaDB/MySQL: full Unicode, text keys compared byte for byte (as in sqlqueue/_schema.py).
_MYSQL_TABLE: dict[str, Any] = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def upgrade() -> None:
    op.add_column("sqlqueue_jobs", sa.Column("limit_key", _KEY, nullable=True))
    op.create_index(
        "ix_sqlqueue_jobs_limit",
        "sqlqueue_jobs",
        ["job_type", "limit_key", "status", "priority", "next_run_at"],
        postgresql_where=_LIMITED,
        sqlite_where=_LIMITED,
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
    op.drop_index("ix_sqlqueue_jobs_limit", table_name="sqlqueue_jobs")
    with op.batch_alter_table("sqlqueue_jobs") as batch:
        batch.drop_column("limit_key")
