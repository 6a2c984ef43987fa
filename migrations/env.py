"""Alembic environment for sqlqueue's own revisions.

sqlqueue keeps its history in its own version table (``sqlqueue_alembic_version``) so it never
tangles with the host application's alembic history. ``sqlqueue.migrate`` passes a live
connection in ``config.attributes["connection"]``, and in ``config.attributes["schema"]`` the
schema the tables go to (the version table with them; the connection's ``search_path`` already
points there, see ``Dialect.migrating_in_schema``); the plain ``alembic`` command line works
too, with ``sqlalchemy.url`` set, for the default schema.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine

from sqlqueue._schema import VERSION_TABLE, metadata

config = context.config


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        version_table_schema=config.attributes.get("schema"),
        include_name=lambda name, type_, parent: (
            type_ != "table" or name is None or name.startswith("sqlqueue_")
        ),
    )
    with context.begin_transaction():
        context.run_migrations()


def _main() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit("set sqlalchemy.url, or run `sqlqueue migrate --database-url URL`")
    engine = create_engine(url)
    with engine.connect() as conn:
        _run(conn)
        conn.commit()


_main()
