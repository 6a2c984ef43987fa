"""Idempotency keys compared exactly on MariaDB/MySQL: ``"k"`` and ``"k "`` are two keys.

Their ``VARCHAR`` collations pad with spaces when they compare (``utf8mb4_bin`` too), so the
unique index took ``"k "`` for ``"k"``. The column becomes ``VARBINARY`` holding the key's
UTF-8 bytes (up to 4 a character: 255 characters fit), which compares byte for byte on MariaDB
and MySQL alike; existing keys keep their bytes. PostgreSQL and SQLite compare text exactly
already: nothing changes there.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.mysql import VARBINARY

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_MYSQL = ("mysql", "mariadb")


def upgrade() -> None:
    if op.get_bind().dialect.name in _MYSQL:
        op.alter_column(
            "sqlqueue_jobs",
            "idempotency_key",
            existing_type=sa.String(255),
            type_=VARBINARY(1020),
            existing_nullable=True,
        )


def downgrade() -> None:
    if op.get_bind().dialect.name in _MYSQL:
        op.alter_column(
            "sqlqueue_jobs",
            "idempotency_key",
            existing_type=VARBINARY(1020),
            type_=sa.String(255),
            existing_nullable=True,
        )
