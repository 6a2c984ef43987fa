"""sqlqueue in a Flask app (extra ``[flask]``): enqueue with Flask-SQLAlchemy's ``db.session``
(``task.enqueue(db.session, …)``, in the request's transaction, as with any Session), and
operate the queue from the app's own command line::

    sqlqueue.flask.init_app(app, queue)

adds ``flask sqlqueue worker``, ``migrate``, ``stats`` and ``health``: the commands of the
``sqlqueue`` command (same options, same output, same exit codes), on the app's Queue.
"""

from __future__ import annotations

import click
from flask import Flask
from flask.cli import AppGroup

from sqlqueue._errors import ConfigurationError
from sqlqueue._queue import Queue
from sqlqueue.cli import main

__all__ = ["COMMANDS", "init_app"]

#: The ``sqlqueue`` commands ``flask sqlqueue`` offers, and what each does.
COMMANDS = {
    "worker": "Run a worker of the app's Queue until SIGTERM/SIGINT (--burst: until idle).",
    "migrate": "Create or upgrade sqlqueue's tables in the app's database.",
    "stats": "Print the queue's counts by status, queue and type.",
    "health": "Check the queue's health (exit 1 on an alarm).",
}


def init_app(app: Flask, queue: Queue) -> None:
    """Add the ``flask sqlqueue`` commands for ``queue`` to ``app``'s command line, and keep
    the queue as ``app.extensions["sqlqueue"]``."""
    if not isinstance(queue, Queue):
        raise ConfigurationError(f"queue: expected a sqlqueue.Queue, got {queue!r}")
    group = AppGroup("sqlqueue", help="sqlqueue's commands, on this app's Queue.")
    for name, summary in COMMANDS.items():
        group.add_command(_command(name, summary, queue))
    app.cli.add_command(group)
    app.extensions["sqlqueue"] = queue


def _command(name: str, summary: str, queue: Queue) -> click.Command:
    """``flask sqlqueue NAME …``: every argument goes to ``sqlqueue NAME`` as it is, parsed
    (``--help`` included) by the same code."""

    def run(arguments: tuple[str, ...]) -> None:
        status = main([name, *arguments], queue=queue, prog="flask sqlqueue")
        click.get_current_context().exit(status)

    return click.Command(
        name,
        callback=run,
        params=[click.Argument(["arguments"], nargs=-1, type=click.UNPROCESSED)],
        help=f"{summary} Options: flask sqlqueue {name} --help.",
        short_help=summary,
        context_settings={
            "ignore_unknown_options": True,
            "allow_extra_args": True,
            "help_option_names": [],
        },
        add_help_option=False,
    )
