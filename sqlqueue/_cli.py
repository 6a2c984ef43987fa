"""The ``sqlqueue`` command: ``migrate`` the schema, run a ``worker``.

The database comes from ``--database-url`` or ``SQLQUEUE_DATABASE_URL`` for ``migrate``; a
worker uses the engine of the :class:`~sqlqueue.Queue` it is pointed at (``module:attribute``).
Errors are printed as one clear line and exit with status 1; usage errors exit with 2.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from sqlqueue._errors import SqlqueueError
from sqlqueue._migrate import migrate
from sqlqueue._queue import Queue

__all__ = ["load_queue", "main"]

URL_VARIABLE = "SQLQUEUE_DATABASE_URL"


def load_queue(target: str) -> Queue:
    """Import ``module:attribute`` and return the :class:`Queue` it names."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise SqlqueueError(f"expected module:attribute (e.g. myapp.jobs:queue), got {target!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise SqlqueueError(f"cannot import {module_name!r}: {error}") from error
    queue = getattr(module, attribute, None)
    if not isinstance(queue, Queue):
        raise SqlqueueError(
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
            raise SqlqueueError(
                f"--queues: expected name=slots (e.g. mail=4,reports=1), got {item!r}"
            )
        limits[name.strip()] = int(number)
    return limits


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sqlqueue", description="Background jobs on your SQLAlchemy database."
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    commands = parser.add_subparsers(dest="command", required=True)

    migrate_cmd = commands.add_parser("migrate", help="create or upgrade sqlqueue's tables")
    migrate_cmd.add_argument(
        "--database-url", default=os.environ.get(URL_VARIABLE), help=f"default: ${URL_VARIABLE}"
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
        "--burst", action="store_true", help="exit once no job is due and none is running"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``sqlqueue`` command; returns the exit status."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        if args.command == "migrate":
            if not args.database_url:
                raise SqlqueueError(f"no database: pass --database-url or set {URL_VARIABLE}")
            migrate(args.database_url)
            print("sqlqueue: schema is up to date")
            return 0
        queue = load_queue(args.queue)
        if args.database_url:
            queue = queue.rebind(args.database_url)
        queues = parse_queues(args.queues) if args.queues else None
        worker = queue.worker(
            queues=queues,
            concurrency=args.concurrency,
            poll_interval=args.poll_interval,
            shutdown_timeout=args.shutdown_timeout,
            listen=args.listen,
        )
        worker.run(burst=args.burst)
        return 0
    except SqlqueueError as error:
        print(f"sqlqueue: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
