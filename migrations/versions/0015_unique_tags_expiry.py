"""Unique jobs, tags and expiry: each job's unique key, a table of keys whose rows enqueuers
lock in turn, a table of job tags, and each job's expiry.

``sqlqueue_jobs.unique_key`` holds the SHA-256 hex digest of a unique job's task, ``Unique.by``
values and period bucket, indexed with the status (partial where the backend allows). The
``sqlqueue_unique_keys`` table has one row per key: an enqueue writes it if absent and locks it,
so concurrent enqueuers of one key take turns and the database decides (see
sqlqueue/_store/unique.py). Existing jobs get no key: none of them is unique.
``sqlqueue_jobs.expires_at``: a job not started by then is cancelled (reason ``expired``);
indexed with the status for the worker upkeep that cancels them. Existing jobs never expire.
``sqlqueue_job_tags``: one row per job and tag, keyed by (tag, job id), indexed by job id.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.mysql import DATETIME

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

_UNIQUE = sa.text("unique_key IS NOT NULL")
_EXPIRING = sa.text("expires_at IS NOT NULL")
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_TIME = sa.DateTime(timezone=True).with_variant(DATETIME(fsp=6), "mysql", "mariadb")

#: MariaDB/MySQL: full Unicode, text keys compared byte for byte (as in sqlqueue/_schema.py).
_MYSQL_TABLE: dict[str, Any] = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def upgrade() -> None:
    with op.batch_alter_table("sqlqueue_jobs") as batch:
        batch.add_column(sa.Column("unique_key", sa.String(64), nullable=True))
        batch.add_column(sa.Column("expires_at", _TIME, nullable=True))
    op.create_index(
        "ix_sqlqueue_jobs_unique_key",
        "sqlqueue_jobs",
        ["unique_key", "status"],
        postgresql_where=_UNIQUE,
        sqlite_where=_UNIQUE,
    )
    op.create_index(
        "ix_sqlqueue_jobs_expires",
        "sqlqueue_jobs",
        ["expires_at", "status"],
        postgresql_where=_EXPIRING,
        sqlite_where=_EXPIRING,
    )
    op.create_table(
        "sqlqueue_unique_keys",
        sa.Column("key", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("key", name="pk_sqlqueue_unique_keys"),
        **_MYSQL_TABLE,
    )

    op.create_table(
        "sqlqueue_job_tags",
        sa.Column("tag", sa.String(100), nullable=False),
        sa.Column("job_id", _ID, nullable=False),
        sa.PrimaryKeyConstraint("tag", "job_id", name="pk_sqlqueue_job_tags"),
        **_MYSQL_TABLE,
    )
    op.create_index("ix_sqlqueue_job_tags_job", "sqlqueue_job_tags", ["job_id"])


def downgrade() -> None:
    op.drop_index("ix_sqlqueue_job_tags_job", table_name="sqlqueue_job_tags")
    op.drop_table("sqlqueue_job_tags")
    op.drop_table("sqlqueue_unique_keys")
    op.drop_index("ix_sqlqueue_jobs_expires", table_name="sqlqueue_jobs")
    op.drop_index("ix_sqlqueue_jobs_unique_key", table_name="sqlqueue_jobs")
    with op.batch_alter_table("sqlqueue_jobs") as batch:
        batch.drop_column("expires_at")
        batch.drop_column("unique_key")
