"""What an empty middleware costs, counted in machine instructions rather than timed: a burst
worker drains no-op jobs under valgrind's callgrind, which counts every instruction the worker
process executes (Python, SQLAlchemy, the driver, on SQLite the embedded database; every
thread) while the drain runs — not the PostgreSQL server's.

A count does not depend on how fast or busy the machine is, only on what the process did:
steadier than throughput and CPU time per job. It is not exact either: how the worker's
threads interleave decides how many claim and poll rounds a drain makes, so two drains of the
same jobs differ a little; hence several drains per cell and their median.

Callgrind starts with its instrumentation off (``--instr-atstart=no``): the interpreter's
start, the imports, the database and the backlog are not counted. The child process turns it
on just before the burst worker runs and off when it returns (``callgrind_control -i``), so a
count is one drain — the worker's start and stop included. Each cell (backend, sync or async
handler, 0 or 1 empty middleware) drains ``small`` and ``big`` jobs; the difference of the two
cancels the worker's start and stop, leaving the instructions of ``big - small`` jobs. The cost
is the extra instructions per job of the middleware variant over the plain one's, per cell.

Slow — callgrind runs the interpreter some fifty times slower. ``python -m bench --only
middleware --instructions`` or ``python -m bench.middleware_instructions`` (``--small``,
``--big``, ``--repeats``, ``--backends``, ``--handlers``); needs ``valgrind``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlqueue
from bench.databases import DEFAULT_POSTGRES_URL, Target, fresh_database
from bench.middleware import _empty
from bench.names import NOOP

__all__ = ["Counts", "count", "main", "measure", "table"]

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, kw_only=True)
class Counts:
    """Instructions of each drain of one cell (a backend and a handler kind):
    ``{(jobs, middlewares): [instructions of each repeat]}``."""

    backend: str
    handler: str
    small: int
    big: int
    counted: dict[tuple[int, int], list[int]]

    def per_job(self, middlewares: int) -> float:
        """Instructions per job with ``middlewares`` empty middlewares (the worker's start and
        stop cancelled), from the medians of the repeats."""
        big = statistics.median(self.counted[(self.big, middlewares)])
        small = statistics.median(self.counted[(self.small, middlewares)])
        return (big - small) / (self.big - self.small)

    @property
    def cost_percent(self) -> float:
        """The extra instructions per job of one empty middleware, in per cent."""
        return 100.0 * (self.per_job(1) / self.per_job(0) - 1.0)

    @property
    def spread_percent(self) -> float:
        """How much the plain big drains' counts differ from each other, in per cent of their
        median: the noise the cost is to be read against."""
        runs = self.counted[(self.big, 0)]
        return 100.0 * (max(runs) - min(runs)) / statistics.median(runs)


async def _empty_async(job: sqlqueue.Job, call_next: Callable[[], Any]) -> Any:
    return await call_next()


async def _noop_async() -> None:
    return None


def _toggle(state: str) -> None:
    """Turn callgrind's instrumentation of this process ``on`` or ``off``, and wait until it
    took: the request goes through a file callgrind reads while the process runs."""
    subprocess.run(
        ["callgrind_control", "-i", state, str(os.getpid())], check=True, capture_output=True
    )


def _child(url: str, handler: str, jobs: int, middlewares: int) -> None:
    """The drain callgrind counts: ``jobs`` no-op jobs in the database at ``url``, a burst
    worker, counted from its start to its return."""
    queue = sqlqueue.Queue(url)
    if handler == "async":
        queue.task(NOOP)(_noop_async)
        for _ in range(middlewares):
            queue.middleware(_empty_async)
    else:
        queue.task(NOOP)(lambda: None)
        for _ in range(middlewares):
            queue.middleware(_empty)
    with queue.engine.begin() as conn:
        queue.enqueue_many(conn, [sqlqueue.JobRequest(job_type=NOOP) for _ in range(jobs)])
    worker = queue.worker(concurrency=10, poll_interval=0.05)
    _toggle("on")
    worker.run(burst=True)
    _toggle("off")
    left = queue.jobs(status="succeeded", limit=jobs + 1)
    if len(left) != jobs:
        raise RuntimeError(f"the drain finished {len(left)} jobs of {jobs}")
    queue.engine.dispose()


def count(url: str, handler: str, jobs: int, middlewares: int) -> int:
    """The instructions the worker process executes draining ``jobs`` jobs from the (fresh)
    database at ``url`` (``handler``: sync or async; ``middlewares`` empty middlewares),
    counted by callgrind."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise RuntimeError("valgrind is not installed (apt-get install valgrind)")
    with tempfile.TemporaryDirectory() as work:
        out = Path(work) / "callgrind.out"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        command = [
            valgrind,
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={out}",
            sys.executable,
            "-m",
            "bench.middleware_instructions",
            "--child",
            url,
            handler,
            str(jobs),
            str(middlewares),
        ]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"the drain under callgrind failed: {done.stderr[-2000:]}")
        for line in out.read_text().splitlines():
            if line.startswith("totals:"):
                return int(line.split()[1])
    raise RuntimeError("callgrind wrote no instruction count")


