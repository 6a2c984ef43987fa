"""``python -m bench.thread_cpu``: where one worker's CPU goes per job, thread by thread.

A drain's worker CPU per job (``python -m bench --only drain``) is one figure for the whole
process; this splits it. On a fresh PostgreSQL (or SQLite) database it enqueues N no-op jobs,
then either

- runs one burst worker **in this process** (``--concurrency`` slots, an async or a sync no-op
  handler) and reads each thread's CPU from ``/proc/self/task`` while it drains: the event
  loop (the main thread) and the worker's database thread, apart; or
- with ``--rounds-only``, calls ``Store.cycle`` in a loop (claim ``--claim`` jobs, complete
  them in the next round): the database thread's work alone, with no event loop, measured
  with ``time.thread_time``.

CPU time is what survives a loaded machine (the wall clock does not): the figures of a run
are per job, in microseconds, with the load average before it.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sqlqueue
from bench.databases import DEFAULT_POSTGRES_URL, Target, fresh_database

__all__ = ["main"]

_TICK = os.sysconf("SC_CLK_TCK")
_SAMPLE_SECONDS = 0.05


def _thread_ticks() -> dict[int, int]:
    """CPU ticks (user + system) of each live thread of this process, by thread id."""
    ticks: dict[int, int] = {}
    for stat in Path("/proc/self/task").glob("*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
            continue
        ticks[int(stat.parent.name)] = int(fields[11]) + int(fields[12])
    return ticks


def _queue(url: str, jobs: int, job_type: str) -> sqlqueue.Queue:
    queue = sqlqueue.Queue(url)

    @queue.task("noop_async")
    async def noop_async(**_payload: object) -> None:
        """Do nothing on the event loop."""

    @queue.task("noop")
    def noop(**_payload: object) -> None:
        """Do nothing on a handler thread."""

    requests = [
        sqlqueue.JobRequest(job_type=job_type, payload={"n": n}, external=True) for n in range(jobs)
    ]
    with queue.engine.begin() as conn:
        queue.enqueue_many(conn, requests)
    return queue


def _worker_threads(queue: sqlqueue.Queue, jobs: int, concurrency: int) -> dict[str, float]:
    """Drain with one in-process burst worker; µs of CPU per job of the process, its event
    loop and its database thread (the sampling thread's own is left out)."""
    first = _thread_ticks()
    last: dict[int, int] = {}
    done = threading.Event()
    sampler_id: list[int] = []

    def sample() -> None:
        sampler_id.append(threading.get_native_id())
        while not done.wait(_SAMPLE_SECONDS):
            for thread, ticks in _thread_ticks().items():
                last[thread] = max(last.get(thread, 0), ticks)

    store = queue.store
    cycle = store.cycle
    rounds = [0]

    def counted(**arguments: Any) -> Any:  # the worker's rounds, to report jobs per round
        rounds[0] += 1
        return cycle(**arguments)

    store.cycle = counted  # type: ignore[method-assign]
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    process = time.process_time()
    queue.worker(concurrency=concurrency).run(burst=True)
    for thread, ticks in _thread_ticks().items():
        last[thread] = max(last.get(thread, 0), ticks)
    done.set()
    sampler.join()
    per_job = {"process": (time.process_time() - process) * 1e6 / jobs}
    busiest = 0.0
    for thread, ticks in last.items():
        spent = (ticks - first.get(thread, 0)) * 1e6 / _TICK / jobs
        if thread in sampler_id:
            per_job["process"] -= spent
        elif thread == os.getpid():
            per_job["event loop"] = spent
        else:
            busiest = max(busiest, spent)  # the worker's database thread
    per_job["database"] = busiest
    # Handler threads and short-lived ones run in bursts shorter than the kernel's tick, so
    # their per-thread counts miss most of it: the process's own clock has it all.
    per_job["rest"] = per_job["process"] - per_job.get("event loop", 0.0) - busiest
    per_job["jobs per round"] = jobs / max(rounds[0], 1)
    return per_job


def _rounds(queue: sqlqueue.Queue, claim: int) -> dict[str, float]:
    """``Store.cycle`` alone: claim ``claim`` jobs, complete them in the next round."""
    store = queue.store
    previous: list[tuple[int, int]] = []
    done = 0
    rounds = 0
    started = time.thread_time()
    while True:
        _, claimed = store.cycle(
            worker_id="bench",
            succeeded=previous,
            failures=[],
            results=None,
            claims=[((queue.default_queue,), claim)],
            job_types=None,
            lease_seconds=30.0,
        )
        rounds += 1
        done += len(previous)
        previous = [job.fence for job in claimed[0]]
        if not previous:
            break
    spent = time.thread_time() - started
    return {"database thread": spent * 1e6 / done, "jobs per round": done / (rounds - 1)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.thread_cpu", description=__doc__)
    parser.add_argument("--backend", default="postgresql", choices=("postgresql", "sqlite"))
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES_URL)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--sync", action="store_true", help="a sync no-op handler")
    parser.add_argument("--rounds-only", action="store_true", help="Store.cycle alone")
    parser.add_argument("--claim", type=int, default=100, help="jobs per claim, --rounds-only")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    with fresh_database(args.backend, Target(postgres_url=args.postgres_url)) as url:
        queue = _queue(url, args.jobs, "noop" if args.sync else "noop_async")
        try:
            if args.rounds_only:
                figures = _rounds(queue, args.claim)
            else:
                figures = _worker_threads(queue, args.jobs, args.concurrency)
        finally:
            queue.engine.dispose()
    shown = ", ".join(
        f"{name} {value:.0f}" if name == "jobs per round" else f"{name} {value:.1f} µs"
        for name, value in figures.items()
    )
    print(f"{args.backend}, {args.jobs:,} jobs, load {load:.2f}: per job {shown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
