"""The overview's top errors without reading every dead job: a rollup of the errors of
unhandled dead jobs, by their first 200 characters, folded with the finished counts.

``sqlqueue_error_counts`` has one row per error group. The upgrade counts in the unhandled dead
jobs that finished before the finished counts' mark (those the rollup already holds), under
that mark's lock, so the rollup and the mark agree from the first read on; later folds count
in the jobs that die after it (sqlqueue/_store/error_counts.py). 0014's SQLite index on the
errors of unhandled failures goes: nothing reads it any more, and every failure wrote it.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-02
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.mysql import VARBINARY

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

#: An error group: compared exactly everywhere (VARBINARY of its UTF-8 bytes on MariaDB/MySQL).
_ERROR = sa.String(200).with_variant(VARBINARY(800), "mysql", "mariadb")
_MYSQL_TABLE: dict[str, Any] = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}

#: 0014's index (SQLite only).
_SQLITE_INDEX = "ix_sqlqueue_jobs_unhandled_errors"
#: The rollup's mark, locked where the backend has row locks (SQLite: the migration's write
#: lock), so no fold moves it while the dead jobs before it are counted.
_LOCK_MARK = "SELECT folded_until FROM sqlqueue_count_marks WHERE name = 'finished'"
_COUNT_BEFORE_MARK = (
    "INSERT INTO sqlqueue_error_counts (error, count) "
    "SELECT substr(last_error, 1, 200), count(*) FROM sqlqueue_jobs "
    "WHERE status = 'dead' AND last_error IS NOT NULL AND requeued_as IS NULL "
    "AND discarded_at IS NULL AND finished_at < :mark "
    "GROUP BY substr(last_error, 1, 200)"
)


def upgrade() -> None:
    op.create_table(
        "sqlqueue_error_counts",
        sa.Column("error", _ERROR, nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("error", name="pk_sqlqueue_error_counts"),
        **_MYSQL_TABLE,
    )
    bind = op.get_bind()
    if bind.dialect.name == "sqlite":
        op.drop_index(_SQLITE_INDEX, table_name="sqlqueue_jobs")
    lock = _LOCK_MARK if bind.dialect.name == "sqlite" else _LOCK_MARK + " FOR UPDATE"
    mark = bind.execute(sa.text(lock)).scalar()
    if mark is not None:
        bind.execute(sa.text(_COUNT_BEFORE_MARK), {"mark": mark})


def downgrade() -> None:
    op.drop_table("sqlqueue_error_counts")
    if op.get_bind().dialect.name == "sqlite":
        op.create_index(
            _SQLITE_INDEX,
            "sqlqueue_jobs",
            [sa.text("substr(last_error, 1, 200)")],
            sqlite_where=sa.text(
                "status IN ('failed', 'dead') AND last_error IS NOT NULL AND requeued_as IS NULL "
                "AND discarded_at IS NULL"
            ),
        )
