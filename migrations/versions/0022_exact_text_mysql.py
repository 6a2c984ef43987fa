"""MariaDB/MySQL: text compares exactly, trailing spaces included.

Their ``utf8mb4_bin`` collation pads with spaces when it compares (``PAD SPACE``): ``'mail'`` and
``'mail '`` were one queue, so a worker on ``mail`` ran jobs enqueued to ``"mail "``; job types,
group, limit and unique keys, tags and every other name compared the same way. Every sqlqueue
table moves to its server's binary ``NO PAD`` collation (MariaDB ``utf8mb4_nopad_bin``, MySQL 8
``utf8mb4_0900_bin``): byte for byte, as PostgreSQL and SQLite compare (0011 did the same for
idempotency keys, with bytes). Nothing to do on the other backends.

``ALTER TABLE … CONVERT`` rebuilds each table: on a large jobs table it takes as long as a copy
of it, and no two values that differed become equal, so no unique index can break.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

#: The PAD SPACE collation the tables were created with (and go back to on downgrade).
_PADDED = "utf8mb4_bin"
#: The binary NO PAD collation of each server family, MariaDB's first.
_EXACT = ("utf8mb4_nopad_bin", "utf8mb4_0900_bin")


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "mysql":
        return
    _convert(bind, _exact(bind))


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "mysql":
        return
    _convert(bind, _PADDED)


def _exact(bind: sa.Connection) -> str:
    """The server's binary NO PAD collation of utf8mb4."""
    known = set(
        bind.execute(
            sa.text(
                "SELECT collation_name FROM information_schema.collations "
                "WHERE character_set_name = 'utf8mb4'"
            )
        ).scalars()
    )
    for name in _EXACT:
        if name in known:
            return name
    raise RuntimeError(f"this server has none of the collations {', '.join(_EXACT)}")


def _convert(bind: sa.Connection, collation: str) -> None:
    """Every sqlqueue table of the database to ``collation`` (its text columns too)."""
    tables = sorted(
        name for name in sa.inspect(bind).get_table_names() if name.startswith("sqlqueue_")
    )
    for table in tables:
        op.execute(f"ALTER TABLE `{table}` CONVERT TO CHARACTER SET utf8mb4 COLLATE {collation}")
