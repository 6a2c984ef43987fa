"""The raw-SQL ceiling: sqlqueue's operations hand-written with the same drivers.

These statements do what the database must do for each operation and nothing else: the same
table, indexes and column values, the database clock for timestamps, ``RETURNING id`` where
sqlqueue returns ids, and completions fenced by worker and attempt as sqlqueue's are. The
drivers are the ones sqlqueue uses through SQLAlchemy: ``sqlite3``, psycopg 3 and PyMySQL.
MariaDB/MySQL have no ``UPDATE … RETURNING``: a claim there is the three statements sqlqueue
runs too (lock the due rows ``SKIP LOCKED``, lease them by id, read them back), and enqueue
uses MariaDB's ``INSERT … RETURNING``.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "LEASE_SECONDS",
    "Raw",
    "connect",
]

LEASE_SECONDS: Final = 30
#: Rows per multi-row INSERT (what SQLAlchemy's insertmanyvalues sends per statement too).
ROWS_PER_INSERT: Final = 1000
_COLUMNS: Final = (
    "job_type, queue, priority, payload, status, attempts, max_attempts, errors, "
    "next_run_at, created_at, updated_at"
)

# SQLite keeps timestamps as text in the layout SQLAlchemy writes (sqlqueue's clock uses it too).
_SQLITE_NOW: Final = "strftime('%Y-%m-%d %H:%M:%f000', 'now')"
_SQLITE_ROW: Final = (
    f"(?, ?, ?, ?, 'queued', 0, ?, '[]', {_SQLITE_NOW}, {_SQLITE_NOW}, {_SQLITE_NOW})"
)
_SQLITE_CLAIM: Final = f"""
UPDATE sqlqueue_jobs
   SET status = 'running', attempts = attempts + 1, locked_by = :worker,
       started_at = {_SQLITE_NOW}, updated_at = {_SQLITE_NOW},
       lease_expires_at = strftime('%Y-%m-%d %H:%M:%f000', 'now', :lease)
 WHERE id IN (SELECT id FROM sqlqueue_jobs
               WHERE status IN ('queued', 'failed') AND queue = :queue
                 AND next_run_at <= {_SQLITE_NOW}
               ORDER BY priority, next_run_at, id
               LIMIT :batch)
RETURNING id, attempts, payload
"""
_SQLITE_COMPLETE: Final = f"""
UPDATE sqlqueue_jobs
   SET status = 'succeeded', finished_at = {_SQLITE_NOW}, updated_at = {_SQLITE_NOW},
       lease_expires_at = NULL
 WHERE (id, attempts) IN (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]')
                             FROM json_each(:fences))
   AND status = 'running' AND locked_by = :worker
"""

_PG_NOW: Final = "statement_timestamp()"
_PG_ROW: Final = f"(%s, %s, %s, %s, 'queued', 0, %s, '[]', {_PG_NOW}, {_PG_NOW}, {_PG_NOW})"
_PG_CLAIM: Final = """
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
RETURNING j.id, j.attempts, j.payload
"""
_PG_COMPLETE: Final = """
UPDATE sqlqueue_jobs
   SET status = 'succeeded', finished_at = statement_timestamp(),
       updated_at = statement_timestamp(), lease_expires_at = NULL
 WHERE (id, attempts) IN (SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]))
   AND status = 'running' AND locked_by = %(worker)s
"""
_PG_COPY: Final = f"COPY sqlqueue_jobs ({_COLUMNS}) FROM STDIN"

_MY_NOW: Final = "UTC_TIMESTAMP(6)"
_MY_ROW: Final = f"(%s, %s, %s, %s, 'queued', 0, %s, '[]', {_MY_NOW}, {_MY_NOW}, {_MY_NOW})"
_MY_DUE: Final = f"""
SELECT id FROM sqlqueue_jobs
 WHERE status IN ('queued', 'failed') AND queue = %s AND next_run_at <= {_MY_NOW}
 ORDER BY priority, next_run_at, id
 LIMIT %s
   FOR UPDATE SKIP LOCKED
"""
_MY_LEASE: Final = f"""
UPDATE sqlqueue_jobs
   SET status = 'running', attempts = attempts + 1, locked_by = %s,
       started_at = {_MY_NOW}, updated_at = {_MY_NOW},
       lease_expires_at = TIMESTAMPADD(MICROSECOND, %s, {_MY_NOW})
 WHERE id IN ({{ids}})
"""
_MY_READ: Final = "SELECT id, attempts, payload FROM sqlqueue_jobs WHERE id IN ({ids})"
_MY_COMPLETE: Final = f"""
UPDATE sqlqueue_jobs
   SET status = 'succeeded', finished_at = {_MY_NOW}, updated_at = {_MY_NOW},
       lease_expires_at = NULL
 WHERE (id, attempts) IN ({{pairs}}) AND status = 'running' AND locked_by = %s
