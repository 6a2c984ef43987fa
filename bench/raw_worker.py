"""The raw-SQL ceiling for the drain benchmark: claim and complete with hand-written SQL.

One process, one connection, no handler, no threads: claim up to 100 due jobs in one
statement, mark them succeeded in a second, repeat until a claim returns nothing. It uses the
same table, indexes and driver (``sqlite3`` / psycopg) as sqlqueue, so the gap between the two
is what sqlqueue's worker machinery costs.

Run by ``bench/drain.py`` as ``python -m bench.raw_worker URL``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sqlite3
from collections.abc import Sequence
from typing import Final

import sqlalchemy as sa

BATCH: Final = 100
LEASE_SECONDS: Final = 30

# SQLite keeps timestamps as text in the layout SQLAlchemy writes (sqlqueue's clock uses it too).
SQLITE_CLOCK: Final = "%Y-%m-%d %H:%M:%f000"
SQLITE_CLAIM: Final = """
UPDATE sqlqueue_jobs
   SET status = 'running', attempts = attempts + 1, locked_by = :worker,
       started_at = strftime(:fmt, 'now'), updated_at = strftime(:fmt, 'now'),
       lease_expires_at = strftime(:fmt, 'now', :lease)
 WHERE id IN (SELECT id FROM sqlqueue_jobs
               WHERE status IN ('queued', 'failed') AND queue = :queue
                 AND next_run_at <= strftime(:fmt, 'now')
               ORDER BY priority, next_run_at, id
               LIMIT :batch)
RETURNING id, payload
"""
SQLITE_COMPLETE: Final = """
UPDATE sqlqueue_jobs
   SET status = 'succeeded', finished_at = strftime(:fmt, 'now'),
       updated_at = strftime(:fmt, 'now'), lease_expires_at = NULL
 WHERE id IN (SELECT value FROM json_each(:ids)) AND status = 'running' AND locked_by = :worker
"""

POSTGRES_CLAIM: Final = """
WITH due AS MATERIALIZED (
    SELECT id FROM sqlqueue_jobs
     WHERE status IN ('queued', 'failed') AND queue = %(queue)s
       AND next_run_at <= statement_timestamp()
     ORDER BY priority, next_run_at, id
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED)
UPDATE sqlqueue_jobs AS j
   SET status = 'running', attempts = j.attempts + 1, locked_by = %(worker)s,
       started_at = statement_timestamp(), updated_at = statement_timestamp(),
       lease_expires_at = statement_timestamp() + make_interval(secs => %(lease)s)
  FROM due WHERE j.id = due.id
RETURNING j.id, j.payload
"""
POSTGRES_COMPLETE: Final = """
UPDATE sqlqueue_jobs
   SET status = 'succeeded', finished_at = statement_timestamp(),
       updated_at = statement_timestamp(), lease_expires_at = NULL
 WHERE id = ANY(%(ids)s) AND status = 'running' AND locked_by = %(worker)s
"""


def drain_sqlite(path: str, worker: str, queue: str) -> int:
    """Drain with ``sqlite3``: ``BEGIN IMMEDIATE`` around each statement, as sqlqueue does."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA busy_timeout = 30000")
    conn.execute("PRAGMA journal_mode = WAL")
    done = 0
    try:
        while True:
            conn.execute("BEGIN IMMEDIATE")
            rows = conn.execute(
                SQLITE_CLAIM,
                {
                    "worker": worker,
                    "fmt": SQLITE_CLOCK,
                    "lease": f"+{LEASE_SECONDS} seconds",
                    "queue": queue,
                    "batch": BATCH,
                },
            ).fetchall()
            conn.execute("COMMIT")
            if not rows:
                return done
            ids = [row[0] for row in rows]
            for _, payload in rows:
                json.loads(payload)  # what a handler would receive
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                SQLITE_COMPLETE, {"fmt": SQLITE_CLOCK, "ids": json.dumps(ids), "worker": worker}
            )
            conn.execute("COMMIT")
            done += len(ids)
    finally:
        conn.close()


def drain_postgres(dsn: str, worker: str, queue: str) -> int:
    """Drain with psycopg: each statement its own (autocommit) transaction."""
    import psycopg

    done = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            rows = conn.execute(
                POSTGRES_CLAIM,
                {"queue": queue, "batch": BATCH, "worker": worker, "lease": LEASE_SECONDS},
            ).fetchall()
            if not rows:
                return done
            ids = [row[0] for row in rows]
            conn.execute(POSTGRES_COMPLETE, {"ids": ids, "worker": worker})
            done += len(ids)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Drain sqlqueue_jobs with raw SQL.")
    parser.add_argument("url", help="SQLAlchemy URL of the database (sqlite or postgresql)")
    parser.add_argument("--queue", default="default")
    args = parser.parse_args(argv)
    url = sa.make_url(args.url)
    worker = f"raw:{socket.gethostname()}:{os.getpid()}"
    backend = url.get_backend_name()
    if backend == "sqlite":
        drained = drain_sqlite(url.database or "", worker, args.queue)
    elif backend == "postgresql":
        dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
        drained = drain_postgres(dsn, worker, args.queue)
    else:
        parser.error(f"unsupported backend {backend!r}")
    print(drained)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
