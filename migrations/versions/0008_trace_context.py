"""The W3C trace context of the code that enqueued each job, so its attempts join that trace.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A JSON carrier ({"traceparent": …, "tracestate": …}) as text; NULL without a trace.
    with op.batch_alter_table("sqlqueue_jobs") as batch:
        batch.add_column(sa.Column("trace_context", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sqlqueue_jobs") as batch:
        batch.drop_column("trace_context")
