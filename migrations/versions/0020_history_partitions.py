"""The finished history of PostgreSQL in a table partitioned by day.

``sqlqueue_jobs_history`` has the columns of ``sqlqueue_jobs``, no keys, and one partition per
UTC day of ``finished_at``, created by the workers as they move succeeded jobs into it (see
sqlqueue/_store/history.py); retention drops whole days. Created on PostgreSQL only: SQLite and
MariaDB keep finished jobs in ``sqlqueue_jobs`` and prune them in batches. The downgrade moves
every job in the history back into ``sqlqueue_jobs`` (those of day tables detached by hand too)
before it drops the tables, so nothing is lost.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

#: The day tables, attached or not (retention drops its days in one ``DROP TABLE``, so a
#: detached one was detached by hand, and its jobs are kept as the attached days' are).
_DAY_TABLES = (
    "SELECT c.relname, i.inhrelid IS NOT NULL AS attached "
    "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "LEFT JOIN pg_inherits i ON i.inhrelid = c.oid "
    "WHERE n.nspname = current_schema() AND c.relkind = 'r' "
    "AND c.relname LIKE 'sqlqueue\\_jobs\\_history\\_p%'"
)


def _columns() -> list[sa.Column[object]]:
    """The columns of ``sqlqueue_jobs`` as of 0019, in their order (the mover inserts what its
    DELETE returns), ``finished_at`` required."""
    return [
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("job_type", sa.String(200), nullable=False),
        sa.Column("queue", sa.String(100), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("payload", JSONB(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("next_run_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("errors", JSONB(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("idempotency_key", sa.String(255), nullable=True),
        sa.Column("locked_by", sa.String(255), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("requeued_from", sa.BigInteger(), nullable=True),
        sa.Column("requeued_as", sa.BigInteger(), nullable=True),
        sa.Column("requeued_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("requeued_by", sa.String(255), nullable=True),
        sa.Column("requeue_reason", sa.Text(), nullable=True),
        sa.Column("result", JSONB(), nullable=True),
        sa.Column("progress", JSONB(), nullable=True),
        sa.Column("group_key", sa.String(255), nullable=True),
        sa.Column("cancel_requested_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("discarded_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("discarded_by", sa.String(255), nullable=True),
        sa.Column("discard_reason", sa.Text(), nullable=True),
        sa.Column("trace_context", sa.Text(), nullable=True),
        sa.Column("batch_id", sa.BigInteger(), nullable=True),
        sa.Column("limit_key", sa.String(255), nullable=True),
        sa.Column("unique_key", sa.String(64), nullable=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
    ]


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.create_table(
        "sqlqueue_jobs_history", *_columns(), postgresql_partition_by="RANGE (finished_at)"
    )
    op.create_index("ix_sqlqueue_jobs_history_id", "sqlqueue_jobs_history", ["id"])
    op.create_index(
        "ix_sqlqueue_jobs_history_finished",
        "sqlqueue_jobs_history",
        ["finished_at"],
    )


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    quote = bind.dialect.identifier_preparer.quote
    columns = ", ".join(quote(column.name) for column in _columns())
    back = "INSERT INTO sqlqueue_jobs ({columns}) SELECT {columns} FROM {table}"
    bind.execute(sa.text(back.format(columns=columns, table="sqlqueue_jobs_history")))
    for name, attached in bind.execute(sa.text(_DAY_TABLES)).all():
        if not attached:
            bind.execute(sa.text(back.format(columns=columns, table=quote(name))))
        op.drop_table(name)
    op.drop_table("sqlqueue_jobs_history")
