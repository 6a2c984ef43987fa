"""Idle cost: the CPU an idle worker burns while it waits for jobs.

A sqlqueue worker and the raw polling loop start side by side on a fresh, empty database with
the same poll interval, settle for a second, and are then watched for ``idle_seconds``. Their
CPU time (user + system, every thread) comes from ``/proc/<pid>/stat``; the figure is that
time as a percentage of one core. On PostgreSQL the connections each holds are counted too
(a long-running worker may hold more than a burst-mode one: its wake-up listener's).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench import processes
from bench.databases import fresh_database
from bench.pg_monitor import Monitor
from bench.settings import Settings

__all__ = ["Idle", "measure"]

_SETTLE_SECONDS = 1.0


@dataclass(frozen=True, kw_only=True)
class Idle:
    """Per engine: percent of one core used while idle, and connections held (PostgreSQL)."""

    cpu_percent: dict[str, float]
    connections: dict[str, int]


def measure(*, backend: str, settings: Settings) -> Idle:
    """How much CPU each engine's idle worker used, and how many connections it held."""
    with (
        fresh_database(backend, settings.target) as url,
        tempfile.TemporaryDirectory(prefix="sqlqueue-bench-idle-") as logs,
    ):
        commands = {
            "sqlqueue": processes.sqlqueue_command(
                concurrency=settings.pickup_concurrency,
                poll_interval=settings.poll_interval,
                burst=False,
            ),
            "raw": processes.raw_command(
                batch=settings.pickup_concurrency,
                poll_interval=settings.poll_interval,
                burst=False,
            ),
        }
        workers = [
            processes.start(
                command,
                engine=engine,
                name=f"{engine}-idle",
                url=url,
                logs=Path(logs),
                record=None,
            )
            for engine, command in commands.items()
        ]
        connections: dict[str, int] = {}
        try:
            processes.wait_ready(workers, 60.0)
            time.sleep(_SETTLE_SECONDS)
            if backend == "postgresql":
                monitor = Monitor(url, admin_url=settings.target.postgres_url)
                try:
                    held = monitor.connections()
                finally:
                    monitor.close()
                connections = {w.engine: held.get(w.name, 0) for w in workers}
            before = {w.engine: processes.cpu_seconds(w.pid) for w in workers}
            started = time.monotonic()
            time.sleep(settings.idle_seconds)
            after = {w.engine: processes.cpu_seconds(w.pid) for w in workers}
            elapsed = time.monotonic() - started
            for worker in workers:
                worker.check_alive()
        finally:
            processes.stop_all(workers)
    cpu = {engine: (after[engine] - before[engine]) / elapsed * 100.0 for engine in before}
    return Idle(cpu_percent=cpu, connections=connections)
