"""``python -m bench --only mvcc``: queues under a long-held transaction (PostgreSQL).

Every system gets a database of its own and runs there at the same time as the others
(interleaved, not one after another: they share the machine and the server, and each sees the
same minutes): a steady enqueue load (``--mvcc-rate`` jobs/s, a transaction of a tenth of them
every 100 ms) and one worker holding up to 10 jobs, draining. After ``--mvcc-warmup`` seconds,
a transaction in each database reads one row of another table at REPEATABLE READ and stays open
for ``--mvcc-minutes``: its snapshot holds that database's xmin horizon, so no dead row version
of the job table can be removed (since PostgreSQL 14 a snapshot holds back only its own
database's horizon for ordinary tables, which is why each database gets its own). Every
``--mvcc-interval`` seconds the benchmark records, per system: claim latency p50/p99 (timed
in the worker around its claim statement, ``bench.mvcc_worker``; sqlqueue's floor probes, which
run beside the claims on a thread of their own, are timed apart: their count and longest),
jobs claimed/s, the backlog,
the job table's and its indexes' sizes, and dead tuples (``pg_stat_user_tables``), and it
runs ``EXPLAIN (ANALYZE, BUFFERS)`` of the claim's SELECT when the transaction opens and
before it ends. Results: a Markdown table, a PNG plot and JSON under ``--mvcc-output``.

Systems: ``sqlqueue``, ``pgqueuer`` and ``raw`` (the raw-SQL ceiling on sqlqueue's schema),
``sqlqueue-nofloor`` (sqlqueue with its claim floor turned off, as before it),
``sqlqueue-noprobe`` (the floor without the worker's floor probe: a claim without the floor
every ``FLOOR_RESET_SECONDS``, as before the probe), and the raw
layouts of ``bench.mvcc_layouts`` as ``raw-<layout>`` (the levers tried).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import processes
from bench.databases import ROOT, fresh_database, postgres_dsn
from bench.mvcc_layouts import FLOOR_SLACK_SECONDS, LAYOUTS, Layout
from bench.names import NOOP
from bench.settings import Settings
from sqlqueue._store.claim_floor import FLOOR_SLACK

__all__ = ["DEFAULT_SYSTEMS", "MvccOptions", "run", "systems_of"]

DEFAULT_SYSTEMS = ("sqlqueue", "pgqueuer", "raw")
_TICK = 0.1
_PGQUEUER_TABLES = ("pgqueuer",)
_OTHER = "mvcc_other"


@dataclass(frozen=True, kw_only=True)
class MvccOptions:
    """What ``--mvcc-*`` asked for."""

    systems: tuple[str, ...] = DEFAULT_SYSTEMS
    rate: int = 250
    minutes: float = 10.0
    warmup_seconds: float = 60.0
    after_seconds: float = 30.0
    interval_seconds: float = 10.0
    output: Path = ROOT / "bench" / "results" / "mvcc"


def systems_of(text: str) -> tuple[str, ...]:
    """``sqlqueue,pgqueuer,raw,raw-floor`` -> the systems, checked."""
    known = {
        *DEFAULT_SYSTEMS,
        "sqlqueue-nofloor",
        "sqlqueue-noprobe",
        *(f"raw-{name}" for name in LAYOUTS),
    }
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    if not names or set(names) - known:
        raise ValueError(f"expected some of {', '.join(sorted(known))}, got {text!r}")
    return names


def _layout(system: str) -> Layout | None:
    if system == "raw":
        return LAYOUTS["today"]
    if system.startswith("raw-"):
        return LAYOUTS[system.removeprefix("raw-")]
    return None


@dataclass(kw_only=True)
class _System:
    """One system under test: its database, worker, enqueuer and what was measured."""

    name: str
    url: str
    timings: Path
    tables: tuple[str, ...]
    enqueued: int = 0
    claimed: int = 0
    read_offset: int = 0
    rows: list[dict[str, Any]] = field(default_factory=list)
    explains: dict[str, str] = field(default_factory=dict)
    monitor: Any = None
    held: Any = None


# -- enqueue side ---------------------------------------------------------------------------------


def _enqueue_loop(system: _System, rate: int, stop: threading.Event) -> None:
    """Enqueue ``rate`` jobs/s in a transaction every ``_TICK`` s until ``stop``."""
    per_tick = max(1, round(rate * _TICK))
    layout = _layout(system.name)
    if system.name.startswith("sqlqueue"):
        import sqlqueue

        queue = sqlqueue.Queue(system.url)

        def one_tick() -> None:
            requests = [sqlqueue.JobRequest(job_type=NOOP, external=True)] * per_tick
            with queue.engine.begin() as conn:
                queue.enqueue_many(conn, requests)

        _paced(one_tick, system, per_tick, stop)
        queue.engine.dispose()
    elif layout is not None:
        import psycopg

        with psycopg.connect(postgres_dsn(system.url), autocommit=True) as conn:
            _paced(lambda: conn.execute(layout.insert, {"jobs": per_tick}), system, per_tick, stop)
    else:
        asyncio.run(_pgqueuer_enqueue(system, per_tick, stop))


def _paced(one_tick: Any, system: _System, per_tick: int, stop: threading.Event) -> None:
    next_at = time.monotonic()
    while not stop.is_set():
        one_tick()
        system.enqueued += per_tick
        next_at += _TICK
        pause = next_at - time.monotonic()
        if pause > 0:
            stop.wait(pause)
        else:
            next_at = time.monotonic()  # behind: do not burst to catch up


async def _pgqueuer_enqueue(system: _System, per_tick: int, stop: threading.Event) -> None:
    from pgqueuer.queries import Queries

    from bench.peer_worker import asyncpg_connect

    conn = await asyncpg_connect(postgres_dsn(system.url))
    queries = Queries.from_asyncpg_connection(conn)
    payloads: list[bytes | None] = [b"{}"] * per_tick
    next_at = time.monotonic()
    try:
        while not stop.is_set():
            await queries.enqueue([NOOP] * per_tick, payloads, [0] * per_tick)
            system.enqueued += per_tick
            next_at += _TICK
            pause = next_at - time.monotonic()
            if pause > 0:
                await asyncio.sleep(pause)
            else:
                next_at = time.monotonic()
    finally:
        await conn.close()


# -- the database side ----------------------------------------------------------------------------


@contextmanager
def _database(system: str, settings: Settings) -> Iterator[tuple[str, tuple[str, ...]]]:
    """A fresh database for ``system`` with its schema; yields its URL and its job tables."""
    import psycopg

    with fresh_database("postgresql", settings.target) as url:
        layout = _layout(system)
        with psycopg.connect(postgres_dsn(url), autocommit=True) as conn:
            conn.execute(f"CREATE TABLE {_OTHER} (id integer PRIMARY KEY, note text)")
            conn.execute(f"INSERT INTO {_OTHER} VALUES (1, 'a row the long transaction reads')")
            for statement in layout.setup if layout else ():
                conn.execute(statement)
        if system == "pgqueuer":
            asyncio.run(_pgqueuer_install(url))
            yield url, _PGQUEUER_TABLES
        else:
            yield url, layout.tables if layout else ("sqlqueue_jobs",)


async def _pgqueuer_install(url: str) -> None:
    from pgqueuer.queries import Queries

    from bench.peer_worker import asyncpg_connect

    conn = await asyncpg_connect(postgres_dsn(url))
    try:
        await Queries.from_asyncpg_connection(conn).install()
    finally:
        await conn.close()


def _sample(system: _System) -> dict[str, Any]:
    """Sizes (bytes) and dead tuples of the system's claim table (and any other job tables)."""
    table_bytes = index_bytes = dead = 0
    for table in system.tables:
        row = system.monitor.execute(
            "SELECT pg_relation_size(c.oid), pg_indexes_size(c.oid), "
            "       coalesce(s.n_dead_tup, 0) "
            "  FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid "
            " WHERE c.oid = %s::regclass",
            (table,),
        ).fetchone()
        table_bytes += row[0]
        index_bytes += row[1]
        dead += row[2]
    return {"table_bytes": table_bytes, "index_bytes": index_bytes, "dead_tuples": dead}


