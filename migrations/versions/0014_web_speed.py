"""The web page's overview on a big history: the most frequent errors of unhandled failures
read from an index alone (SQLite), not from every dead job's row.

SQLite only: there an expression index covers its expression, so grouping the errors reads the
index; PostgreSQL would still visit each row for its visibility, and MariaDB has no partial
indexes (see sqlqueue/_schema.py).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_UNHANDLED_ERRORS = sa.text(
    "status IN ('failed', 'dead') AND last_error IS NOT NULL AND requeued_as IS NULL "
    "AND discarded_at IS NULL"
)


def _sqlite() -> bool:
    return op.get_bind().dialect.name == "sqlite"


def upgrade() -> None:
    if _sqlite():
        op.create_index(
            "ix_sqlqueue_jobs_unhandled_errors",
            "sqlqueue_jobs",
            [sa.text("substr(last_error, 1, 200)")],
            sqlite_where=_UNHANDLED_ERRORS,
        )


def downgrade() -> None:
    if _sqlite():
        op.drop_index("ix_sqlqueue_jobs_unhandled_errors", table_name="sqlqueue_jobs")
