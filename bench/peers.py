"""The peer libraries' side of ``python -m bench --peers``: pgqueuer and procrastinate.

Each measurement gets a fresh PostgreSQL database (``fresh_database``: sqlqueue's tables are
there too, unused) with the peer's own schema installed through its own API. The operations
are the peer's documented ones; procrastinate's driver is psycopg 3, as sqlqueue's and raw
SQL's, pgqueuer's is asyncpg, its primary one (``bench.peer_worker`` says why):

- **enqueue, one per transaction**: pgqueuer ``Queries.enqueue(entrypoint, payload)``;
  procrastinate ``task.defer_async(**payload)``. Each is one autocommitted statement.
- **enqueue in bulk**: pgqueuer ``Queries.enqueue([...], [...], [...])`` (one statement);
  procrastinate ``task.batch_defer_async(*payloads)``.
- **drain**: the backlog is enqueued in bulk and committed, then the peer's table is held
  shut (``LOCK TABLE … IN EXCLUSIVE MODE``) while one ``bench.peer_worker`` process starts
  and blocks in its first claim (seen in ``pg_stat_activity``); the commit releases the
  backlog. The window is on the database clock, from the first pick (not before the
  release) to the last completion, read from the peer's own history: pgqueuer's
  ``pgqueuer_log`` (``picked`` and ``successful`` rows), procrastinate's
  ``procrastinate_events`` (``started`` and ``succeeded``). Every job must have succeeded.
- **pickup latency**: as ``bench.pickup`` for sqlqueue, into an idle peer worker (LISTEN/NOTIFY
  on, polling at the same interval as the others).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from bench import drain, pickup, processes
from bench.databases import fresh_database, postgres_dsn
from bench.peer_worker import NOOP, PEERS, STAMP, asyncpg_connect
from bench.pg_monitor import Monitor
from bench.settings import Settings

__all__ = [
    "PEERS",
    "available",
    "bulk",
    "drain_measure",
    "one_by_one",
    "pickup_measure",
]

_WARM_UP = 20
#: The table each peer keeps its jobs in: the drain barrier locks it, enqueues are counted.
_TABLES = {"pgqueuer": "pgqueuer", "procrastinate": "procrastinate_jobs"}
#: First pick and last completion (database clock), and how many jobs succeeded.
_WINDOWS = {
    "pgqueuer": """
        SELECT min(created) FILTER (WHERE status = 'picked'),
               max(created) FILTER (WHERE status = 'successful'),
               count(*) FILTER (WHERE status = 'successful')
          FROM pgqueuer_log""",
    "procrastinate": """
        SELECT min(at) FILTER (WHERE type = 'started'),
               max(at) FILTER (WHERE type = 'succeeded'),
               (SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded')
          FROM procrastinate_events""",
}


def available() -> list[str]:
    """The peers installed here (``pip install -e '.[bench]'`` installs both)."""
    return [peer for peer in PEERS if importlib.util.find_spec(peer) is not None]


class _Client:
    """A peer's enqueue side on one database: its schema, one job, many jobs."""

    def __init__(self, peer: str, dsn: str) -> None:
        self.peer = peer
        self.dsn = dsn
        self._close: Callable[[], Awaitable[None]] | None = None
        self._one: Callable[[dict[str, Any], str], Awaitable[Any]] | None = None
        self._many: Callable[[list[dict[str, Any]]], Awaitable[Any]] | None = None

    async def open(self, *, install: bool) -> None:
        if self.peer == "pgqueuer":
            await self._open_pgqueuer(install=install)
        else:
            await self._open_procrastinate(install=install)

    async def _open_pgqueuer(self, *, install: bool) -> None:
        from pgqueuer.queries import Queries

        conn = await asyncpg_connect(self.dsn)
        queries = Queries.from_asyncpg_connection(conn)
        if install:
            await queries.install()

        async def one(payload: dict[str, Any], job_type: str) -> Any:
            return await queries.enqueue(job_type, json.dumps(payload).encode())

        async def many(payloads: list[dict[str, Any]]) -> Any:
            return await queries.enqueue(
                [NOOP] * len(payloads),
                [json.dumps(p).encode() for p in payloads],
                [0] * len(payloads),
            )

        self._one, self._many, self._close = one, many, conn.close

    async def _open_procrastinate(self, *, install: bool) -> None:
        import procrastinate

        app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=self.dsn))

        async def noop(**_payload: Any) -> None:
            """Never runs here: the worker process has its own."""

        async def stamp(seq: int) -> None:
            """Never runs here: the worker process has its own."""

        # Registered by calls, not decorators: without the peer installed mypy sees ``Any``.
        tasks: dict[str, Any] = {
            NOOP: app.task(name=NOOP)(noop),
            STAMP: app.task(name=STAMP)(stamp),
        }
        await app.open_async()
        if install:
            await app.schema_manager.apply_schema_async()

        async def one(payload: dict[str, Any], job_type: str) -> Any:
            return await tasks[job_type].defer_async(**payload)

        async def many(payloads: list[dict[str, Any]]) -> Any:
            return await tasks[NOOP].batch_defer_async(*payloads)

        self._one, self._many, self._close = one, many, app.close_async

    async def one(self, payload: dict[str, Any], job_type: str = NOOP) -> None:
        assert self._one is not None
        await self._one(payload, job_type)

    async def many(self, payloads: list[dict[str, Any]]) -> None:
        assert self._many is not None
        await self._many(payloads)

    async def close(self) -> None:
        if self._close is not None:
            await self._close()


