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

import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sqlqueue._errors import ConfigurationError, DatabaseError, SqlqueueError
from sqlqueue.cli._common import EXIT_DATABASE, EXIT_PROBLEM, EXIT_USAGE, UsageError
from sqlqueue.cli._parser import build_parser

if TYPE_CHECKING:
    from sqlqueue._queue import Queue

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
    try:
        # Only now, past --version, --help and the parser's usage errors: SQLAlchemy, the
        # drivers and alembic load with the command that needs them.
        from sqlqueue.cli._run import run

        return run(args, given)
    except (UsageError, ConfigurationError) as error:
        return _fail(error, EXIT_USAGE)
    except DatabaseError as error:
        return _fail(error, EXIT_DATABASE)
    except SqlqueueError as error:
        return _fail(error, EXIT_PROBLEM)


def _fail(error: SqlqueueError, status: int) -> int:
    print(f"sqlqueue: error: {error}", file=sys.stderr)
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
