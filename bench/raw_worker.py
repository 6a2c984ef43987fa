"""A worker process written as raw SQL: the ceiling sqlqueue's worker is measured against.

One process, one connection, no handler, no threads: claim up to ``--batch`` due jobs in one
statement, mark them succeeded (fenced by worker and attempt) in a second, repeat. Its commits
do not wait for the disk, as sqlqueue's worker's claims and outcomes do not (``--durable``: at
the server's level). With ``--burst`` it exits when a claim comes back empty (drains); otherwise
it sleeps ``--poll-interval`` after an empty claim, as a polling worker does (pickup latency,
idle CPU), until SIGTERM. ``--record PATH`` appends ``seq time.time()`` for every claimed job
whose payload has a ``seq``, taken right after the claim returns: when a handler would start.

Run by the benchmark as ``python -m bench.raw_worker …`` with ``SQLQUEUE_DATABASE_URL`` set;
it writes ``ready`` to stderr once connected, just before its first claim.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import TextIO

from bench.raw_sql import connect

__all__ = ["READY", "main"]

#: Written to stderr once the worker is connected and about to claim.
READY = "ready"
URL_VARIABLE = "SQLQUEUE_DATABASE_URL"


def _stop(_signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(0)


def serve(
    url: str,
    *,
    batch: int,
    poll_interval: float,
    burst: bool,
    record: TextIO | None,
    durable: bool = False,
) -> int:
    """Claim and complete until a claim is empty (``burst``) or SIGTERM; return jobs done.

    Commits do not wait for the disk, as sqlqueue's worker's claims and outcomes do not
    (``durable``: at the server's level), so the ceiling commits on sqlqueue's terms."""
    raw = connect(url, autocommit=True, relaxed=not durable)
    worker = f"raw:{socket.gethostname()}:{os.getpid()}"
    done = 0
    print(READY, file=sys.stderr, flush=True)
    try:
        while True:
            jobs = raw.claim(worker=worker, batch=batch)
            if not jobs:
                if burst:
                    return done
                time.sleep(poll_interval)
                continue
            if record is not None:
                started = time.time()
                record.writelines(
                    f"{payload['seq']} {started!r}\n" for _, _, payload in jobs if "seq" in payload
                )
                record.flush()
            raw.complete(worker=worker, jobs=jobs)
            done += len(jobs)
    finally:
        raw.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Drain sqlqueue_jobs with raw SQL.")
    parser.add_argument(
        "url",
        nargs="?",
        default=os.environ.get(URL_VARIABLE),
        help=f"SQLAlchemy URL of the database (default: ${URL_VARIABLE})",
    )
    parser.add_argument("--batch", type=int, default=100, help="jobs per claim statement (100)")
    parser.add_argument("--poll-interval", type=float, default=1.0, help="seconds (1.0)")
    parser.add_argument("--burst", action="store_true", help="exit when nothing is due")
    parser.add_argument("--record", type=Path, help="append 'seq start-time' lines here")
    parser.add_argument(
        "--durable",
        action="store_true",
        help="commit at the server's durability (default: as sqlqueue's worker, not waiting "
        "for the disk)",
    )
    args = parser.parse_args(argv)
    if not args.url:
        parser.error(f"give the database URL or set {URL_VARIABLE}")
    signal.signal(signal.SIGTERM, _stop)
    record = args.record.open("a", encoding="utf-8") if args.record else None
    try:
        done = serve(
            args.url,
            batch=args.batch,
            poll_interval=args.poll_interval,
            burst=args.burst,
            record=record,
            durable=args.durable,
        )
    finally:
        if record is not None:
            record.close()
    print(done)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
