"""The parsed command run: ``migrate``, ``worker``, and every other command on a
:class:`~sqlqueue.Queue` of the database. ``_main`` imports this module only once the
arguments are parsed, so SQLAlchemy, the drivers and alembic load with a command that needs
them, never for ``--version``, ``--help`` or a usage error."""

from __future__ import annotations

import argparse
import logging

from sqlqueue._logs import configure_logging
from sqlqueue._migrate import migrate
from sqlqueue._queue import Queue
from sqlqueue._schema import SCHEMA_REVISION
from sqlqueue.cli._engine import check_schema, open_engine
from sqlqueue.cli._worker_cmd import run_worker

__all__ = ["run"]


def run(args: argparse.Namespace, given: Queue | None = None) -> int:
    """Run the command ``args`` describe (on ``given``, a framework's app's Queue, when there
    is one) and return its exit status. alembic's log (of ``migrate``, or of an app's
    ``sqlqueue.migrate()`` as a worker imports it) is shown only with ``--verbose``."""
    args.log_filter = configure_logging(args.log_level, getattr(args, "log_format", "text"))
    if not getattr(args, "verbose", False):
        logging.getLogger("alembic").setLevel(logging.WARNING)
    if args.command == "migrate":
        return _migrate(args, given)
    if args.command == "worker":
        return run_worker(args, given)
    if given is not None and not args.database_url:
        schema = given.schema if args.schema is None else args.schema
        check_schema(given.engine, schema)
        queue = given if schema == given.schema else given.rebind(given.engine, schema=schema)
        queue.admin.require_schema(SCHEMA_REVISION)
        given_status: int = args.operate(queue, args)
        return given_status
    engine = open_engine(args.database_url, existing=True, schema=args.schema)
    try:
        queue = Queue(engine, schema=args.schema)
        queue.admin.require_schema(SCHEMA_REVISION)
        status: int = args.operate(queue, args)
        return status
    finally:
        engine.dispose()


def _migrate(args: argparse.Namespace, given: Queue | None = None) -> int:
    """Migrate, and say so in one line: from which revision to which, or that there was
    nothing to do."""
    schema = args.schema
    if given is not None and not args.database_url:
        schema = given.schema if schema is None else schema
        check_schema(given.engine, schema)
        engine = given.engine
    else:
        engine = open_engine(args.database_url, schema=schema)
    try:
        admin = Queue(engine, schema=schema).admin
        before = admin.schema_revision()
        migrate(engine, schema=schema)
        after = admin.schema_revision()
    finally:
        if engine is not getattr(given, "engine", None):
            engine.dispose()
    where = "" if schema is None else f" (schema {schema!r})"
    if before == after:
        print(f"sqlqueue: already up to date at revision {after}{where}")
    else:
        print(f"sqlqueue: migrated from {before or 'an empty database'} to {after}{where}")
    return 0
