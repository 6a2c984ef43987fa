"""The database URL of ``--database-url`` made into an engine, or a usage error saying in one
line what is wrong with it and what to do (password hidden); and the ``--schema`` check."""

from __future__ import annotations

from sqlalchemy import Engine, create_engine
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from sqlqueue._errors import ConfigurationError, SchemaNotMigrated, UnsupportedDatabase
from sqlqueue._scrub import hide_passwords, password_of
from sqlqueue.cli._common import URL_VARIABLE, UsageError
from sqlqueue.dialects import dialect_for, driver_hint, with_driver

__all__ = ["check_schema", "open_engine"]


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
    problem = dialect.url_problem(engine.url)
    if problem is not None:
        engine.dispose()
        raise UsageError(f"--database-url: {shown!r} {problem}")
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
