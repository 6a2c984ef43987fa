"""The effects table of the flaky-database process test (tests/apps/flaky_app.py): one row
per effect a handler committed in its job's own transaction."""

from __future__ import annotations

import sqlalchemy as sa

__all__ = ["EFFECTS", "create_effects"]

_metadata = sa.MetaData()

#: One row per effect a handler committed: (job_id, attempt, pid).
EFFECTS = sa.Table(
    "test_flaky_effects",
    _metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.BigInteger, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
)


def create_effects(engine: sa.Engine) -> None:
    """Create the effects table (the test owns it)."""
    _metadata.create_all(engine)
