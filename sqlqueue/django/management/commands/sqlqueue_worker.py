"""``python manage.py sqlqueue_worker [myapp.jobs:queue] [options]``: ``sqlqueue worker`` with
Django set up, so handlers use the ORM and the project's settings.

The arguments are exactly those of ``sqlqueue worker`` (``--concurrency``, ``--queues``,
``--burst`` …), parsed by the same code; Django's own options go before them. With
sqlqueue's backend of Django's Tasks framework in ``TASKS``, no queue need be named: the
worker serves the framework's tasks (and, with a queue on the same database named, that
queue's tasks as well; see ``sqlqueue/django/_tasks_worker.py``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from sqlqueue.cli import main
from sqlqueue.django._tasks_worker import worker_call

__all__ = ["Command"]

PROG = "python manage.py sqlqueue_worker"


class Command(BaseCommand):
    """Run a worker until SIGTERM/SIGINT (or, with ``--burst``, until no job is due)."""

    help = (
        "Run a sqlqueue worker with Django set up: MODULE:ATTRIBUTE of the Queue (none: the "
        "tasks of Django's Tasks framework, when TASKS has sqlqueue's backend), then the "
        "options of `sqlqueue worker` (see `sqlqueue worker --help`)."
    )

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        """Django's parser, which also takes the worker's options without a queue before them
        (``sqlqueue_worker --burst``): argparse leaves a leading option out of the remainder
        unless ``--`` comes first, so it is put there."""
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        own = {
            option: action.nargs != 0
            for action in parser._actions
            for option in action.option_strings
        }
        parse_args = parser.parse_args

        def parse(args: Sequence[str] | None = None, namespace: Any = None) -> Any:
            return parse_args(None if args is None else _separated(list(args), own), namespace)

        parser.parse_args = parse
        return parser

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "worker_arguments",
            nargs=argparse.REMAINDER,
            metavar="[MODULE:ATTRIBUTE] [options]",
            help="the arguments of `sqlqueue worker`",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        arguments = list(options["worker_arguments"])
        if arguments[:1] == ["--"]:
            arguments = arguments[1:]
        argv, queue = worker_call(arguments, PROG)
        status = main(argv, queue=queue, prog=PROG)
        if status:
            raise SystemExit(status)


def _separated(args: list[str], own: dict[str, bool]) -> list[str]:
    """``args`` with ``--`` after Django's leading options when a worker option follows."""
    index = 0
    while index < len(args):
        name, equals, _ = args[index].partition("=")
        if name not in own and args[index][:2] in own and not name.startswith("--"):
            index += 1  # a short option with its value attached (-v2)
            continue
        if name not in own or args[index] == "--":
            break
        index += 2 if own[name] and not equals else 1
    if index < len(args) and args[index].startswith("-") and args[index] != "--":
        return [*args[:index], "--", *args[index:]]
    return args
