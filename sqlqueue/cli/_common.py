"""What every ``sqlqueue`` command shares: the exit codes, the usage error, and where the
database URL and schema come from when no option gives them. Loaded to build the parser, so
nothing here imports SQLAlchemy (the URL is made into an engine by ``_engine``)."""

from __future__ import annotations

import os

from sqlqueue._errors import SqlqueueError

__all__ = [
    "EXIT_DATABASE",
    "EXIT_PROBLEM",
    "EXIT_USAGE",
    "SCHEMA_VARIABLE",
    "URL_VARIABLE",
    "UsageError",
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
