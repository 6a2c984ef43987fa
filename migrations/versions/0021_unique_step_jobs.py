"""A job is the step of at most one workflow: the index that finds a job's step becomes unique.

Every step has a job of its own (a requeue moves the step to the new job), so no existing row
breaks it. What it buys is the planner's estimate: ``job_id IN (…)`` on a unique index is known
to match at most one row per value, so the statement that releases the steps after those that
ended reads the steps table by index even before PostgreSQL has statistics for it (a fresh
table, autovacuum off or not run yet), where it scanned the whole table before.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

_TABLE = "sqlqueue_workflow_steps"
_OLD = "ix_sqlqueue_workflow_steps_job"
_NEW = "uq_sqlqueue_workflow_steps_job"


def upgrade() -> None:
    op.create_index(_NEW, _TABLE, ["job_id"], unique=True)
    op.drop_index(_OLD, table_name=_TABLE)


def downgrade() -> None:
    op.create_index(_OLD, _TABLE, ["job_id"])
    op.drop_index(_NEW, table_name=_TABLE)
