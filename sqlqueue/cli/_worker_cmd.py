"""``sqlqueue worker module:attribute``: import the app's :class:`~sqlqueue.Queue` and run a
worker on it (its engine and schema unless given others) until SIGTERM/SIGINT, or until it has
nothing left with ``--burst``."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from sqlqueue._digits import ascii_number
from sqlqueue._queue import Queue
from sqlqueue.cli._common import UsageError
from sqlqueue.cli._engine import check_schema, open_engine

__all__ = ["load_queue", "parse_queues", "run_worker"]


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
        slots = ascii_number(number.strip())
        if not name.strip() or slots is None:
            raise UsageError(f"--queues: expected name=slots (e.g. mail=4,reports=1), got {item!r}")
        limits[name.strip()] = slots
    return limits


def run_worker(args: argparse.Namespace, given: Queue | None = None) -> int:
    """Run the worker the arguments describe (on ``given``, a framework's app's Queue, when
    there is one); returns the exit status once it stops."""
    queue = load_queue(args.queue) if given is None else given
    if not queue.tasks and given is not None:
        raise UsageError("the app's Queue has no task, so a worker could run nothing")
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
