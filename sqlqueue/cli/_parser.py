"""The ``sqlqueue`` command's parser: ``build_parser()`` describes every command and option,
and is what both ``main`` and the generated reference of the command line read."""

from __future__ import annotations

import argparse

from sqlqueue import __version__
from sqlqueue.cli._act import add_acting_commands
from sqlqueue.cli._common import SCHEMA_VARIABLE, URL_VARIABLE, schema_default, url_default
from sqlqueue.cli._ops import add_commands
from sqlqueue.cli._web_cmd import serve_web
from sqlqueue.cli._workers import add_workers_command

__all__ = ["build_parser", "database_option", "given_database_option"]


def build_parser(prog: str = "sqlqueue", *, given: bool = False) -> argparse.ArgumentParser:
    """The ``sqlqueue`` command's parser: every command, option and help text (the reference
    of the command line is generated from it). A command run on a queue of the database
    has its handler, ``(queue, args) -> status``, as its ``operate`` default; ``main`` runs
    ``migrate`` and ``worker`` itself.

    ``given``: a framework's command that serves the app's own Queue (``flask sqlqueue``,
    ``manage.py sqlqueue_worker``): no ``module:attribute`` to name, and the Queue's database
    unless ``--database-url`` says another."""
    parser = argparse.ArgumentParser(
        prog=prog, description="Background jobs on your SQLAlchemy database."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="print log records of this level and above (default INFO)",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    database = given_database_option if given else database_option
    migrate_cmd = commands.add_parser("migrate", help="create or upgrade sqlqueue's tables")
    database(migrate_cmd)
    migrate_cmd.add_argument(
        "--verbose", action="store_true", help="also print alembic's log of each revision"
    )

    worker_cmd = commands.add_parser("worker", help="run a worker until SIGTERM/SIGINT")
    if not given:
        worker_cmd.add_argument("queue", help="the Queue to serve, as module:attribute")
    worker_cmd.add_argument(
        "--queues",
        help="queues sharing --concurrency slots (mail,reports), or each with its own slots "
        "(mail=4,reports=1); default: the queues of its tasks",
    )
    worker_cmd.add_argument(
        "--database-url", help="serve this database instead of the one the Queue was built with"
    )
    worker_cmd.add_argument(
        "--schema",
        default=schema_default(),
        help="serve the tables in this PostgreSQL schema instead of the Queue's "
        f"(default: ${SCHEMA_VARIABLE})",
    )
    worker_cmd.add_argument(
        "--concurrency",
        type=int,
        default=4,
        help="how many jobs it runs at once, in slots its queues share (default 4); "
        "--queues name=slots gives each queue its own instead",
    )
    worker_cmd.add_argument(
        "--poll-interval",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="how often an idle worker looks for due jobs, in seconds (default 1.0); on "
        "PostgreSQL a new job also wakes it at once, unless --no-listen",
    )
    worker_cmd.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM/SIGINT, how long running jobs may take to finish before they go "
        "back to the queue without losing an attempt (default 30; a second signal: at once)",
    )
    worker_cmd.add_argument(
        "--no-listen",
        dest="listen",
        action="store_false",
        help="no PostgreSQL LISTEN wake-ups, poll only (needed behind PgBouncer in transaction "
        "mode)",
    )
    worker_cmd.add_argument(
        "--log-format",
        choices=["text", "json"],
        default="text",
        help="json: one JSON object per line (timestamp, level, logger, message, job_id, "
        "job_type, queue, attempt, worker_id, exception); default: text",
    )
    worker_cmd.add_argument(
        "--metrics-port",
        type=int,
        help=(
            "serve Prometheus metrics on /metrics at this port "
            "(needs sqlalchemy-sqlqueue[prometheus])"
        ),
    )
    worker_cmd.add_argument(
        "--metrics-interval",
        type=float,
        default=15.0,
        help="re-read the queue gauges (one stats query) at most this often, seconds (15)",
    )
    worker_cmd.add_argument(
        "--verbose",
        action="store_true",
        help="also print alembic's log (of a sqlqueue.migrate() that the app runs as it is "
        "imported)",
    )
    worker_cmd.add_argument(
        "--burst",
        action="store_true",
        help="exit once no job it has a task for is due and none is running (at once, with "
        "status 3, if the database cannot be reached or is not migrated)",
    )
    add_commands(commands, database)
    add_acting_commands(commands, database)
    add_workers_command(commands, database)

    web_cmd = commands.add_parser(
        "web",
        help="serve the internal web page (needs sqlalchemy-sqlqueue[web]) until interrupted",
        description="Serve the internal web page (needs sqlalchemy-sqlqueue[web]) until "
        "interrupted: "
        "the overview, the job list and each job, and requeue, discard, pause and resume. "
        "It has no login of its own: anyone who reaches it may act, so keep it on this "
        "machine, put it behind your own login, or pass --read-only. To mount it in your "
        "app with your own authorize= and current_user=, use sqlqueue.web.create_app.",
    )
    database(web_cmd)
    web_cmd.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to listen on (default 127.0.0.1: this machine only)",
    )
    web_cmd.add_argument("--port", type=int, default=8080, help="the port (default 8080)")
    web_cmd.add_argument(
        "--read-only", action="store_true", help="show everything, change nothing (no actions)"
    )
    web_cmd.add_argument(
        "--allowed-host",
        action="append",
        metavar="HOST[:PORT]",
        help="a host name the page is reached as (repeat for each; without a port, any port): "
        "a request naming another host is refused, so that no site can rebind its name to "
        "this address and read the page (default: the --host address and localhost, with "
        "--port). Forms are signed with $SQLQUEUE_WEB_SECRET (at least 32 bytes; set it when "
        "several processes serve the page), else a key made at start",
    )
    web_cmd.set_defaults(operate=serve_web)
    return parser


def database_option(parser: argparse.ArgumentParser) -> None:
    """``--database-url`` and ``--schema``, defaulting to their environment variables."""
    parser.add_argument("--database-url", default=url_default(), help=f"default: ${URL_VARIABLE}")
    parser.add_argument(
        "--schema",
        default=schema_default(),
        help="the PostgreSQL schema of sqlqueue's tables (default: $"
        f"{SCHEMA_VARIABLE}, else the connection's default schema)",
    )


def given_database_option(parser: argparse.ArgumentParser) -> None:
    """``--database-url``/``--schema`` for a framework's command: by default, the app's Queue's."""
    parser.add_argument("--database-url", help="default: the app's Queue's database")
    parser.add_argument(
        "--schema", help="the PostgreSQL schema of sqlqueue's tables (default: the Queue's)"
    )
