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
import importlib
import logging
import os
import socket
import sys
from collections.abc import Sequence

from sqlalchemy import Engine, create_engine
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from sqlqueue import __version__
from sqlqueue._errors import (
    ConfigurationError,
    DatabaseError,
    SchemaNotMigrated,
    SqlqueueError,
    UnsupportedDatabase,
)
from sqlqueue._logs import configure_logging
from sqlqueue._migrate import migrate
from sqlqueue._queue import Queue
from sqlqueue._schema import SCHEMA_REVISION
from sqlqueue._scrub import hide_passwords, password_of
from sqlqueue.cli._act import add_acting_commands
from sqlqueue.cli._ops import add_commands
from sqlqueue.dialects import dialect_for, driver_hint, with_driver

__all__ = ["EXIT_DATABASE", "EXIT_PROBLEM", "EXIT_USAGE", "load_queue", "main"]

URL_VARIABLE = "SQLQUEUE_DATABASE_URL"
SCHEMA_VARIABLE = "SQLQUEUE_SCHEMA"

#: Exit codes shared by every command (``health`` exits 1 for an alarm).
EXIT_PROBLEM = 1
EXIT_USAGE = 2
EXIT_DATABASE = 3


class UsageError(SqlqueueError):
    """The command line is wrong: exit 2."""


def open_engine(url: str | None, *, existing: bool = False, schema: str | None = None) -> Engine:
    """An engine for ``url``, or a usage error saying what is wrong with it (no traceback).
    ``existing``: a SQLite file must be there already (reading must not create an empty one).
    ``schema``: the tables' schema, refused here if the database has no schemas."""
    if not url:
        raise UsageError(f"no database: pass --database-url or set {URL_VARIABLE}")
    shown = hide_password(url)
    password = password_of(url)
    if password is not None and "@" in password:
        # SQLAlchemy ends the password at its first "@" and takes the rest for the host: the
        # driver's error would then quote part of the password as a host name.
        raise UsageError(
            f"--database-url: the password in {shown!r} holds an unencoded '@': "
            "percent-encode it as %40"
        )
    try:
        engine = create_engine(with_driver(url))
    except (ArgumentError, NoSuchModuleError, ValueError) as error:
        raise UsageError(
            f"--database-url: cannot use {shown!r}: {hide_password(str(error))} (expected e.g. "
            "sqlite:///jobs.db, postgresql://user@host/db or mysql://user@host/db)"
        ) from None
    except ImportError as error:
        raise UsageError(
            f"--database-url: the driver for {shown!r} is not installed ({error}): "
            f"{driver_hint(with_driver(url))}"
        ) from None
    try:
        dialect = dialect_for(engine)
    except UnsupportedDatabase as error:
        engine.dispose()
        raise UsageError(f"--database-url: {error}") from None
    try:
        check_schema(engine, schema)
    except UsageError:
        engine.dispose()
        raise
    missing = dialect.missing_database(engine.url) if existing else None
    if missing is not None:
        engine.dispose()
        raise SchemaNotMigrated(
            f"{missing}; create it with `sqlqueue migrate --database-url {shown}`"
        )
    return engine


def check_port_free(host: str, port: int) -> None:
    """A usage error, in one line, if ``host:port`` cannot be listened on (taken by another
    process, or an address not of this machine); checked before the server starts, whose own
    error would be a log record and a traceback."""
    if port == 0:
        return  # any free port
    try:
        family, *_, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.create_server(address[:2], family=family):
            pass
    except OSError as error:  # socket.gaierror included
        reason = os.strerror(error.errno) if error.errno else str(error)
        raise UsageError(
            f"--port: cannot listen on {host}:{port} ({reason}): stop what uses it or "
            "pick another --port"
        ) from None


def check_schema(engine: Engine, schema: str | None) -> None:
    """A usage error if ``engine``'s database cannot keep sqlqueue's tables in ``schema``."""
    try:
        dialect_for(engine, schema)
    except (UnsupportedDatabase, ConfigurationError) as error:
        raise UsageError(f"--schema: {error}") from None