def measure(
    *,
    small: int,
    big: int,
    backends: Sequence[str] = ("sqlite",),
    handlers: Sequence[str] = ("sync",),
    repeats: int = 1,
    target: Target | None = None,
    parallel: int = 2,
) -> list[Counts]:
    """Count every drain of each cell, ``repeats`` times, the variants interleaved, ``parallel``
    at a time (counts do not depend on it, only the wait does); a fresh database each."""
    target = target or Target(postgres_url=DEFAULT_POSTGRES_URL)
    cells = [(backend, handler) for backend in backends for handler in handlers]
    runs = [
        (backend, handler, jobs, middlewares)
        for _ in range(repeats)
        for backend, handler in cells
        for jobs in (small, big)
        for middlewares in (0, 1)
    ]

    migrating = threading.Lock()  # alembic's migration context is global to the process

    def one(run: tuple[str, str, int, int]) -> int:
        backend, handler, jobs, middlewares = run
        with ExitStack() as stack:
            with migrating:
                url = stack.enter_context(fresh_database(backend, target))
            found = count(url, handler, jobs, middlewares)
        print(f"  {backend} {handler} {jobs} jobs, {middlewares} mw: {found:,}", flush=True)
        return found

    with ThreadPoolExecutor(parallel) as pool:
        counted_runs = list(zip(runs, pool.map(one, runs), strict=True))
    figures = []
    for backend, handler in cells:
        counted: dict[tuple[int, int], list[int]] = {}
        for (b, h, jobs, middlewares), found in counted_runs:
            if (b, h) == (backend, handler):
                counted.setdefault((jobs, middlewares), []).append(found)
        figures.append(
            Counts(backend=backend, handler=handler, small=small, big=big, counted=counted)
        )
    return figures


def table(figures: Sequence[Counts]) -> str:
    """The counts as text."""
    lines = [
        f"{'backend':<11} {'handler':<7} {'per job, none':>14} {'per job, 1 empty':>17} "
        f"{'cost':>8} {'spread':>7} {'repeats':>7}"
    ]
    for figure in figures:
        lines.append(
            f"{figure.backend:<11} {figure.handler:<7} {figure.per_job(0):>14,.0f} "
            f"{figure.per_job(1):>17,.0f} {figure.cost_percent:>+7.2f}% "
            f"{figure.spread_percent:>6.1f}% {len(figure.counted[(figure.big, 0)]):>7}"
        )
    lines.append(
        f"instructions per job of the worker process (valgrind --tool=callgrind, counted only "
        f"while the burst worker runs; {figures[0].big} - {figures[0].small} jobs, medians of "
        "the repeats); spread: max - min of the plain big drains, in per cent of their median"
        if figures
        else "no cells"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.middleware_instructions``."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.middleware_instructions", description=__doc__
    )
    parser.add_argument("--small", type=int, default=100, help="jobs of the small drain (100)")
    parser.add_argument("--big", type=int, default=400, help="jobs of the big drain (400)")
    parser.add_argument("--repeats", type=int, default=1, help="drains per cell and size (1)")
    parser.add_argument("--backends", default="sqlite", help="sqlite,postgresql (sqlite)")
    parser.add_argument("--handlers", default="sync", help="sync,async (sync)")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        url, handler, jobs, middlewares = args.child
        _child(url, handler, int(jobs), int(middlewares))
        return 0
    if args.big <= args.small:
        parser.error("--big must be larger than --small")
    figures = measure(
        small=args.small,
        big=args.big,
        backends=[name.strip() for name in args.backends.split(",") if name.strip()],
        handlers=[name.strip() for name in args.handlers.split(",") if name.strip()],
        repeats=args.repeats,
    )
    print(table(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
