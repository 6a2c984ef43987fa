"""Pickup latency: from an enqueue's COMMIT to its handler starting, in an idle worker.

One worker process starts on a fresh database; one warm-up job goes through it and the worker
is left idle. Then this process enqueues ``pickup_jobs`` jobs, one per transaction, on a fixed
schedule ``pickup_gap_seconds`` apart. For each job the enqueuer notes ``time.time()`` right
after its COMMIT returns; the handler notes ``time.time()`` as it starts and appends it to a
file. Both are processes on this machine reading the same wall clock, so their difference is
the pickup latency.

sqlqueue: ``queue.enqueue`` into ``python -m sqlqueue worker`` (its ``stamp`` task). Raw: a
raw INSERT + COMMIT into ``bench.raw_worker``, a polling loop at the same poll interval whose
"handler start" is the moment its claim returns.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import sqlqueue
from bench import processes
from bench.databases import fresh_database
from bench.names import STAMP
from bench.raw_sql import connect
from bench.settings import Settings

__all__ = ["PERCENTILES", "SETTLE_SECONDS", "measure", "percentiles", "wait_for"]

PERCENTILES = (50, 95, 99)
#: After the warm-up job, how long to let the worker settle into its idle poll loop.
SETTLE_SECONDS = 0.3


def percentiles(latencies: Sequence[float]) -> dict[int, float]:
    """p50, p95 and p99 of ``latencies`` (inclusive method: within the observed range)."""
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    return {p: cuts[p - 1] for p in PERCENTILES}


def _starts(record: Path) -> dict[int, float]:
    starts: dict[int, float] = {}
    for line in record.read_text(encoding="utf-8").splitlines():
        seq, _, started = line.partition(" ")
        if started:
            starts.setdefault(int(seq), float(started))
    return starts


def wait_for(
    record: Path, seqs: set[int], worker: processes.Worker, timeout: float
) -> dict[int, float]:
    deadline = time.monotonic() + timeout
    while True:
        starts = _starts(record)
        if seqs <= starts.keys():
            return starts
        worker.check_alive()
        if time.monotonic() > deadline:
            missing = sorted(seqs - starts.keys())
            raise SystemExit(
                f"{len(missing)} pickup job(s) never started within {timeout:g} s "
                f"(first: {missing[:5]}):\n{worker.log_text()[-3000:]}"
            )
        time.sleep(0.02)


def _enqueuer(engine: str, url: str) -> tuple[Callable[[int], None], Callable[[], None]]:
    """``(enqueue(seq), close())`` for ``engine``: one job per committed transaction."""
    if engine == "sqlqueue":
        queue = sqlqueue.Queue(url)

        def enqueue(seq: int) -> None:
            with queue.engine.begin() as conn:
                queue.enqueue(conn, STAMP, {"seq": seq}, external=True)

        return enqueue, queue.engine.dispose
    raw = connect(url)

    def enqueue_raw(seq: int) -> None:
        raw.enqueue_one(STAMP, {"seq": seq})

    return enqueue_raw, raw.close


def measure(*, backend: str, engine: str, settings: Settings) -> list[float]:
    """Latencies in milliseconds of ``settings.pickup_jobs`` jobs, in enqueue order."""
    with (
        fresh_database(backend, settings.target) as url,
        tempfile.TemporaryDirectory(prefix="sqlqueue-bench-pickup-") as scratch,
    ):
        record = Path(scratch) / "starts.txt"
        record.touch()
        if engine == "sqlqueue":
            command = processes.sqlqueue_command(
                concurrency=settings.pickup_concurrency,
                poll_interval=settings.poll_interval,
                burst=False,
            )
        else:
            command = processes.raw_command(
                batch=settings.pickup_concurrency,
                poll_interval=settings.poll_interval,
                burst=False,
                record=record,
            )
        worker = processes.start(
            command,
            engine=engine,
            name=f"{engine}-pickup",
            url=url,
            logs=Path(scratch),
            record=record,
        )
        enqueue, close = _enqueuer(engine, url)
        committed: dict[int, float] = {}
        try:
            processes.wait_ready([worker], 60.0)
            enqueue(-1)  # warm-up: connections, statement caches, handler threads
            wait_for(record, {-1}, worker, 30.0 + settings.poll_interval)
            time.sleep(SETTLE_SECONDS)
            origin = time.perf_counter()
            for seq in range(settings.pickup_jobs):
                pause = origin + seq * settings.pickup_gap_seconds - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
                enqueue(seq)
                committed[seq] = time.time()
            starts = wait_for(record, set(committed), worker, 30.0 + 2 * settings.poll_interval)
        finally:
            processes.stop_all([worker])
            close()
    return [(starts[seq] - committed[seq]) * 1000.0 for seq in sorted(committed)]