def hide_password(text: str) -> str:
    """``text`` with the password of any URL in it replaced by ``***`` (errors and messages
    must not print it)."""
    return hide_passwords(text)


def load_queue(target: str) -> Queue:
    """Import ``module:attribute`` and return the :class:`Queue` it names."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise UsageError(f"expected module:attribute (e.g. myapp.jobs:queue), got {target!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise UsageError(f"cannot import {module_name!r}: {error}") from error
    queue = getattr(module, attribute, None)
    if not isinstance(queue, Queue):
        raise UsageError(
            f"{target} is {type(queue).__name__ if queue is not None else 'missing'}, "
            "not a sqlqueue.Queue"
        )
    return queue


def parse_queues(text: str) -> list[str] | dict[str, int]:
    """``mail,reports`` (shared slots) or ``mail=4,reports=1`` (slots per queue)."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not any("=" in item for item in items):
        return items
    limits: dict[str, int] = {}
    for item in items:
        name, _, number = item.partition("=")
        if not name.strip() or not number.strip().isdigit():
            raise UsageError(f"--queues: expected name=slots (e.g. mail=4,reports=1), got {item!r}")
        limits[name.strip()] = int(number)
    return limits


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sqlqueue", description="Background jobs on your SQLAlchemy database."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    commands = parser.add_subparsers(dest="command", required=True)

    migrate_cmd = commands.add_parser("migrate", help="create or upgrade sqlqueue's tables")
    _database_option(migrate_cmd)
    migrate_cmd.add_argument(
        "--verbose", action="store_true", help="also print alembic's log of each revision"
    )

    worker_cmd = commands.add_parser("worker", help="run a worker until SIGTERM/SIGINT")
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
        default=os.environ.get(SCHEMA_VARIABLE) or None,
        help="serve the tables in this PostgreSQL schema instead of the Queue's "
        f"(default: ${SCHEMA_VARIABLE})",
    )
    worker_cmd.add_argument("--concurrency", type=int, default=4)
    worker_cmd.add_argument("--poll-interval", type=float, default=1.0)
    worker_cmd.add_argument("--shutdown-timeout", type=float, default=30.0)
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
        help="serve Prometheus metrics on /metrics at this port (needs sqlqueue[prometheus])",
    )
    worker_cmd.add_argument(
        "--metrics-interval",
        type=float,
        default=15.0,
        help="re-read the queue gauges (one stats query) at most this often, seconds (15)",
    )
    worker_cmd.add_argument(
        "--burst",
        action="store_true",
        help="exit once no job it has a task for is due and none is running (at once, with "
        "status 3, if the database cannot be reached or is not migrated)",
    )
    add_commands(commands, _database_option)
    add_acting_commands(commands, _database_option)

    web_cmd = commands.add_parser(
        "web",
        help="serve the internal web page (needs sqlqueue[web]) until interrupted",
        description="Serve the internal web page (needs sqlqueue[web]) until interrupted: "
        "the overview, the job list and each job, and requeue, discard, pause and resume. "
        "It has no login of its own: anyone who reaches it may act, so keep it on this "
        "machine, put it behind your own login, or pass --read-only. To mount it in your "
        "app with your own authorize= and current_user=, use sqlqueue.web.create_app.",
    )
    _database_option(web_cmd)
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
    web_cmd.set_defaults(operate=_web)
    return parser


