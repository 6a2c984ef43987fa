"""What every ``sqlqueue`` command shares: the exit codes, the usage error, and the database
URL made into an engine (or a usage error saying what is wrong with it, password hidden)."""

from __future__ import annotations

import os

from sqlalchemy import Engine, create_engine
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from sqlqueue._errors import (
    ConfigurationError,
    SchemaNotMigrated,
    SqlqueueError,
    UnsupportedDatabase,
)
from sqlqueue._scrub import hide_passwords, password_of
from sqlqueue.dialects import dialect_for, driver_hint, with_driver

__all__ = [
    "EXIT_DATABASE",
    "EXIT_PROBLEM",
    "EXIT_USAGE",
    "SCHEMA_VARIABLE",
    "URL_VARIABLE",
    "UsageError",
    "check_schema",
    "open_engine",
    "schema_default",
    "url_default",
]

URL_VARIABLE = "SQLQUEUE_DATABASE_URL"
SCHEMA_VARIABLE = "SQLQUEUE_SCHEMA"

#: Exit codes shared by every command (``health`` exits 1 for an alarm).
EXIT_PROBLEM = 1
EXIT_USAGE = 2
EXIT_DATABASE = 3


class UsageError(SqlqueueError):
    """The command line is wrong: exit 2."""


def url_default() -> str | None:
    """The database URL when ``--database-url`` is not given: ``$SQLQUEUE_DATABASE_URL``."""
    return os.environ.get(URL_VARIABLE)


def schema_default() -> str | None:
    """The schema when ``--schema`` is not given: ``$SQLQUEUE_SCHEMA``, else none."""
    return os.environ.get(SCHEMA_VARIABLE) or None


def open_engine(url: str | None, *, existing: bool = False, schema: str | None = None) -> Engine:
    """An engine for ``url``, or a usage error saying what is wrong with it (no traceback).
    ``existing``: a SQLite file must be there already (reading must not create an empty one).
    ``schema``: the tables' schema, refused here if the database has no schemas."""
    if not url:
        raise UsageError(f"no database: pass --database-url or set {URL_VARIABLE}")
    shown = hide_passwords(url)
    password = password_of(url)
    if password is not None and "@" in password:
        # SQLAlchemy ends the password at its first "@" and takes the rest for the host: the
        # driver's error would then quote part of the password as a host name.
        raise UsageError(
            f"--database-url: the password in {shown!r} holds an unencoded '@': "
            "percent-encode it as %40"
        )
    try:
        engine = create_engine(with_driver(url))
    except (ArgumentError, NoSuchModuleError, ValueError) as error:
        raise UsageError(
            f"--database-url: cannot use {shown!r}: {hide_passwords(str(error))} (expected e.g. "
            "sqlite:///jobs.db, postgresql://user@host/db or mysql://user@host/db)"
        ) from None
    except ImportError as error:
        raise UsageError(
            f"--database-url: the driver for {shown!r} is not installed ({error}): "
            f"{driver_hint(with_driver(url))}"
        ) from None
    try:
        dialect = dialect_for(engine)
    except UnsupportedDatabase as error:
        engine.dispose()
        raise UsageError(f"--database-url: {error}") from None
    try:
        check_schema(engine, schema)
    except UsageError:
        engine.dispose()
        raise
    missing = dialect.missing_database(engine.url) if existing else None
    if missing is not None:
        engine.dispose()
        raise SchemaNotMigrated(
            f"{missing}; create it with `sqlqueue migrate --database-url {shown}`"
        )
    return engine


def check_schema(engine: Engine, schema: str | None) -> None:
    """A usage error if ``engine``'s database cannot keep sqlqueue's tables in ``schema``."""
    try:
        dialect_for(engine, schema)
    except (UnsupportedDatabase, ConfigurationError) as error:
        raise UsageError(f"--schema: {error}") from None
