"""``python manage.py sqlqueue_migrate [--database ALIAS]``: create or upgrade sqlqueue's tables
in a database of Django's ``DATABASES``, as ``sqlqueue migrate`` does (same code, same output).

sqlqueue keeps its own version table, so Django's migrations and sqlqueue's never mix.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import DEFAULT_DB_ALIAS

from sqlqueue.cli import main
from sqlqueue.django import queue

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
        target = queue(options["database"])
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