@contextmanager
def _client(peer: str, url: str, *, install: bool) -> Iterator[tuple[asyncio.Runner, _Client]]:
    """An event loop and ``peer``'s client on ``url`` (its schema installed if ``install``)."""
    with asyncio.Runner() as loop:
        client = _Client(peer, postgres_dsn(url))
        loop.run(client.open(install=install))
        try:
            yield loop, client
        finally:
            loop.run(client.close())


def _count(peer: str, url: str) -> int:
    import psycopg

    with psycopg.connect(postgres_dsn(url)) as conn:
        row = conn.execute(f"SELECT count(*) FROM {_TABLES[peer]}").fetchone()
    return int(row[0]) if row else 0


def _check(peer: str, url: str, expected: int) -> None:
    found = _count(peer, url)
    if found != expected:
        raise SystemExit(f"{peer}: expected {expected} jobs after enqueue, found {found}")


def one_by_one(peer: str, settings: Settings, jobs: int) -> float:
    """``jobs`` enqueues, each its own transaction, through the peer's API; jobs/s."""
    with fresh_database("postgresql", settings.target) as url:
        with _client(peer, url, install=True) as (loop, client):
            for n in range(_WARM_UP):
                loop.run(client.one({"n": n}))

            async def enqueue_all() -> None:
                for n in range(jobs):
                    await client.one({"n": n})

            started = time.perf_counter()
            loop.run(enqueue_all())
            elapsed = time.perf_counter() - started
        _check(peer, url, _WARM_UP + jobs)
    return jobs / elapsed


def bulk(peer: str, settings: Settings, jobs: int) -> float:
    """One bulk enqueue call of ``jobs`` jobs through the peer's API; jobs/s."""
    payloads = [{"n": n} for n in range(jobs)]
    with fresh_database("postgresql", settings.target) as url:
        with _client(peer, url, install=True) as (loop, client):
            loop.run(client.many([{"n": n} for n in range(_WARM_UP)]))
            started = time.perf_counter()
            loop.run(client.many(payloads))
            elapsed = time.perf_counter() - started
        _check(peer, url, _WARM_UP + jobs)
    return jobs / elapsed


def _command(peer: str, *, in_flight: int, settings: Settings, burst: bool) -> list[str]:
    command = processes.peer_command(
        peer, in_flight=in_flight, poll_interval=settings.poll_interval
    )
    return [*command, "--burst"] if burst else command


def _timestamp(value: Any) -> datetime:
    assert isinstance(value, datetime), value
    return value


