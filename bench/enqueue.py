"""Enqueue throughput: one job per transaction, and many jobs in one call.

sqlqueue enqueues through its public API in a transaction the caller opens
(``engine.begin()``), as an application does; the raw ceiling sends the same INSERT with the
same driver. A few warm-up jobs are written before the clock starts (statement caches,
prepared statements, the pool's first connection), so the figures are the steady state.
"""

from __future__ import annotations

import time

import sqlalchemy as sa

import sqlqueue
from bench.names import NOOP
from bench.raw_sql import connect

__all__ = [
    "bulk_raw",
    "bulk_sqlqueue",
    "copy_raw",
    "one_by_one_raw",
    "one_by_one_sqlqueue",
    "one_by_one_sqlqueue_engine",
]

_WARM_UP = 20


def _count(url: str) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.text("SELECT count(*) FROM sqlqueue_jobs")).scalar_one())
    finally:
        engine.dispose()


def _check(url: str, expected: int) -> None:
    found = _count(url)
    if found != expected:
        raise SystemExit(f"expected {expected} jobs in the database after enqueue, found {found}")


def one_by_one_sqlqueue(url: str, jobs: int) -> float:
    """``queue.enqueue`` in its own ``engine.begin()`` transaction, ``jobs`` times; jobs/s."""
    queue = sqlqueue.Queue(url)
    try:
        for n in range(_WARM_UP):
            with queue.engine.begin() as conn:
                queue.enqueue(conn, NOOP, {"n": n}, external=True)
        started = time.perf_counter()
        for n in range(jobs):
            with queue.engine.begin() as conn:
                queue.enqueue(conn, NOOP, {"n": n}, external=True)
        elapsed = time.perf_counter() - started
    finally:
        queue.engine.dispose()
    _check(url, _WARM_UP + jobs)
    return jobs / elapsed


def one_by_one_sqlqueue_engine(url: str, jobs: int) -> float:
    """``queue.enqueue(queue.engine, …)``, ``jobs`` times: sqlqueue owns each transaction (the
    contract's Engine form, for code with no transaction of its own to join); jobs/s."""
    queue = sqlqueue.Queue(url)
    try:
        for n in range(_WARM_UP):
            queue.enqueue(queue.engine, NOOP, {"n": n}, external=True)
        started = time.perf_counter()
        for n in range(jobs):
            queue.enqueue(queue.engine, NOOP, {"n": n}, external=True)
        elapsed = time.perf_counter() - started
    finally:
        queue.engine.dispose()
    _check(url, _WARM_UP + jobs)
    return jobs / elapsed


def one_by_one_raw(url: str, jobs: int) -> float:
    """One ``INSERT … RETURNING id`` and ``COMMIT`` per job with the same driver; jobs/s."""
    raw = connect(url)
    try:
        for n in range(_WARM_UP):
            raw.enqueue_one(NOOP, {"n": n})
        started = time.perf_counter()
        for n in range(jobs):
            raw.enqueue_one(NOOP, {"n": n})
        elapsed = time.perf_counter() - started
    finally:
        raw.close()
    _check(url, _WARM_UP + jobs)
    return jobs / elapsed


def bulk_sqlqueue(url: str, jobs: int) -> float:
    """One ``enqueue_many`` call of ``jobs`` requests and its commit; jobs/s.

    The clock covers building the requests from payloads, as an application pays for that.
    """
    queue = sqlqueue.Queue(url)
    payloads = [{"n": n} for n in range(jobs)]
    try:
        with queue.engine.begin() as conn:  # warm-up: first connection, compiled statement
            queue.enqueue_many(
                conn, [sqlqueue.JobRequest(job_type=NOOP, external=True) for _ in range(_WARM_UP)]
            )
        started = time.perf_counter()
        with queue.engine.begin() as conn:
            queue.enqueue_many(
                conn,
                [sqlqueue.JobRequest(job_type=NOOP, payload=p, external=True) for p in payloads],
            )
        elapsed = time.perf_counter() - started
    finally:
        queue.engine.dispose()
    _check(url, _WARM_UP + jobs)
    return jobs / elapsed


def bulk_raw(url: str, jobs: int) -> float:
    """Multi-row ``INSERT … RETURNING id`` (1,000 rows per statement), one commit; jobs/s."""
    raw = connect(url)
    payloads = [{"n": n} for n in range(jobs)]
    try:
        raw.enqueue_many(NOOP, [{"n": n} for n in range(_WARM_UP)])
        started = time.perf_counter()
        raw.enqueue_many(NOOP, payloads)
        elapsed = time.perf_counter() - started
    finally:
        raw.close()
    _check(url, _WARM_UP + jobs)
    return jobs / elapsed


def copy_raw(url: str, jobs: int) -> float:
    """PostgreSQL ``COPY … FROM STDIN`` of ``jobs`` rows, one commit, no ids back; jobs/s."""
    raw = connect(url)
    payloads = [{"n": n} for n in range(jobs)]
    try:
        raw.copy_many(NOOP, [{"n": n} for n in range(_WARM_UP)])
        started = time.perf_counter()
        raw.copy_many(NOOP, payloads)
        elapsed = time.perf_counter() - started
    finally:
        raw.close()
    _check(url, _WARM_UP + jobs)
    return jobs / elapsed
