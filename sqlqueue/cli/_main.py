"""The ``sqlqueue`` command: ``migrate`` the schema, run a ``worker``, and operate the queue
(``stats``, ``health``, ``jobs``, ``dead``, ``cancel``, ``prune``, ``pause``, ``resume``), and
serve the internal ``web`` page.

The database comes from ``--database-url`` or ``SQLQUEUE_DATABASE_URL``, the schema of
sqlqueue's tables in it from ``--schema`` or ``SQLQUEUE_SCHEMA`` (PostgreSQL; default: the
connection's); a worker uses the engine and schema of the :class:`~sqlqueue.Queue` it is pointed
at (``module:attribute``) unless given others.
Every command prints an error as one line and exits with the same codes: 0 success, 1 the
command found a problem (``health``: an alarm; a job that is not there or not in a state for the
action), 2 a usage error (a bad option, URL or value), 3 the database cannot be reached or is not
migrated.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from sqlqueue._errors import ConfigurationError, DatabaseError, SqlqueueError
from sqlqueue._logs import configure_logging
from sqlqueue._migrate import migrate
from sqlqueue._queue import Queue
from sqlqueue._schema import SCHEMA_REVISION
from sqlqueue.cli._common import (
    EXIT_DATABASE,
    EXIT_PROBLEM,
    EXIT_USAGE,
    UsageError,
    check_schema,
    open_engine,
)
from sqlqueue.cli._parser import build_parser
from sqlqueue.cli._worker_cmd import run_worker

__all__ = ["main"]


def main(
    argv: Sequence[str] | None = None, *, queue: Queue | None = None, prog: str = "sqlqueue"
) -> int:
    """Entry point of the ``sqlqueue`` command; returns the exit status.

    Frameworks' commands (``flask sqlqueue …``, ``manage.py sqlqueue_migrate``) run the same
    commands through here with the app's ``queue`` (its engine is used and never disposed)
    and their own ``prog``. Output cut short by its reader (``sqlqueue stats | head -1``)
    ends quietly with 0: the reader had what it wanted."""
    try:
        status = _main(argv, queue, prog)
        sys.stdout.flush()  # here, not at exit, where a closed pipe would print a traceback
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's last flush goes nowhere
        return 0
    return status


def _main(argv: Sequence[str] | None, given: Queue | None, prog: str) -> int:
    args = build_parser(prog, given=given is not None).parse_args(argv)
    args.log_filter = configure_logging(args.log_level, getattr(args, "log_format", "text"))
    try:
        return _run(args, given)
    except (UsageError, ConfigurationError) as error:
        return _fail(error, EXIT_USAGE)
    except DatabaseError as error:
        return _fail(error, EXIT_DATABASE)
    except SqlqueueError as error:
        return _fail(error, EXIT_PROBLEM)


def _fail(error: SqlqueueError, status: int) -> int:
    print(f"sqlqueue: error: {error}", file=sys.stderr)
    return status


def _run(args: argparse.Namespace, given: Queue | None = None) -> int:
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
    nothing to do (alembic's own log of each revision only with ``--verbose``)."""
    if not args.verbose:
        logging.getLogger("alembic").setLevel(logging.WARNING)
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
