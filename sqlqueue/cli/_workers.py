"""``sqlqueue workers``: the worker processes the live workers' table knows, and which worker
runs a job (for ``jobs show``). Reads only :meth:`sqlqueue.Queue.workers`."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlqueue._job import Job, JobStatus
from sqlqueue._worker_info import WorkerInfo
from sqlqueue.cli._text import json_text, table

if TYPE_CHECKING:  # the parser loads this module: no SQLAlchemy before a command runs
    from sqlqueue._queue import Queue

__all__ = ["add_workers_command", "worker_of", "worker_text"]


def add_workers_command(
    commands: Any, database_option: Callable[[argparse.ArgumentParser], None]
) -> None:
    """Add ``workers`` to ``commands`` (an argparse subparsers object)."""
    help_text = "list the worker processes alive now (--all: and those gone without a word)"
    parser = commands.add_parser("workers", help=help_text, description=help_text)
    database_option(parser)
    parser.add_argument(
        "--all", action="store_true", help="also list workers gone without a clean exit"
    )
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parser.set_defaults(operate=_workers)


def _workers(queue: Queue, args: argparse.Namespace) -> int:
    found = queue.workers(include_gone=args.all)
    if args.json:
        print(json_text([worker.to_dict() for worker in found]))
        return 0
    if not found:
        print("no live worker" if not args.all else "no worker")
        return 0
    rows = [
        [
            worker.host,
            worker.pid,
            ", ".join(f"{name}={limit}" for name, limit in sorted(worker.queues.items())),
            worker.running,
            worker.started_at,
            worker.last_seen_at,
            _state(worker),
            worker.version,
            worker.id,
        ]
        for worker in found
    ]
    headers = ["host", "pid", "queues", "running", "started", "last seen", "state", "version", "id"]
    print(table(headers, rows))
    return 0


def _state(worker: WorkerInfo) -> str:
    if not worker.alive:
        return "gone"
    return "stopping" if worker.stopping else "alive"


def worker_of(queue: Queue, job: Job) -> WorkerInfo | None:
    """The worker whose lease a running job holds, if its row is still there."""
    if job.status is not JobStatus.RUNNING or job.locked_by is None:
        return None
    for worker in queue.workers(include_gone=True):
        if worker.id == job.locked_by:
            return worker
    return None


def worker_text(job: Job, worker: WorkerInfo | None) -> str | None:
    """``host pid N`` (and ``gone`` when it missed its heartbeats) for a running job's worker;
    ``None`` for a job nobody runs."""
    if job.status is not JobStatus.RUNNING or job.locked_by is None:
        return None
    if worker is None:
        return f"{job.locked_by} (not in the workers' table)"
    return f"{worker.host} pid {worker.pid}" + ("" if worker.alive else " (gone)")
