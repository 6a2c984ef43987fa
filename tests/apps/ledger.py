"""A ledger of handler executions, written by the handlers themselves, for the process tests.

Every execution of a ledger task appends one row — (job_id, attempt, pid, started, finished) —
in its own autocommitted transaction, so a test counts what really ran from data, not logs.
A handler learns its job's id and attempt from the job row, which it finds by the unique
``idempotency_key`` the test gave it (its payload's ``key``).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import sqlqueue
from tests.apps.uninterrupted import uninterrupted

__all__ = [
    "LEDGER",
    "LedgerRow",
    "create_ledger",
    "read_ledger",
    "register_ledger_tasks",
]

_metadata = sa.MetaData()

LEDGER = sa.Table(
    "test_ledger",
    _metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.BigInteger, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("started", sa.Double, nullable=False),
    sa.Column("finished", sa.Double, nullable=True),
)

# The two columns of sqlqueue's job table a handler reads to know which attempt it is.
_jobs = sa.table(
    "sqlqueue_jobs",
    sa.column("id", sa.BigInteger),
    sa.column("attempts", sa.Integer),
    sa.column("idempotency_key", sa.String),
)

#: One ledger row: ``id, job_id, attempt, pid, started, finished`` (epoch seconds).
LedgerRow = sa.Row[Any]


def create_ledger(engine: sa.Engine) -> None:
    """Create the ledger table (the test owns it; sqlqueue's migrations do not know it)."""
    _metadata.create_all(engine)


def read_ledger(engine: sa.Engine) -> list[LedgerRow]:
    """Every ledger row, oldest first."""
    with engine.connect() as conn:
        return list(conn.execute(sa.select(LEDGER).order_by(LEDGER.c.id)).all())


def _record_start(engine: sa.Engine, key: str, finished: bool) -> tuple[int, int]:
    """Append this execution's row; return its ledger id and the job's attempt number.

    One INSERT … SELECT statement, so on SQLite it takes the write lock at once (a read
    followed by a write could fail with SQLITE_BUSY instead of waiting).
    """
    with engine.begin() as conn:
        ledger_id, attempt = conn.execute(_recorded(key, finished)).one()
    return int(ledger_id), int(attempt)


def _recorded(key: str, finished: bool) -> sa.Insert:
    """The INSERT … SELECT of :func:`_record_start`."""
    now = time.time()
    source = sa.select(
        _jobs.c.id,
        _jobs.c.attempts,
        sa.literal(os.getpid(), sa.Integer),
        sa.literal(now, sa.Double),
        sa.literal(now if finished else None, sa.Double),
    ).where(_jobs.c.idempotency_key == key)
    return (
        LEDGER.insert()
        .from_select(["job_id", "attempt", "pid", "started", "finished"], source)
        .returning(LEDGER.c.id, LEDGER.c.attempt)
    )


def _record_finish(engine: sa.Engine, ledger_id: int) -> None:
    with engine.begin() as conn:
        conn.execute(LEDGER.update().where(LEDGER.c.id == ledger_id).values(finished=time.time()))


def register_ledger_tasks(queue: sqlqueue.Queue, *, timeout: float = 0.5) -> None:
    """Register the ledger tasks on ``queue``; its engine also writes the ledger.

    ``timeout`` is the limit of the ``timed_*`` tasks, which exist to run past it.
    """
    engine = queue.engine
    no_retry_wait = sqlqueue.schedule([0])

    @queue.task("ledger.record", backoff=no_retry_wait)
    def record(key: str) -> None:
        """The no-op job: one ledger row, started and finished at once."""
        _record_start(engine, key, finished=True)

    @queue.task("ledger.in_transaction", backoff=no_retry_wait)
    def in_transaction(key: str, ctx: sqlqueue.JobContext, seconds: float = 0.0) -> None:
        """A ledger row written in the handler's transaction, which completes the job with it
        (``ctx.transaction()``): it commits only if the job's success does."""
        with ctx.transaction() as conn:
            conn.execute(_recorded(key, finished=True))
            time.sleep(seconds)

    @queue.task("ledger.sleep", backoff=no_retry_wait)
    def sleep(key: str, seconds: float, first_seconds: float | None = None) -> None:
        """Sleep ``seconds`` (``first_seconds`` on attempt 1), with start and finish rows."""
        ledger_id, attempt = _record_start(engine, key, finished=False)
        time.sleep(first_seconds if attempt == 1 and first_seconds is not None else seconds)
        _record_finish(engine, ledger_id)

    @queue.task("ledger.gated", backoff=no_retry_wait)
    def gated(key: str, gate: str) -> dict[str, int]:
        """Run until the file ``<gate>.<attempt>`` exists (at most a minute), so the test
        decides when each attempt ends; the result says which attempt and process it was."""
        ledger_id, attempt = _record_start(engine, key, finished=False)
        opened = Path(f"{gate}.{attempt}")
        deadline = time.monotonic() + 60
        while not opened.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{opened} was never created")
            time.sleep(0.02)
        _record_finish(engine, ledger_id)
        return {"attempt": attempt, "pid": os.getpid()}

    @queue.task("ledger.timed_spin", timeout=timeout, backoff=no_retry_wait)
    def timed_spin(key: str) -> None:
        """A CPU loop that never ends by itself: only the timeout's interrupt stops it. Its
        ledger row is written whole, even when the timeout comes during the write."""
        uninterrupted(lambda: _record_start(engine, key, finished=False))
        counter = 0
        while True:
            counter += 1

    @queue.task("ledger.timed_sleep", timeout=timeout, backoff=no_retry_wait)
    def timed_sleep(key: str, seconds: float, later_seconds: float | None = None) -> None:
        """Blocked in ``time.sleep`` (a C call no interrupt reaches) on attempt 1, or always.
        Its ledger rows are written whole, even when the timeout comes during a write."""
        ledger_id, attempt = uninterrupted(lambda: _record_start(engine, key, finished=False))
        time.sleep(later_seconds if attempt > 1 and later_seconds is not None else seconds)
        uninterrupted(lambda: _record_finish(engine, ledger_id))

    @queue.task("ledger.timed_await", timeout=timeout, backoff=no_retry_wait)
    async def timed_await(key: str) -> None:
        """An async handler that awaits something that never happens."""
        await asyncio.to_thread(_record_start, engine, key, False)
        await asyncio.Event().wait()

    _ = (record, in_transaction, sleep, gated, timed_spin, timed_sleep, timed_await)