def _database_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--database-url", default=os.environ.get(URL_VARIABLE), help=f"default: ${URL_VARIABLE}"
    )
    parser.add_argument(
        "--schema",
        default=os.environ.get(SCHEMA_VARIABLE) or None,
        help="the PostgreSQL schema of sqlqueue's tables (default: $"
        f"{SCHEMA_VARIABLE}, else the connection's default schema)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``sqlqueue`` command; returns the exit status.

    Output cut short by its reader (``sqlqueue stats | head -1``) ends quietly with 0: the
    reader had what it wanted."""
    try:
        status = _main(argv)
        sys.stdout.flush()  # here, not at exit, where a closed pipe would print a traceback
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's last flush goes nowhere
        return 0
    return status


def _main(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    args.log_filter = configure_logging(args.log_level, getattr(args, "log_format", "text"))
    try:
        return _run(args)
    except (UsageError, ConfigurationError) as error:
        return _fail(error, EXIT_USAGE)
    except DatabaseError as error:
        return _fail(error, EXIT_DATABASE)
    except SqlqueueError as error:
        return _fail(error, EXIT_PROBLEM)


def _fail(error: SqlqueueError, status: int) -> int:
    print(f"sqlqueue: error: {error}", file=sys.stderr)
    return status


def _run(args: argparse.Namespace) -> int:
    if args.command == "migrate":
        return _migrate(args)
    if args.command == "worker":
        return _worker(args)
    engine = open_engine(args.database_url, existing=True, schema=args.schema)
    try:
        queue = Queue(engine, schema=args.schema)
        queue.admin.require_schema(SCHEMA_REVISION)
        status: int = args.operate(queue, args)
        return status
    finally:
        engine.dispose()


def _migrate(args: argparse.Namespace) -> int:
    """Migrate, and say so in one line: from which revision to which, or that there was
    nothing to do (alembic's own log of each revision only with ``--verbose``)."""
    if not args.verbose:
        logging.getLogger("alembic").setLevel(logging.WARNING)
    engine = open_engine(args.database_url, schema=args.schema)
    try:
        admin = Queue(engine, schema=args.schema).admin
        before = admin.schema_revision()
        migrate(engine, schema=args.schema)
        after = admin.schema_revision()
    finally:
        engine.dispose()
    where = "" if args.schema is None else f" (schema {args.schema!r})"
    if before == after:
        print(f"sqlqueue: already up to date at revision {after}{where}")
    else:
        print(f"sqlqueue: migrated from {before or 'an empty database'} to {after}{where}")
    return 0


def _web(queue: Queue, args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be between 0 and 65535, got {args.port}")
    check_port_free(args.host, args.port)
    try:  # Starlette, Jinja2 and uvicorn load only for this command
        from sqlqueue.web._serve import serve
    except ImportError as error:
        raise UsageError(
            f'the web page needs its extra: pip install "sqlqueue[web]" ({error})'
        ) from None
    serve(
        queue,
        host=args.host,
        port=args.port,
        read_only=args.read_only,
        allowed_hosts=args.allowed_host or _default_hosts(args.host, args.port),
    )
    return 0


def _default_hosts(host: str, port: int) -> list[str]:
    """The hosts ``sqlqueue web`` answers without ``--allowed-host``: its address and
    ``localhost``, on its port (any port when the port is chosen at start, ``--port 0``)."""
    names = [f"[{host}]" if ":" in host else host, "localhost"]
    return names if port == 0 else [f"{name}:{port}" for name in names]


def _worker(args: argparse.Namespace) -> int:
    queue = load_queue(args.queue)
    if not queue.tasks:
        module_name = args.queue.partition(":")[0]
        where = getattr(sys.modules.get(module_name), "__file__", None)
        raise UsageError(
            f"{args.queue} has no task: module {module_name!r}"
            f"{f' ({where})' if where else ''} registered none, so a worker could run nothing; "
            "import the modules that declare your tasks (@queue.task) from it"
        )
    schema = queue.schema if args.schema is None else args.schema
    if args.database_url:  # a SQLite file must be there: a typo must not serve an empty one
        engine = open_engine(args.database_url, existing=True, schema=schema)
        queue = queue.rebind(engine, schema=schema)
    elif schema != queue.schema:
        check_schema(queue.engine, schema)
        queue = queue.rebind(queue.engine, schema=schema)
    queues = parse_queues(args.queues) if args.queues else None
    worker = queue.worker(
        queues=queues,
        concurrency=args.concurrency,
        poll_interval=args.poll_interval,
        shutdown_timeout=args.shutdown_timeout,
        listen=args.listen,
        metrics_port=args.metrics_port,
        metrics_interval=args.metrics_interval,
    )
    args.log_filter.worker_id = worker.worker_id  # one worker per process: all its records
    worker.run(burst=args.burst)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