def _window(peer: str, url: str, jobs: int, released_at: datetime) -> float:
    import psycopg

    with psycopg.connect(postgres_dsn(url)) as conn:
        row = conn.execute(_WINDOWS[peer]).fetchone()
    assert row is not None
    first, last, succeeded = row
    if succeeded != jobs:
        raise SystemExit(f"{peer}: the drain left {succeeded} of {jobs} jobs succeeded")
    return (_timestamp(last) - max(_timestamp(first), released_at)).total_seconds()


def drain_measure(peer: str, *, in_flight: int, jobs: int, settings: Settings) -> drain.Drain:
    """Drain ``jobs`` queued no-op jobs with one ``peer`` worker holding ``in_flight``."""
    import psycopg

    with (
        fresh_database("postgresql", settings.target) as url,
        tempfile.TemporaryDirectory(prefix="sqlqueue-bench-peer-") as logs,
    ):
        with _client(peer, url, install=True) as (loop, client):
            loop.run(client.many([{"n": n} for n in range(jobs)]))
        monitor = Monitor(url, admin_url=settings.target.postgres_url)
        workers: list[processes.Worker] = []
        children_before = processes.children_cpu_seconds()
        try:
            with psycopg.connect(postgres_dsn(url)) as barrier:
                barrier.execute(f"LOCK TABLE {_TABLES[peer]} IN EXCLUSIVE MODE")
                command = _command(peer, in_flight=in_flight, settings=settings, burst=True)
                workers.append(
                    processes.start(
                        command,
                        engine=peer,
                        name=f"{peer}-0",
                        url=url,
                        logs=Path(logs),
                        record=None,
                    )
                )
                at_start = drain.wait_blocked(workers, monitor)
                start_up_cpu = sum(processes.cpu_seconds(worker.pid) for worker in workers)
                transactions_before = monitor.transactions()
                row = barrier.execute("SELECT clock_timestamp()").fetchone()
                assert row is not None
                released_at = _timestamp(row[0])
                barrier.commit()
            released = time.perf_counter()
            peak = drain.wait_exit(workers, monitor, settings.timeout, at_start)
            wall = time.perf_counter() - released
            worker_cpu = processes.children_cpu_seconds() - children_before - start_up_cpu
            transactions = monitor.settled_transactions() - transactions_before - 1
        finally:
            processes.stop_all(workers)
            monitor.close()
        window = _window(peer, url, jobs, released_at)
    return drain.Drain(
        jobs=jobs,
        window_seconds=window,
        wall_seconds=wall,
        worker_cpu_seconds=worker_cpu,
        connections=peak,
        transactions=transactions,
    )


def pickup_measure(peer: str, *, settings: Settings) -> list[float]:
    """Pickup latencies (ms) into an idle ``peer`` worker, as ``bench.pickup`` measures them."""
    with (
        fresh_database("postgresql", settings.target) as url,
        tempfile.TemporaryDirectory(prefix="sqlqueue-bench-peer-pickup-") as scratch,
    ):
        record = Path(scratch) / "starts.txt"
        record.touch()
        with _client(peer, url, install=True) as (loop, client):
            command = _command(
                peer, in_flight=settings.pickup_concurrency, settings=settings, burst=False
            )
            worker = processes.start(
                [*command, "--record", str(record)],
                engine=peer,
                name=f"{peer}-pickup",
                url=url,
                logs=Path(scratch),
                record=None,
            )
            committed: dict[int, float] = {}
            try:
                processes.wait_ready([worker], 60.0)
                loop.run(client.one({"seq": -1}, STAMP))  # warm-up
                pickup.wait_for(record, {-1}, worker, 30.0 + settings.poll_interval)
                time.sleep(pickup.SETTLE_SECONDS)
                origin = time.perf_counter()
                for seq in range(settings.pickup_jobs):
                    pause = origin + seq * settings.pickup_gap_seconds - time.perf_counter()
                    if pause > 0:
                        time.sleep(pause)
                    loop.run(client.one({"seq": seq}, STAMP))
                    committed[seq] = time.time()
                starts = pickup.wait_for(
                    record, set(committed), worker, 30.0 + 2 * settings.poll_interval
                )
            finally:
                processes.stop_all([worker])
    return [(starts[seq] - committed[seq]) * 1000.0 for seq in sorted(committed)]