def _explain(system: _System, *, floor: bool = False) -> str | None:
    """``EXPLAIN (ANALYZE, BUFFERS)`` of the claim (its effects rolled back), or None: for
    sqlqueue its own statement, for raw layouts their SELECT. ``floor``: with a floor at the
    newest job less the slack, as a worker that keeps up has it."""
    if system.name.startswith("sqlqueue"):
        return _explain_sqlqueue(system, floor=floor)
    layout = _layout(system.name)
    if layout is None or (floor and not layout.floor_condition):
        return None
    condition = layout.floor_condition if floor else ""
    sql = (
        f"EXPLAIN (ANALYZE, BUFFERS) SELECT id FROM {layout.table} "
        "WHERE status IN ('queued', 'failed') AND queue = 'default' "
        f"AND next_run_at <= statement_timestamp() {condition} "
        "ORDER BY priority, next_run_at, id LIMIT 10 FOR UPDATE SKIP LOCKED"
    )
    conn = system.monitor
    with conn.transaction(force_rollback=True):
        newest = conn.execute(f"SELECT max(next_run_at) FROM {layout.table}").fetchone()[0]
        params = {"priority": 0, "next_run_at": newest, "slack": FLOOR_SLACK_SECONDS}
        rows = conn.execute(sql, params if floor else None).fetchall()
    return "\n".join(row[0] for row in rows)


