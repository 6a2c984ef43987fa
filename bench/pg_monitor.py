"""Watching a PostgreSQL benchmark database from the side: connections, lock waits, commits.

Each benchmark worker connects with its own ``application_name`` (``PGAPPNAME``), so
``pg_stat_activity`` tells which worker process holds which connections and which are
waiting for a lock. ``pg_stat_database`` counts the transactions the database ran. The
monitor itself connects to the server's admin database (``--postgres-url``), so its own
queries are not counted against the benchmark database.
"""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa

from bench.databases import postgres_dsn
from bench.processes import APP_PREFIX

__all__ = ["Monitor"]

_WORKERS = "datname = %(db)s AND starts_with(application_name, %(prefix)s)"


class Monitor:
    """An autocommit connection beside the benchmark database at ``url``."""

    def __init__(self, url: str, *, admin_url: str) -> None:
        import psycopg

        self._params = {"db": sa.make_url(url).database, "prefix": APP_PREFIX}
        self._conn: Any = psycopg.connect(postgres_dsn(admin_url), autocommit=True)

    def _rows(self, sql: str) -> list[Any]:
        rows: list[Any] = self._conn.execute(sql, self._params).fetchall()
        return rows

    def connections(self) -> dict[str, int]:
        """Open connections per benchmark worker (its name without the prefix)."""
        rows = self._rows(
            f"SELECT application_name, count(*) FROM pg_stat_activity WHERE {_WORKERS} "
            "GROUP BY application_name"
        )
        return {str(name)[len(APP_PREFIX) :]: int(count) for name, count in rows}

    def lock_waiters(self) -> set[str]:
        """Benchmark workers with a backend waiting for a lock (blocked at the barrier)."""
        rows = self._rows(
            f"SELECT DISTINCT application_name FROM pg_stat_activity WHERE {_WORKERS} "
            "AND wait_event_type = 'Lock'"
        )
        return {str(name)[len(APP_PREFIX) :] for (name,) in rows}

    def transactions(self) -> int:
        """Commits plus rollbacks the benchmark database has counted so far."""
        rows = self._rows(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %(db)s"
        )
        return int(rows[0][0])

    def settled_transactions(self, timeout: float = 5.0) -> int:
        """:meth:`transactions` once every worker's backend has gone (flushing its counts)."""
        deadline = time.monotonic() + timeout
        while self.connections() and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.transactions()

    def oldest_transaction(self) -> tuple[float, str, str] | None:
        """The benchmark database's oldest open transaction, any client's: its age in seconds,
        ``application_name`` and ``state``; None when none is open. Its snapshot holds back
        what VACUUM may remove from that database's tables."""
        rows = self._rows(
            "SELECT extract(epoch FROM clock_timestamp() - xact_start)::float8, "
            "       application_name, coalesce(state, '') "
            "  FROM pg_stat_activity WHERE datname = %(db)s AND xact_start IS NOT NULL "
            "   AND pid <> pg_backend_pid() ORDER BY xact_start LIMIT 1"
        )
        if not rows:
            return None
        age, name, state = rows[0]
        return float(age), str(name), str(state)

    def close(self) -> None:
        if not self._conn.closed:
            self._conn.close()