"""

#: A claimed job: id, attempt number, payload.
Claimed = tuple[int, int, dict[str, Any]]


def _insert(row: str, rows: int) -> str:
    """A multi-row INSERT of ``rows`` rows: placeholders only, every value is bound."""
    values = ", ".join([row] * rows)
    return f"INSERT INTO sqlqueue_jobs ({_COLUMNS}) VALUES {values} RETURNING id"


class Raw:
    """One raw connection to a benchmark database, with sqlqueue's operations as plain SQL.

    With ``autocommit`` each claim and completion is a single-statement transaction (no
    separate BEGIN/COMMIT round trips on PostgreSQL): the cheapest a worker can do. Enqueue
    runs in an explicit transaction, as an application's would. ``relaxed``: commits do not
    wait for the disk (PostgreSQL ``synchronous_commit = off`` for the session, SQLite
    ``synchronous = NORMAL``), as sqlqueue's worker commits its claims and outcomes; MariaDB
    has no per-session setting (``innodb_flush_log_at_trx_commit`` is the server's).
    """

    def __init__(self, url: str, *, autocommit: bool = False, relaxed: bool = False) -> None:
        import sqlalchemy as sa

        parsed = sa.make_url(url)
        self.backend = parsed.get_backend_name()
        self.autocommit = autocommit
        self._sqlite: sqlite3.Connection | None = None
        self._pg: psycopg.Connection[Any] | None = None
        self._my: Any = None
        if self.backend == "mysql":
            import pymysql  # type: ignore[import-untyped]

            self._my = pymysql.connect(
                host=parsed.host or "127.0.0.1",
                port=parsed.port or 3306,
                user=parsed.username or "root",
                password=parsed.password or "",
                database=parsed.database or "",
                autocommit=autocommit,
            )
            with self._my.cursor() as cursor:  # as sqlqueue's engine sets every connection
                cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        elif self.backend == "sqlite":
            # The settings sqlqueue's engine gives every connection; the rest stays default.
            # Autocommit: explicit BEGIN IMMEDIATE/COMMIT; otherwise the module's implicit
            # deferred BEGIN before DML, as SQLAlchemy's pysqlite dialect uses for sqlqueue.
            conn = sqlite3.connect(parsed.database or "", check_same_thread=False)
            if autocommit:
                conn.isolation_level = None
            conn.execute("PRAGMA busy_timeout = 30000")
            conn.execute("PRAGMA journal_mode = WAL")
            if relaxed:
                conn.execute("PRAGMA synchronous = NORMAL")
            self._sqlite = conn
        else:
            import psycopg

            dsn = parsed.set(drivername="postgresql").render_as_string(hide_password=False)
            self._pg = psycopg.connect(dsn, autocommit=autocommit)
            if relaxed:
                self._pg.execute("SET synchronous_commit = off")

    def close(self) -> None:
        if self._sqlite is not None:
            self._sqlite.close()
        if self._pg is not None:
            self._pg.close()
        if self._my is not None:
            self._my.close()

    # -- enqueue -------------------------------------------------------------------------------

    def _params(self, job_type: str, payload: dict[str, Any]) -> tuple[Any, ...]:
        if self._pg is not None:
            from psycopg.types.json import Jsonb

            return (job_type, "default", 0, Jsonb(payload), 8)
        return (job_type, "default", 0, json.dumps(payload), 8)

    def enqueue_one(self, job_type: str, payload: dict[str, Any]) -> int:
        """One INSERT … RETURNING id and its COMMIT."""
        params = self._params(job_type, payload)
        if self._sqlite is not None:
            job_id = self._sqlite.execute(_insert(_SQLITE_ROW, 1), params).fetchone()[0]
            self._sqlite.commit()
            return int(job_id)
        if self._my is not None:
            with self._my.cursor() as cursor:
                cursor.execute(_insert(_MY_ROW, 1), params)
                (job_id,) = cursor.fetchone()
            self._my.commit()
            return int(job_id)
        assert self._pg is not None
        row = self._pg.execute(_insert(_PG_ROW, 1), params).fetchone()
        self._pg.commit()
        assert row is not None
        return int(row[0])

    def enqueue_many(self, job_type: str, payloads: Sequence[dict[str, Any]]) -> list[int]:
        """Multi-row INSERTs of up to 1,000 rows each, RETURNING ids, in one transaction."""
        ids: list[int] = []
        for start in range(0, len(payloads), ROWS_PER_INSERT):
            chunk = payloads[start : start + ROWS_PER_INSERT]
            params = [value for p in chunk for value in self._params(job_type, p)]
            if self._sqlite is not None:
                rows = self._sqlite.execute(_insert(_SQLITE_ROW, len(chunk)), params)
                ids.extend(int(r[0]) for r in rows.fetchall())
            elif self._my is not None:
                with self._my.cursor() as cursor:
                    cursor.execute(_insert(_MY_ROW, len(chunk)), params)
                    ids.extend(int(r[0]) for r in cursor.fetchall())
            else:
                assert self._pg is not None
                cursor = self._pg.execute(_insert(_PG_ROW, len(chunk)), params)
                ids.extend(int(r[0]) for r in cursor.fetchall())
        self._commit()
        return ids

    def copy_many(self, job_type: str, payloads: Sequence[dict[str, Any]]) -> int:
        """PostgreSQL ``COPY … FROM STDIN`` of every row, one transaction, no ids back."""
        assert self._pg is not None, "COPY is PostgreSQL's"
        with self._pg.cursor() as cursor, cursor.copy(_PG_COPY) as copy:
            for payload in payloads:
                copy.write_row(
                    (job_type, "default", 0, json.dumps(payload), "queued", 0, 8, "[]")
                    + ("now",) * 3
                )
        self._pg.commit()
        return len(payloads)

    # -- claim and complete --------------------------------------------------------------------

    def claim(self, *, worker: str, batch: int, queue: str = "default") -> list[Claimed]:
        """Lease up to ``batch`` due jobs in one statement (own transaction)."""
        if self._sqlite is not None:
            conn = self._sqlite
            conn.execute("BEGIN IMMEDIATE")
            rows = conn.execute(
                _SQLITE_CLAIM,
                {
                    "worker": worker,
                    "lease": f"+{LEASE_SECONDS} seconds",
                    "queue": queue,
                    "batch": batch,
                },
            ).fetchall()
            conn.execute("COMMIT")
            return [(int(i), int(a), json.loads(p)) for i, a, p in rows]
        if self._my is not None:
            return self._my_claim(worker=worker, batch=batch, queue=queue)
        assert self._pg is not None
        params = {"queue": queue, "batch": batch, "worker": worker, "lease": LEASE_SECONDS}
        claimed = self._pg.execute(_PG_CLAIM, params).fetchall()
        if not self.autocommit:
            self._pg.commit()
        return [(int(i), int(a), dict(p)) for i, a, p in claimed]

    def complete(self, *, worker: str, jobs: Sequence[Claimed]) -> None:
        """Mark the claimed jobs succeeded in one fenced statement (own transaction)."""
        if self._sqlite is not None:
            conn = self._sqlite
            conn.execute("BEGIN IMMEDIATE")
            fences = json.dumps([[job_id, attempt] for job_id, attempt, _ in jobs])
            conn.execute(_SQLITE_COMPLETE, {"fences": fences, "worker": worker})
            conn.execute("COMMIT")
            return
        if self._my is not None:
            pairs = ", ".join(["(%s, %s)"] * len(jobs))
            values = [value for job_id, attempt, _ in jobs for value in (job_id, attempt)]
            with self._my.cursor() as cursor:
                cursor.execute(_MY_COMPLETE.format(pairs=pairs), [*values, worker])
            self._my.commit()
            return
        assert self._pg is not None
        self._pg.execute(
            _PG_COMPLETE,
            {
                "ids": [job_id for job_id, _, _ in jobs],
                "attempts": [attempt for _, attempt, _ in jobs],
                "worker": worker,
            },
        )
        if not self.autocommit:
            self._pg.commit()

    def _my_claim(self, *, worker: str, batch: int, queue: str) -> list[Claimed]:
        """Lock, lease and read back in one transaction (no ``UPDATE … RETURNING``)."""
        conn = self._my
        conn.begin()
        with conn.cursor() as cursor:
            cursor.execute(_MY_DUE, (queue, batch))
            ids = [int(row[0]) for row in cursor.fetchall()]
            if not ids:
                conn.commit()
                return []
            marks = ", ".join(["%s"] * len(ids))
            cursor.execute(_MY_LEASE.format(ids=marks), [worker, LEASE_SECONDS * 1_000_000, *ids])
            cursor.execute(_MY_READ.format(ids=marks), ids)
            rows = cursor.fetchall()
        conn.commit()
        return [(int(i), int(a), json.loads(p)) for i, a, p in rows]

    def _commit(self) -> None:
        if self._sqlite is not None:
            self._sqlite.commit()
        elif self._pg is not None:
            self._pg.commit()
        elif self._my is not None:
            self._my.commit()


def connect(url: str, *, autocommit: bool = False, relaxed: bool = False) -> Raw:
    """A raw connection to the database at SQLAlchemy ``url`` (see :class:`Raw`)."""
    return Raw(url, autocommit=autocommit, relaxed=relaxed)
