"""Worker memory over a long drain: does RSS stay flat while a worker drains N jobs?

One sqlqueue worker process (concurrency 10) starts on a fresh, empty database and handles a
warm-up job; its RSS then is "before". This process enqueues N no-op jobs with
``enqueue_many`` in commits of 10,000 (the worker drains while they arrive) and samples the
worker's RSS from ``/proc/<pid>/statm`` every second until every job has succeeded; "end" is
the RSS once the worker is idle again. Issue 7 asks for N = 1,000,000.
"""

from __future__ import annotations

import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import sqlqueue
from bench import processes
from bench.databases import fresh_database
from bench.names import NOOP
from bench.settings import Settings

__all__ = ["Memory", "describe", "measure"]

_CHUNK = 10_000
_CONCURRENCY = 10
_MB = 1024 * 1024


@dataclass(kw_only=True)
class Memory:
    """RSS samples of one worker draining ``jobs`` jobs on ``backend``."""

    backend: str
    jobs: int
    before_bytes: int = 0
    end_bytes: int = 0
    seconds: float = 0.0
    #: (seconds since the first enqueue, RSS bytes), one a second.
    samples: list[tuple[float, int]] = field(default_factory=list)

    @property
    def peak_bytes(self) -> int:
        return max([self.before_bytes, self.end_bytes, *(rss for _, rss in self.samples)])

    def as_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "jobs": self.jobs,
            "concurrency": _CONCURRENCY,
            "rss_before_bytes": self.before_bytes,
            "rss_peak_bytes": self.peak_bytes,
            "rss_end_bytes": self.end_bytes,
            "seconds": self.seconds,
            "samples": [{"t": t, "rss_bytes": rss} for t, rss in self.samples],
        }


def _unfinished(engine: sa.Engine) -> bool:
    """Whether any job is still queued, failed (to retry) or running: cheap partial indexes."""
    query = sa.text(
        "SELECT 1 FROM sqlqueue_jobs WHERE status IN ('queued', 'failed', 'running') LIMIT 1"
    )
    with engine.connect() as conn:
        return conn.execute(query).first() is not None


def _enqueue_all(queue: sqlqueue.Queue, jobs: int, failure: list[BaseException]) -> None:
    try:
        for start in range(0, jobs, _CHUNK):
            with queue.engine.begin() as conn:
                queue.enqueue_many(
                    conn,
                    [
                        sqlqueue.JobRequest(job_type=NOOP, payload={"n": n}, external=True)
                        for n in range(start, min(start + _CHUNK, jobs))
                    ],
                )
    except BaseException as error:  # reported by the sampling loop
        failure.append(error)


def measure(*, backend: str, jobs: int, settings: Settings) -> Memory:
    """Drain ``jobs`` jobs through one worker, sampling its RSS every second."""
    result = Memory(backend=backend, jobs=jobs)
    timeout = max(settings.timeout, jobs / 200)  # --timeout, or 200 jobs/s at the least
    with (
        fresh_database(backend, settings.target) as url,
        tempfile.TemporaryDirectory(prefix="sqlqueue-bench-memory-") as logs,
    ):
        command = processes.sqlqueue_command(
            concurrency=_CONCURRENCY, poll_interval=settings.poll_interval, burst=False
        )
        worker = processes.start(
            command,
            engine="sqlqueue",
            name="sqlqueue-memory",
            url=url,
            logs=Path(logs),
            record=None,
        )
        queue = sqlqueue.Queue(url)
        try:
            processes.wait_ready([worker], 60.0)
            queue.enqueue(queue.engine, NOOP, {}, external=True)  # warm-up
            while _unfinished(queue.engine):
                worker.check_alive()
                time.sleep(0.1)
            time.sleep(1.0)
            result.before_bytes = processes.rss_bytes(worker.pid)
            failure: list[BaseException] = []
            enqueuer = threading.Thread(
                target=_enqueue_all, args=(queue, jobs, failure), daemon=True
            )
            started = time.monotonic()
            enqueuer.start()
            while True:
                time.sleep(1.0)
                worker.check_alive()
                elapsed = time.monotonic() - started
                result.samples.append((elapsed, processes.rss_bytes(worker.pid)))
                if failure:
                    raise SystemExit(f"enqueueing failed: {failure[0]!r}")
                if elapsed > timeout:
                    raise SystemExit(f"the memory drain ran past {timeout:g} s")
                if not enqueuer.is_alive() and not _unfinished(queue.engine):
                    break
            result.seconds = time.monotonic() - started
            time.sleep(1.0)
            result.end_bytes = processes.rss_bytes(worker.pid)
        finally:
            processes.stop_all([worker])
            queue.engine.dispose()
    return result


def describe(memory: Memory) -> str:
    """A few lines: before/peak/end and RSS at ten points through the drain."""
    samples = memory.samples
    points = [samples[round(i * (len(samples) - 1) / 9)] for i in range(10)] if samples else []
    series = " ".join(f"{rss / _MB:.0f}" for _, rss in points)
    rate = memory.jobs / memory.seconds if memory.seconds else 0.0
    return (
        f"{memory.backend}: {memory.jobs:,} jobs, 1 worker process x concurrency {_CONCURRENCY}, "
        f"drained in {memory.seconds:,.0f} s ({rate:,.0f} jobs/s while enqueueing)\n"
        f"  RSS before {memory.before_bytes / _MB:.1f} MB (idle, after a warm-up job), "
        f"peak {memory.peak_bytes / _MB:.1f} MB, end {memory.end_bytes / _MB:.1f} MB "
        f"(idle after the drain): {memory.end_bytes / memory.before_bytes - 1:+.1%}\n"
        f"  RSS through the drain (MB, 10 points): {series}"
    )
