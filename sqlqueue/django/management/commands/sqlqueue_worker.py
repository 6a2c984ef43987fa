"""``python manage.py sqlqueue_worker myapp.jobs:queue [options]``: ``sqlqueue worker`` with
Django set up, so handlers use the ORM and the project's settings.

The arguments are exactly those of ``sqlqueue worker`` (``--concurrency``, ``--queues``,
``--burst`` …), parsed by the same code; Django's own options go before the queue.
"""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from sqlqueue.cli import main

__all__ = ["Command"]


class Command(BaseCommand):
    """Run a worker until SIGTERM/SIGINT (or, with ``--burst``, until no job is due)."""

    help = (
        "Run a sqlqueue worker with Django set up: MODULE:ATTRIBUTE of the Queue, then the "
        "options of `sqlqueue worker` (see `sqlqueue worker --help`)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "worker_arguments",
            nargs=argparse.REMAINDER,
            metavar="MODULE:ATTRIBUTE [options]",
            help="the arguments of `sqlqueue worker`",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        status = main(
            ["worker", *options["worker_arguments"]], prog="python manage.py sqlqueue_worker"
        )
        if status:
            raise SystemExit(status)