def _explain_sqlqueue(system: _System, *, floor: bool) -> str | None:
    """sqlqueue's claim statement as its PostgreSQL dialect builds it, leasing up to 10 jobs."""
    from sqlalchemy.dialects.postgresql import psycopg as pg_psycopg

    from sqlqueue.dialects.postgresql import PostgresDialect

    if floor and system.name != "sqlqueue":
        return None
    statement = PostgresDialect().claim_statement(
        queues=["default"], job_types=None, lease_seconds=30, now=None, floor=floor
    )
    compiled = statement.compile(dialect=pg_psycopg.dialect())  # type: ignore[no-untyped-call]
    conn = system.monitor
    with conn.transaction(force_rollback=True):
        newest = conn.execute("SELECT max(next_run_at) FROM sqlqueue_jobs").fetchone()[0]
        params = {
            **compiled.params,
            "claim_limit": 10,
            "worker_id": "explain",
            "lease_seconds": 30.0,
            "floor_priority": 0,
            "floor_due": None if newest is None else newest - FLOOR_SLACK,
        }
        rows = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS) {compiled}", params).fetchall()
    return "\n".join(row[0] for row in rows)


def _read_timings(system: _System) -> tuple[list[float], int, list[float]]:
    """The claims' latencies and jobs, and the probes' durations, since the last read."""
    with system.timings.open("r", encoding="utf-8") as source:
        source.seek(system.read_offset)
        text = source.read()
    complete = text[: text.rfind("\n") + 1]
    system.read_offset += len(complete.encode("utf-8"))
    latencies, jobs, probes = [], 0, []
    for line in complete.splitlines():
        _, ms, n, what = [*line.split(), "claim"][:4]
        if what == "probe":
            probes.append(float(ms))
            continue
        latencies.append(float(ms))
        jobs += int(n)
    return latencies, jobs, probes


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q) - 1]


# -- the run --------------------------------------------------------------------------------------


def _worker_command(system: str, timings: Path) -> list[str]:
    layout = _layout(system)
    kind = "raw" if layout is not None else system
    command = [sys.executable, "-m", "bench.mvcc_worker", kind, "--timings", str(timings)]
    return command + (["--layout", layout.name] if layout is not None else [])


