"""What an empty middleware costs, counted in machine instructions rather than timed: a burst
worker drains no-op jobs from a SQLite file under valgrind's callgrind, which counts every
instruction the process executes (Python, SQLAlchemy, the embedded SQLite, every thread).

A count does not depend on how fast the machine is, only on what the process did: steadier
than throughput and CPU time per job, which swing by tens of per cent between two runs on a
shared machine (a slow drain polls more per job). It is not exact either: how the worker's
threads interleave decides how many claim and poll rounds a drain makes, so two drains of the
same jobs differ by a few per cent — more than one empty middleware costs. Read the cost as
"within that spread" unless it clearly exceeds it, and compare it with the direct figure of
``bench.middleware.call_overhead_us``.

Each variant (no middleware, one that only calls ``call_next()``) drains ``small`` and then
``big`` jobs; the difference between the two drains cancels the start (interpreter, imports,
migration), leaving the instructions of ``big - small`` jobs. The cost is the extra
instructions per job of the middleware variant over the plain one's per job.

Slow — callgrind runs the interpreter some fifty times slower: four drains of a few hundred
jobs take minutes. ``python -m bench --only middleware --instructions`` or
``python -m bench.middleware_instructions`` (``--small``, ``--big``); needs ``valgrind``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import sqlqueue
from bench.middleware import _empty
from bench.names import NOOP

__all__ = ["Counts", "count", "main", "measure", "table"]

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, kw_only=True)
class Counts:
    """Instructions of each drain: ``{(jobs, middlewares): instructions}``."""

    small: int
    big: int
    counted: dict[tuple[int, int], int]

    def per_job(self, middlewares: int) -> float:
        """Instructions per job with ``middlewares`` empty middlewares (start cancelled)."""
        extra = self.counted[(self.big, middlewares)] - self.counted[(self.small, middlewares)]
        return extra / (self.big - self.small)

    @property
    def cost_percent(self) -> float:
        """The extra instructions per job of one empty middleware, in per cent."""
        return 100.0 * (self.per_job(1) / self.per_job(0) - 1.0)


def _child(jobs: int, middlewares: int) -> None:
    """The drain callgrind watches: a fresh SQLite file, ``jobs`` no-op jobs, a burst worker."""
    url = f"sqlite:///{Path(tempfile.mkdtemp()) / 'q.db'}"
    sqlqueue.migrate(url)
    queue = sqlqueue.Queue(url)
    queue.task(NOOP)(lambda: None)
    for _ in range(middlewares):
        queue.middleware(_empty)
    with queue.engine.begin() as conn:
        queue.enqueue_many(conn, [sqlqueue.JobRequest(job_type=NOOP) for _ in range(jobs)])
    queue.worker(concurrency=10, poll_interval=0.05).run(burst=True)
    left = queue.jobs(status="succeeded", limit=jobs + 1)
    if len(left) != jobs:
        raise RuntimeError(f"the drain finished {len(left)} jobs of {jobs}")


def count(jobs: int, middlewares: int) -> int:
    """The instructions a process draining ``jobs`` jobs (``middlewares`` empty middlewares)
    executes, counted by callgrind."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise RuntimeError("valgrind is not installed (apt-get install valgrind)")
    with tempfile.TemporaryDirectory() as work:
        out = Path(work) / "callgrind.out"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        command = [
            valgrind,
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            sys.executable,
            "-m",
            "bench.middleware_instructions",
            "--child",
            str(jobs),
            str(middlewares),
        ]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"the drain under callgrind failed: {done.stderr[-2000:]}")
        for line in out.read_text().splitlines():
            if line.startswith("summary:") or line.startswith("totals:"):
                return int(line.split()[1])
    raise RuntimeError("callgrind wrote no instruction count")


def measure(*, small: int, big: int, parallel: int = 2) -> Counts:
    """Count the four drains (``small`` and ``big`` jobs, with and without the middleware),
    ``parallel`` at a time (counts do not depend on it, only the wait does)."""
    runs = [(jobs, middlewares) for jobs in (small, big) for middlewares in (0, 1)]
    with ThreadPoolExecutor(parallel) as pool:
        counted = dict(zip(runs, pool.map(lambda run: count(*run), runs), strict=True))
    return Counts(small=small, big=big, counted=counted)


def table(counts: Counts) -> str:
    """The counts as text."""
    lines = [f"{'drain':<32} {'instructions':>16}"]
    for (jobs, middlewares), instructions in sorted(counts.counted.items()):
        name = f"{jobs} jobs, {middlewares} empty middleware"
        lines.append(f"{name:<32} {instructions:>16,}")
    lines.append(
        f"per job ({counts.big} - {counts.small} jobs): no middleware "
        f"{counts.per_job(0):,.0f}, one empty middleware {counts.per_job(1):,.0f} "
        f"instructions: cost {counts.cost_percent:+.2f} %"
    )
    lines.append("instructions counted by valgrind --tool=callgrind (SQLite file, in-process)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.middleware_instructions``."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.middleware_instructions", description=__doc__
    )
    parser.add_argument("--small", type=int, default=200, help="jobs of the small drain (200)")
    parser.add_argument("--big", type=int, default=1000, help="jobs of the big drain (1000)")
    parser.add_argument("--child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(*args.child)
        return 0
    if args.big <= args.small:
        parser.error("--big must be larger than --small")
    print(table(measure(small=args.small, big=args.big)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
