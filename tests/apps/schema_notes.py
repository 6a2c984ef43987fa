"""The app's own table in the schema tests: which schema's worker ran each ``note`` job."""

from __future__ import annotations

import sqlalchemy as sa

NOTES = sa.Table(
    "schema_notes",
    sa.MetaData(),
    sa.Column("job_id", sa.BigInteger, nullable=False),
    sa.Column("schema", sa.String(63), nullable=True),
    sa.Column("label", sa.String(100), nullable=False),
)
