"""``python manage.py sqlqueue_migrate [--database ALIAS]``: create or upgrade sqlqueue's tables
in a database of Django's ``DATABASES``, as ``sqlqueue migrate`` does (same code, same output).

``manage.py migrate`` does it already (sqlqueue's Django migration); this command stays for
what that does not cover: a ``--schema`` of PostgreSQL, a database Django's routers keep
sqlqueue's app out of. sqlqueue keeps its own version table, so Django's migrations and
sqlqueue's never mix. In a test (a ``TestCase``, Django's in-memory SQLite test database) it
migrates on the test's own connection, as the Django migration does.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import DEFAULT_DB_ALIAS, connections

from sqlqueue.cli import main
from sqlqueue.django import queue
from sqlqueue.django._shared import shares
from sqlqueue.django._tables import migrate_connection

__all__ = ["Command"]


class Command(BaseCommand):
    """Migrate sqlqueue's tables in ``DATABASES[--database]``."""

    help = "Create or upgrade sqlqueue's tables in a database of DATABASES."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--database",
            default=DEFAULT_DB_ALIAS,
            help='the alias in DATABASES (default: "default")',
        )
        parser.add_argument(
            "--schema",
            help="the PostgreSQL schema of sqlqueue's tables (default: the search path's)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        alias = options["database"]
        if shares(connections[alias]):
            # In a test: on the test's own connection, as sqlqueue's Django migration does.
            lent = queue(alias, schema=options["schema"])
            before = lent.admin.schema_revision()
            migrate_connection(connections[alias], options["schema"])
            after = lent.admin.schema_revision()
            self.stdout.write(
                f"sqlqueue: already up to date at revision {after}"
                if before == after
                else f"sqlqueue: migrated from {before or 'an empty database'} to {after}"
            )
            return
        target = queue(alias)
        argv = ["migrate"]
        if options["schema"]:
            argv += ["--schema", options["schema"]]
        if options["verbosity"] >= 2:
            argv.append("--verbose")
        try:
            status = main(argv, queue=target, prog="python manage.py sqlqueue_migrate")
        finally:
            target.engine.dispose()
        if status:
            raise SystemExit(status)
