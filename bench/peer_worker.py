"""A worker process of a peer library (pgqueuer or procrastinate), for ``python -m bench --peers``.

Each peer runs its own worker loop, configured as its documentation says, with async no-op
handlers: ``noop`` for drains and ``stamp`` for pickup latency (it appends ``seq time.time()``
to ``--record`` as the handler starts, as ``bench.app``'s ``stamp`` does for sqlqueue).
``--in-flight N`` is how many jobs the worker may hold at once:

- pgqueuer: ``QueueManager.run(batch_size=N)``, ``mode=drain`` with ``--burst``, on its primary
  driver asyncpg and on uvloop, as ``pgq run`` does (its psycopg driver waits up to 1 s for a
  notification while holding the connection, which stalls its queries: ~850 jobs/s drains in a
  trial here, so it would not be a fair figure). Its default sets no cap on the jobs a worker
  holds: it claims N per statement and claims again at once, without waiting for the last
  batch to finish.
  ``--cap M`` passes ``max_concurrent_tasks=M`` (pgqueuer refuses less than 2N); once the cap
  is reached it re-polls after 0.1 s.
- procrastinate: ``App.run_worker_async(concurrency=N, wait=not burst)``, its psycopg 3
  ``PsycopgConnector`` (a connection pool of the library's default size).

Run by the benchmark as ``python -m bench.peer_worker PEER …`` with ``SQLQUEUE_DATABASE_URL``
set (a SQLAlchemy URL; the libpq DSN is derived from it); it writes ``ready`` to stderr just
before its worker loop starts, which then blocks in its first claim at the barrier.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import signal
import sys
import time
from collections.abc import Coroutine, Sequence
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from bench.databases import postgres_dsn
from bench.raw_worker import READY, URL_VARIABLE

__all__ = ["NOOP", "PEERS", "STAMP", "asyncpg_connect", "main"]

#: The peer libraries the benchmark knows, by their PyPI names.
PEERS = ("pgqueuer", "procrastinate")
#: Job types (pgqueuer entrypoints, procrastinate task names) of the peer workers.
NOOP = "noop"
STAMP = "stamp"


class _Recorder:
    """Appends ``seq time.time()`` for every stamp job, as its handler starts."""

    def __init__(self, sink: TextIO | None) -> None:
        self._sink = sink

    def stamp(self, seq: int) -> None:
        started = time.time()
        if self._sink is not None:
            self._sink.write(f"{seq} {started!r}\n")
            self._sink.flush()


async def _pgqueuer(
    dsn: str,
    *,
    in_flight: int,
    poll_interval: float,
    burst: bool,
    recorder: _Recorder,
    cap: int | None,
) -> None:
    from pgqueuer import Job, QueueManager
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    conn = await asyncpg_connect(dsn)
    manager = QueueManager(Queries.from_asyncpg_connection(conn))

    async def noop(_job: Job) -> None:
        """Do nothing."""

    async def stamp(job: Job) -> None:
        recorder.stamp(int(json.loads(job.payload or b"{}")["seq"]))

    # Registered by calls, not decorators: without the peer installed mypy sees ``Any`` here.
    manager.entrypoint(NOOP)(noop)
    manager.entrypoint(STAMP)(stamp)

    print(READY, file=sys.stderr, flush=True)
    try:
        await manager.run(
            dequeue_timeout=timedelta(seconds=poll_interval),
            batch_size=in_flight,
            mode=QueueExecutionMode.drain if burst else QueueExecutionMode.continuous,
            max_concurrent_tasks=cap,
            # No background folding of its log table into statistics during a measurement.
            log_aggregation_interval=timedelta(0),
        )
    finally:
        await conn.close()


async def _procrastinate(
    dsn: str,
    *,
    in_flight: int,
    poll_interval: float,
    burst: bool,
    recorder: _Recorder,
    cap: int | None,
) -> None:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    async def noop(**_payload: Any) -> None:
        """Do nothing."""

    async def stamp(seq: int) -> None:
        recorder.stamp(seq)

    app.task(name=NOOP)(noop)
    app.task(name=STAMP)(stamp)

    async with app.open_async():
        print(READY, file=sys.stderr, flush=True)
        await app.run_worker_async(
            concurrency=in_flight,
            wait=not burst,
            fetch_job_polling_interval=poll_interval,
            install_signal_handlers=False,
        )


async def asyncpg_connect(dsn: str) -> Any:
    """An asyncpg connection to ``dsn``, named by ``$PGAPPNAME`` (asyncpg does not read it)."""
    import asyncpg

    name = os.environ.get("PGAPPNAME")
    return await asyncpg.connect(dsn, server_settings={"application_name": name} if name else None)


def _run(peer: str, main: Coroutine[Any, Any, None]) -> None:
    """pgqueuer on uvloop when it is installed, as ``pgq run`` does; procrastinate on asyncio."""
    if peer == "pgqueuer" and importlib.util.find_spec("uvloop") is not None:
        import uvloop

        uvloop.run(main)
    else:
        asyncio.run(main)


def _stop(_signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run a peer library's worker on no-op jobs.")
    parser.add_argument("peer", choices=PEERS)
    parser.add_argument("--in-flight", type=int, default=10, help="jobs held at once (10)")
    parser.add_argument("--poll-interval", type=float, default=1.0, help="seconds (1.0)")
    parser.add_argument("--burst", action="store_true", help="exit when nothing is due")
    parser.add_argument("--record", type=Path, help="append 'seq start-time' lines here")
    parser.add_argument("--cap", type=int, help="pgqueuer: max_concurrent_tasks (none)")
    args = parser.parse_args(argv)
    url = os.environ.get(URL_VARIABLE)
    if not url:
        parser.error(f"set {URL_VARIABLE} to the database's SQLAlchemy URL")
    signal.signal(signal.SIGTERM, _stop)
    run = {"pgqueuer": _pgqueuer, "procrastinate": _procrastinate}[args.peer]
    sink = args.record.open("a", encoding="utf-8") if args.record else None
    try:
        _run(
            args.peer,
            run(
                postgres_dsn(url),
                in_flight=args.in_flight,
                poll_interval=args.poll_interval,
                burst=args.burst,
                recorder=_Recorder(sink),
                cap=args.cap,
            ),
        )
    finally:
        if sink is not None:
            sink.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
