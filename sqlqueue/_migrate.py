"""Schema migrations: run sqlqueue's alembic revisions against a database.

The revisions live in the repository's top-level ``migrations/`` and are shipped inside the
wheel as ``sqlqueue/_migrations``, so an installed package can migrate on its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine, create_engine

from sqlqueue._errors import ConfigurationError
from sqlqueue._store.transactions import translated
from sqlqueue.dialects import Dialect, dialect_for, with_driver

if TYPE_CHECKING:
    from alembic.config import Config

# alembic is imported where a migration runs, not with sqlqueue: it costs an app (and every
# ``sqlqueue`` command) about 0.4 s of start-up that only ``migrate`` needs.

__all__ = ["migrate", "migrations_dir", "upgrade"]


def migrations_dir() -> Path:
    """Where the revisions are: inside the installed wheel, or the source checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "_migrations", here.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise ConfigurationError(  # pragma: no cover - a broken install
        "sqlqueue's migrations are missing from this installation; reinstall sqlalchemy-sqlqueue"
    )


def alembic_config(connection: Connection, schema: str | None = None) -> Config:
    """An alembic config for sqlqueue's revisions that runs on ``connection``, keeping the
    version table in ``schema`` (see ``migrations/env.py``)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.attributes["connection"] = connection
    config.attributes["schema"] = schema
    return config


@contextmanager
def _host_alembic_kept() -> Iterator[None]:
    """Leave a host's running alembic usable after ours ran inside it (e.g. from its env.py).

    alembic publishes the running environment as module-level proxies (``alembic.context``,
    ``alembic.op``) and deletes them when a run ends; without reinstalling the host's, its env.py
    would lose ``context`` and its command would fail with ``KeyError`` as it exits.
    """
    from alembic import context, op

    outer = [getattr(module, "_proxy", None) for module in (context, op)]
    try:
        yield
    finally:
        for proxy in outer:
            if proxy is not None:
                proxy._install_proxy()


def migrate(
    target: Engine | Connection | str, *, revision: str = "head", schema: str | None = None
) -> None:
    """Bring sqlqueue's tables to ``revision`` (the latest by default); safe to run repeatedly.

    The revisions run in one write transaction, so a failure leaves nothing half done (SQLite
    included: its DDL is transactional once the dialect has begun the transaction). Given a
    ``Connection`` with a transaction already open, they run inside it and the caller commits.

    ``schema`` (PostgreSQL): create the tables, and sqlqueue's version table, in that schema
    (created if missing) instead of the connection's default one; a ``Queue(…, schema=…)``
    then uses them.
    """
    if isinstance(target, str):
        target = create_engine(with_driver(target))
    engine = target if isinstance(target, Engine) else target.engine
    dialect = dialect_for(engine, schema)
    dialect.check_url(engine.url)
    dialect.prepare_engine(engine)
    upgrade(target, dialect, revision=revision, schema=schema)


def upgrade(
    target: Engine | Connection, dialect: Dialect, *, revision: str = "head", schema: str | None
) -> None:
    """:func:`migrate` on an engine ``dialect`` has prepared, or one that must be left as it
    is: a framework's connection lent to sqlqueue, whose transactions are its owner's."""
    from alembic import command

    engine = target if isinstance(target, Engine) else target.engine

    def run_revisions(conn: Connection) -> None:
        with dialect.migrating_in_schema(conn):
            command.upgrade(alembic_config(conn, schema), revision)

    def upgrade_in_own_transaction(conn: Connection) -> None:
        dialect.begin_write(conn)
        try:
            # Committed before the lock is let go: MariaDB's lock is the session's, and a
            # migrator let in before the last revision's version row committed read the one
            # before it and ran that revision again ("Duplicate key name").
            with dialect.migration_lock(conn):
                run_revisions(conn)
                conn.commit()
        except BaseException:
            conn.rollback()
            raise

    def run() -> None:
        if isinstance(target, Engine):
            with engine.connect() as conn:
                upgrade_in_own_transaction(conn)
        elif target.in_transaction():
            # A savepoint keeps the revisions all-or-nothing inside the caller's transaction;
            # on SQLite it also opens the transaction that the driver leaves DDL outside of.
            with target.begin_nested(), dialect.migration_lock(target):
                run_revisions(target)
        else:
            upgrade_in_own_transaction(target)

    with _host_alembic_kept():
        translated(dialect, run)
