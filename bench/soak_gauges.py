"""What the soak reads from one database each interval: throughput and pickup latency from the
job rows (database clock), the job table's size, dead tuples, and the workers' RSS.

Throughput counts jobs that finished (succeeded or dead) in the interval, by their
``finished_at``; the offered rate the enqueuer achieved counts jobs created in it; pickup
latency is ``started_at - created_at`` of first attempts that started in it. All three read
rows that retention has not pruned yet, which is why the soak keeps finished jobs longer than
an interval. Size: on PostgreSQL ``pg_total_relation_size`` (the table, its indexes and TOAST)
and ``n_dead_tup``; on SQLite the pages of the table and its indexes from ``dbstat``, and the
file's pages (in use or free).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from bench import processes
from bench.databases import sqlite_path
from bench.pg_monitor import Monitor
from sqlqueue._schema import jobs
from sqlqueue._types import UtcDateTime
from sqlqueue.dialects import dialect_for

__all__ = ["Gauge", "percentile"]

_MB = 1024 * 1024
_UNFINISHED = ("queued", "failed", "running")


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (inclusive method), or None without values."""
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q) - 1]


class Gauge:
    """Reads one soak database's figures; ``sample()`` covers the time since the last call."""

    def __init__(self, backend: str, url: str, *, admin_url: str) -> None:
        self.backend = backend
        self._url = url
        self._engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        self._now = sa.select(sa.type_coerce(dialect_for(self._engine).now(), UtcDateTime()))
        self._monitor = Monitor(url, admin_url=admin_url) if backend == "postgresql" else None
        self._since = self.database_now()
        self._transactions = self._monitor.transactions() if self._monitor else 0

    def database_now(self) -> datetime:
        with self._engine.connect() as conn:
            now: datetime = conn.execute(self._now).scalar_one()
        return now

    def sample(self, worker_pids: Sequence[int]) -> dict[str, Any]:
        """Every figure for the interval since the last sample (or since construction)."""
        since, until = self._since, self.database_now()
        seconds = max((until - since).total_seconds(), 1e-6)
        with self._engine.connect() as conn:
            finished = conn.execute(
                sa.select(sa.func.count())
                .select_from(jobs)
                .where(
                    jobs.c.status.in_(("succeeded", "dead")),
                    jobs.c.finished_at >= since,
                    jobs.c.finished_at < until,
                )
            ).scalar_one()
            created = conn.execute(
                sa.select(sa.func.count())
                .select_from(jobs)
                .where(jobs.c.created_at >= since, jobs.c.created_at < until)
            ).scalar_one()
            starts = conn.execute(
                sa.select(jobs.c.created_at, jobs.c.started_at).where(
                    jobs.c.attempts == 1, jobs.c.started_at >= since, jobs.c.started_at < until
                )
            ).all()
            counts: dict[str, int] = dict(
                conn.execute(
                    sa.select(jobs.c.status, sa.func.count()).group_by(jobs.c.status)
                ).all()
            )
            sizes = self._sizes(conn)
        pickups = [(started - created).total_seconds() * 1000.0 for created, started in starts]
        rss = [processes.rss_bytes(pid) for pid in worker_pids]
        row: dict[str, Any] = {
            "seconds": seconds,
            "enqueued_per_s": created / seconds,
            "jobs_per_s": finished / seconds,
            "pickups": len(pickups),
            "pickup_p50_ms": percentile(pickups, 50),
            "pickup_p99_ms": percentile(pickups, 99),
            "rows": sum(counts.values()),
            "unfinished": sum(counts.get(status, 0) for status in _UNFINISHED),
            "dead_jobs": counts.get("dead", 0),
            "worker_rss_mb": sum(rss) / _MB,
            "worker_rss_max_mb": max(rss, default=0) / _MB,
            **sizes,
        }
        if self._monitor is not None:
            total = self._monitor.transactions()
            row["transactions_per_s"] = (total - self._transactions) / seconds
            oldest = self._monitor.oldest_transaction()
            row["oldest_xact_s"] = oldest[0] if oldest else 0.0
            row["oldest_xact_by"] = f"{oldest[1]} ({oldest[2]})" if oldest else ""
            self._transactions = total
        self._since = until
        return row

    def _sizes(self, conn: sa.Connection) -> dict[str, Any]:
        if self.backend == "postgresql":
            total, table, indexes, live, dead, vacuums = conn.execute(
                sa.text(
                    "SELECT pg_total_relation_size(relid), pg_relation_size(relid), "
                    "       pg_indexes_size(relid), n_live_tup, n_dead_tup, "
                    "       autovacuum_count + vacuum_count "
                    "  FROM pg_stat_user_tables WHERE relname = 'sqlqueue_jobs'"
                )
            ).one()
            return {
                "size_mb": total / _MB,
                "table_mb": table / _MB,
                "indexes_mb": indexes / _MB,
                "live_tuples": live,
                "dead_tuples": dead,
                "vacuums": vacuums,
            }
        table, total = conn.execute(
            sa.text(
                "SELECT coalesce(sum(CASE WHEN name = 'sqlqueue_jobs' THEN pgsize END), 0), "
                "       coalesce(sum(pgsize), 0) FROM dbstat WHERE name IN "
                "(SELECT name FROM sqlite_master WHERE tbl_name = 'sqlqueue_jobs')"
            )
        ).one()
        pages = conn.exec_driver_sql("PRAGMA page_count").scalar_one()
        page_size = conn.exec_driver_sql("PRAGMA page_size").scalar_one()
        free = conn.exec_driver_sql("PRAGMA freelist_count").scalar_one()
        wal = Path(f"{sqlite_path(self._url)}-wal")
        return {
            "size_mb": total / _MB,
            "table_mb": table / _MB,
            "indexes_mb": (total - table) / _MB,
            "file_mb": pages * page_size / _MB,
            "free_mb": free * page_size / _MB,
            "wal_mb": wal.stat().st_size / _MB if wal.exists() else 0.0,
        }

    def close(self) -> None:
        if self._monitor is not None:
            self._monitor.close()
        self._engine.dispose()
