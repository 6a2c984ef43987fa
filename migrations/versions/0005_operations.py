"""Operations: dead jobs marked handled, paused queues, one-at-a-time duties, counts of the
finished history folded into a table, and the indexes that keep operator queries off it.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.mysql import DATETIME

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_TIME = sa.DateTime(timezone=True).with_variant(DATETIME(fsp=6), "mysql", "mariadb")
_FINISHED = sa.text("finished_at IS NOT NULL")
_UNHANDLED_DEAD = sa.text("status = 'dead' AND requeued_as IS NULL AND discarded_at IS NULL")

#: MariaDB/MySQL: full Unicode, text keys compared byte for byte (as in sqlqueue/_schema.py).
_MYSQL_TABLE: dict[str, Any] = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def upgrade() -> None:
    # A dead job "discarded" by a person: handled without running it; it stays dead.
    with op.batch_alter_table("sqlqueue_jobs") as batch:
        batch.add_column(sa.Column("discarded_at", _TIME, nullable=True))
        batch.add_column(sa.Column("discarded_by", sa.String(255), nullable=True))
        batch.add_column(sa.Column("discard_reason", sa.Text(), nullable=True))
    # Counts by status, queue and job type read this index alone (no table rows).
    op.drop_index("ix_sqlqueue_jobs_status", table_name="sqlqueue_jobs")
    op.create_index("ix_sqlqueue_jobs_status", "sqlqueue_jobs", ["status", "queue", "job_type"])
    # Retention, "dead in the last hour" and the counts of recently finished jobs: finished jobs
    # by when they finished, with their queue and type (counted from the index alone).
    op.create_index(
        "ix_sqlqueue_jobs_finished",
        "sqlqueue_jobs",
        ["status", "finished_at", "queue", "job_type"],
        postgresql_where=_FINISHED,
        sqlite_where=_FINISHED,
    )
    # Dead jobs waiting for a person: what requeue_where, discard_where and the top errors read.
    op.create_index(
        "ix_sqlqueue_jobs_unhandled_dead",
        "sqlqueue_jobs",
        ["id"],
        postgresql_where=_UNHANDLED_DEAD,
        sqlite_where=_UNHANDLED_DEAD,
    )
    op.create_table(
        "sqlqueue_queues",
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("paused_at", _TIME, nullable=True),
        sa.Column("paused_by", sa.String(255), nullable=True),
        sa.Column("pause_reason", sa.Text(), nullable=True),
        sa.Column("updated_at", _TIME, nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_sqlqueue_queues"),
        **_MYSQL_TABLE,
    )
    op.create_table(
        "sqlqueue_finished_counts",
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("queue", sa.String(100), nullable=False),
        sa.Column("job_type", sa.String(200), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("status", "queue", "job_type", name="pk_sqlqueue_finished_counts"),
        **_MYSQL_TABLE,
    )
    op.create_table(
        "sqlqueue_count_marks",
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("folded_until", _TIME, nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_sqlqueue_count_marks"),
        **_MYSQL_TABLE,
    )
    op.create_table(
        "sqlqueue_duties",
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("holder", sa.String(255), nullable=False),
        sa.Column("expires_at", _TIME, nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_sqlqueue_duties"),
        **_MYSQL_TABLE,
    )


def downgrade() -> None:
    op.drop_table("sqlqueue_duties")
    op.drop_table("sqlqueue_count_marks")
    op.drop_table("sqlqueue_finished_counts")
    op.drop_table("sqlqueue_queues")
    op.drop_index("ix_sqlqueue_jobs_unhandled_dead", table_name="sqlqueue_jobs")
    op.drop_index("ix_sqlqueue_jobs_finished", table_name="sqlqueue_jobs")
    op.drop_index("ix_sqlqueue_jobs_status", table_name="sqlqueue_jobs")
    op.create_index("ix_sqlqueue_jobs_status", "sqlqueue_jobs", ["status", "job_type"])
    with op.batch_alter_table("sqlqueue_jobs") as batch:
        batch.drop_column("discard_reason")
        batch.drop_column("discarded_by")
        batch.drop_column("discarded_at")
