"""What the soak reads from one database each interval: throughput and pickup latency from the
job rows (database clock), the job table's size, dead tuples, and the workers' RSS.

Throughput counts jobs that finished (succeeded or dead) in the interval, by their
``finished_at``; the offered rate the enqueuer achieved counts jobs created in it. Pickup
latency runs from when a first attempt was due to when its handler started, on the database
clock: due is the row's ``created_at`` (the INSERT's statement time, a little before its COMMIT,
so the figure errs high; the soak's jobs are due at once), the start is the ``time.time()`` the
handler appended to its worker's record file (``bench.soak_app``), moved onto the database
clock by the offset measured at each sample (the workers run on this machine, so it is the
clock the gauge reads). Not the row's ``started_at``: a job claimed ahead of a free slot has it
written later, with its outcome or the next claim round (up to the outcome batch's latency
too late), and the claim's statement time comes before the worker has the job; that figure is
kept as ``row_pickup_p99_ms``, for comparison, and not judged. All of these read rows that
retention has not pruned yet, which is why the soak keeps finished jobs longer than an
interval. Size: on PostgreSQL ``pg_total_relation_size`` (the table, its indexes and TOAST)
and ``n_dead_tup``; on SQLite the pages of the table and its indexes from ``dbstat``, and the
file's pages (in use or free).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator, Sequence
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

__all__ = ["Gauge", "StartRecords", "percentile"]

_MB = 1024 * 1024
_UNFINISHED = ("queued", "failed", "running")
#: Job ids per ``IN (...)`` when reading the rows of recorded starts (bound, under SQLite's cap).
_CHUNK = 500
#: Round trips that measure the clock offset (the shortest counts).
_CLOCK_READS = 5


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (inclusive method), or None without values."""
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q) - 1]


class StartRecords:
    """The handlers' start records (``job_id attempt time`` lines), read on from where the last
    read stopped; a line still being written waits for the next read."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self._offsets = dict.fromkeys(paths, 0)

    def first_attempts(self) -> dict[int, float]:
        """``{job_id: time.time() at its first attempt's start}`` appended since the last call."""
        starts: dict[int, float] = {}
        for line in self._new_lines():
            job_id, attempt, started = line.split()
            if attempt == "1":
                starts.setdefault(int(job_id), float(started))
        return starts

    def _new_lines(self) -> Iterator[str]:
        for path, offset in self._offsets.items():
            if not path.exists():
                continue
            with path.open("rb") as record:
                record.seek(offset)
                data = record.read()
            complete = data.rfind(b"\n") + 1
            self._offsets[path] = offset + complete
            yield from data[:complete].decode("utf-8").splitlines()


class Gauge:
    """Reads one soak database's figures; ``sample()`` covers the time since the last call."""

    def __init__(
        self, backend: str, url: str, *, admin_url: str, records: Sequence[Path] = ()
    ) -> None:
        self.backend = backend
        self._url = url
        self._records = StartRecords(records)
        self._engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        self._now = sa.select(sa.type_coerce(dialect_for(self._engine).now(), UtcDateTime()))
        self._monitor = Monitor(url, admin_url=admin_url) if backend == "postgresql" else None
        self._since = self.database_now()
        self._records.first_attempts()  # starts before the first sample belong to the warm-up
        self._transactions = self._monitor.transactions() if self._monitor else 0

    def database_now(self) -> datetime:
        with self._engine.connect() as conn:
            now: datetime = conn.execute(self._now).scalar_one()
        return now

    def clock_offset(self, conn: sa.Connection) -> float:
        """Seconds the database clock is ahead of ``time.time()`` here: its time against the
        middle of the shortest of a few round trips on an open connection (a connect's own
        round trips would skew it)."""
        best = (float("inf"), 0.0)
        for _ in range(_CLOCK_READS):
            before = time.time()
            now: datetime = conn.execute(self._now).scalar_one()
            after = time.time()
            best = min(best, (after - before, now.timestamp() - (before + after) / 2))
        return best[1]

    def _pickups(self, conn: sa.Connection, starts: dict[int, float], offset: float) -> list[float]:
        """Milliseconds from each recorded first attempt's due time (``created_at``) to its
        handler's start on the database clock; a row already pruned is left out."""
        ids = sorted(starts)
        pickups = []
        for at in range(0, len(ids), _CHUNK):
            due = conn.execute(
                sa.select(jobs.c.id, jobs.c.created_at).where(jobs.c.id.in_(ids[at : at + _CHUNK]))
            ).all()
            pickups += [
                (starts[job_id] + offset - created.timestamp()) * 1000.0 for job_id, created in due
            ]
        return pickups

    def sample(self, worker_pids: Sequence[int]) -> dict[str, Any]:
        """Every figure for the interval since the last sample (or since construction)."""
        starts = self._records.first_attempts()
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
            rows = conn.execute(
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
            offset = self.clock_offset(conn)
            pickups = self._pickups(conn, starts, offset)
        from_rows = [(started - created).total_seconds() * 1000.0 for created, started in rows]
        rss = [processes.rss_bytes(pid) for pid in worker_pids]
        row: dict[str, Any] = {
            "seconds": seconds,
            "enqueued_per_s": created / seconds,
            "jobs_per_s": finished / seconds,
            "pickups": len(pickups),
            "pickup_p50_ms": percentile(pickups, 50),
            "pickup_p99_ms": percentile(pickups, 99),
            "pickups_unmatched": len(starts) - len(pickups),
            "row_pickup_p99_ms": percentile(from_rows, 99),
            "clock_offset_ms": offset * 1000.0,
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
                **self._oldest_writer(conn),
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

    def _oldest_writer(self, conn: sa.Connection) -> dict[str, Any]:
        """The server's oldest open transaction that holds a transaction id, in any database:
        every snapshot taken anywhere counts it as running, so no database's VACUUM may remove
        what was deleted after it began (on a shared server, another database's long write
        transaction bloats this one's table; ``oldest_xact_s`` sees only this database)."""
        found = conn.execute(
            sa.text(
                "SELECT extract(epoch FROM clock_timestamp() - xact_start)::float8, datname, "
                "       application_name, coalesce(state, '') "
                "  FROM pg_stat_activity "
                " WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid() "
                " ORDER BY age(backend_xid) DESC LIMIT 1"
            )
        ).first()
        if found is None:
            return {"oldest_writer_s": 0.0, "oldest_writer": ""}
        age, database, name, state = found
        return {
            "oldest_writer_s": float(age or 0.0),
            "oldest_writer": f"{database} {name} ({state})",
        }

    def close(self) -> None:
        if self._monitor is not None:
            self._monitor.close()
        self._engine.dispose()
