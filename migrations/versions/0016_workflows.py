"""Workflows: batches whose children wait for each other. A new job status ``waiting`` (a step
whose upstream steps have not all ended), the on-dead policy on the batch row that makes it a
workflow, and the tables of a workflow's steps and edges.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-01
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.mysql import VARBINARY

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
#: A step name: compared exactly everywhere (VARBINARY of its UTF-8 bytes on MariaDB/MySQL).
_NAME = sa.String(200).with_variant(VARBINARY(800), "mysql", "mariadb")
_MYSQL_TABLE: dict[str, Any] = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}

#: 0014's index on SQLite, on an expression (see ``_statuses``).
_UNHANDLED_ERRORS_INDEX = "ix_sqlqueue_jobs_unhandled_errors"

_OLD = "status IN ('queued', 'running', 'succeeded', 'failed', 'dead', 'cancelled')"
_NEW = "status IN ('queued', 'running', 'succeeded', 'failed', 'dead', 'cancelled', 'waiting')"


def _statuses(check: str) -> None:
    """Replace the jobs' status check (SQLite rebuilds the table and its indexes)."""
    name = op.f("ck_sqlqueue_jobs_status")
    if op.get_bind().dialect.name == "sqlite":
        # The rebuild copies the indexes SQLAlchemy can reflect, and an index on an expression
        # is not one of them (it would warn and drop it): 0014's goes first and comes back as
        # 0014 made it.
        op.drop_index(_UNHANDLED_ERRORS_INDEX, table_name="sqlqueue_jobs")
        with op.batch_alter_table("sqlqueue_jobs", recreate="always") as batch:
            batch.drop_constraint(name, type_="check")
            batch.create_check_constraint(name, sa.text(check))
        op.create_index(
            _UNHANDLED_ERRORS_INDEX,
            "sqlqueue_jobs",
            [sa.text("substr(last_error, 1, 200)")],
            sqlite_where=sa.text(
                "status IN ('failed', 'dead') AND last_error IS NOT NULL AND requeued_as IS NULL "
                "AND discarded_at IS NULL"
            ),
        )
        return
    op.drop_constraint(name, "sqlqueue_jobs", type_="check")
    op.create_check_constraint(name, "sqlqueue_jobs", sa.text(check))


def upgrade() -> None:
    _statuses(_NEW)
    op.add_column("sqlqueue_batches", sa.Column("workflow_on_dead", sa.String(16), nullable=True))
    op.create_table(
        "sqlqueue_workflow_steps",
        sa.Column("workflow_id", _ID, nullable=False),
        sa.Column("name", _NAME, nullable=False),
        sa.Column("job_id", _ID, nullable=False),
        sa.Column("waiting_on", sa.Integer(), nullable=False),
        sa.Column("settled", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("workflow_id", "name", name="pk_sqlqueue_workflow_steps"),
        **_MYSQL_TABLE,
    )
    op.create_index("ix_sqlqueue_workflow_steps_job", "sqlqueue_workflow_steps", ["job_id"])
    op.create_table(
        "sqlqueue_workflow_edges",
        sa.Column("workflow_id", _ID, nullable=False),
        sa.Column("upstream", _NAME, nullable=False),
        sa.Column("downstream", _NAME, nullable=False),
        sa.PrimaryKeyConstraint(
            "workflow_id", "upstream", "downstream", name="pk_sqlqueue_workflow_edges"
        ),
        **_MYSQL_TABLE,
    )
    op.create_index(
        "ix_sqlqueue_workflow_edges_downstream",
        "sqlqueue_workflow_edges",
        ["workflow_id", "downstream"],
    )


def downgrade() -> None:
    op.drop_index("ix_sqlqueue_workflow_edges_downstream", table_name="sqlqueue_workflow_edges")
    op.drop_table("sqlqueue_workflow_edges")
    op.drop_index("ix_sqlqueue_workflow_steps_job", table_name="sqlqueue_workflow_steps")
    op.drop_table("sqlqueue_workflow_steps")
    op.drop_column("sqlqueue_batches", "workflow_on_dead")
    op.execute(sa.text("DELETE FROM sqlqueue_jobs WHERE status = 'waiting'"))
    _statuses(_OLD)