def run(settings: Settings, options: MvccOptions) -> dict[str, Any]:
    """Measure every system of ``options`` side by side; return what was recorded."""
    import psycopg

    load_at_start = [round(v, 2) for v in os.getloadavg()]
    stop = threading.Event()
    with ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sqlqueue-mvcc-")))
        systems: list[_System] = []
        for name in options.systems:
            url, tables = stack.enter_context(_database(name, settings))
            timings = scratch / f"{name}.timings"
            timings.touch()
            system = _System(name=name, url=url, timings=timings, tables=tables)
            system.monitor = psycopg.connect(postgres_dsn(url), autocommit=True)
            stack.callback(system.monitor.close)
            systems.append(system)
        workers = [
            processes.start(
                _worker_command(s.name, s.timings),
                engine="sqlqueue" if s.name.startswith("sqlqueue") else "raw",
                name=f"mvcc-{s.name}",
                url=s.url,
                logs=scratch,
                record=None,
            )
            for s in systems
        ]
        stack.callback(processes.stop_all, workers)
        processes.wait_ready(workers, 120.0)
        threads = [
            threading.Thread(target=_enqueue_loop, args=(s, options.rate, stop), daemon=True)
            for s in systems
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            stack.callback(thread.join, 30)
        stack.callback(stop.set)

        started = time.monotonic()
        hold_at = options.warmup_seconds
        release_at = hold_at + options.minutes * 60.0
        end_at = release_at + options.after_seconds
        phase = "before"
        next_sample = options.interval_seconds
        last = time.monotonic()
        while True:
            now = time.monotonic() - started
            if phase == "before" and now >= hold_at:
                for s in systems:
                    s.explains["at_hold"] = _explain(s) or ""
                    s.explains["at_hold_with_floor"] = _explain(s, floor=True) or ""
                    s.held = psycopg.connect(postgres_dsn(s.url))
                    s.held.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                    s.held.execute(f"SELECT note FROM {_OTHER} WHERE id = 1").fetchone()
                phase = "held"
            if (
                phase == "held"
                and now >= release_at - options.interval_seconds / 2
                and ("before_release" not in systems[0].explains)
            ):
                for s in systems:
                    s.explains["before_release"] = _explain(s) or ""
                    s.explains["before_release_with_floor"] = _explain(s, floor=True) or ""
            if phase == "held" and now >= release_at:
                for s in systems:
                    s.held.rollback()
                    s.held.close()
                phase = "after"
            if now >= next_sample:
                elapsed = time.monotonic() - last
                last = time.monotonic()
                for s in systems:
                    latencies, jobs, probes = _read_timings(s)
                    s.claimed += jobs
                    s.rows.append(
                        {
                            "t": round(next_sample),
                            "phase": phase,
                            "enqueued": s.enqueued,
                            "claimed_per_s": jobs / elapsed,
                            "backlog": s.enqueued - s.claimed,
                            "claims": len(latencies),
                            "p50_ms": _percentile(latencies, 50),
                            "p99_ms": _percentile(latencies, 99),
                            "max_ms": max(latencies, default=None),
                            "probes": len(probes),
                            "probe_max_ms": max(probes, default=None),
                            **_sample(s),
                        }
                    )
                _progress(systems, phase)
                next_sample += options.interval_seconds
                for worker in workers:
                    worker.check_alive()
            if now >= end_at:
                break
            time.sleep(0.2)
    return {
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(options).items()},
        "load_average_at_start": load_at_start,
        "load_average_at_end": [round(v, 2) for v in os.getloadavg()],
        "systems": {s.name: {"rows": s.rows, "explains": s.explains} for s in systems},
    }


def _progress(systems: list[_System], phase: str) -> None:
    parts = []
    for s in systems:
        row = s.rows[-1]
        p99 = row["p99_ms"]
        parts.append(
            f"{s.name}: {row['claimed_per_s']:.0f}/s p99 "
            f"{'-' if p99 is None else f'{p99:.1f}'} ms backlog {row['backlog']}"
        )
    print(f"[{systems[0].rows[-1]['t']:>4} s {phase:>6}] " + "; ".join(parts), flush=True)


def save(found: dict[str, Any], output: Path) -> None:
    """Write ``output``.json and .md (table, ratios, EXPLAIN) and .png (the curves)."""
    from bench import mvcc_report

    output.parent.mkdir(parents=True, exist_ok=True)
    output.with_suffix(".json").write_text(json.dumps(found, indent=1, default=str) + "\n")
    output.with_suffix(".md").write_text(mvcc_report.markdown(found), encoding="utf-8")
    mvcc_report.plot(found, output.with_suffix(".png"))
