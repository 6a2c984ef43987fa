"""The finished history of PostgreSQL in a table partitioned by day.

``sqlqueue_jobs_history`` has the columns of ``sqlqueue_jobs``, no keys, and one partition per
UTC day of ``finished_at``, created by the workers as they move succeeded jobs into it (see
sqlqueue/_store/history.py); retention drops whole days. Created on PostgreSQL only: SQLite and
MariaDB keep finished jobs in ``sqlqueue_jobs`` and prune them in batches. The downgrade moves
every job in the history back into ``sqlqueue_jobs`` before it drops the table, so nothing is
lost.

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

_BACK = "INSERT INTO sqlqueue_jobs SELECT * FROM sqlqueue_jobs_history"
#: Tables detached by a retention pass that stopped before dropping them: their jobs were
#: past retention already, so they go with the history.
_LEFTOVERS = (
    "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
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
    bind.execute(sa.text(_BACK))
    for (name,) in bind.execute(sa.text(_LEFTOVERS)).all():
        if name != "sqlqueue_jobs_history":
            op.drop_table(name)
    op.drop_table("sqlqueue_jobs_history")
