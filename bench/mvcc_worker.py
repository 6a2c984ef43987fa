"""A worker for ``python -m bench --only mvcc`` that times each of its claims.

``python -m bench.mvcc_worker sqlqueue --timings PATH`` runs ``sqlqueue worker bench.app:queue``
with the claim statement timed, and its floor probe too (``sqlqueue-nofloor``: with PostgreSQL's
claim floor turned off, every claim from the head of the index, as before it;
``sqlqueue-noprobe``: the floor without the probe, so a claim runs without its floor every
``FLOOR_RESET_SECONDS``, as before the probe); ``pgqueuer`` runs
``bench.peer_worker pgqueuer`` with its ``Queries.dequeue`` timed; ``raw --layout NAME`` claims
and completes with the raw statements of a layout of ``bench.mvcc_layouts``. Each claim appends
``time.time() milliseconds jobs claim`` to ``PATH`` (the wall clock at its end, its duration, the
jobs it returned), and each probe ``… floors probe`` (the floors it lowered), which the
benchmark reads every interval. The URL comes from ``SQLQUEUE_DATABASE_URL``, as for the other
workers.
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from bench.databases import postgres_dsn
from bench.mvcc_layouts import FLOOR_RESET_SECONDS, FLOOR_SLACK_SECONDS, LAYOUTS, Layout
from bench.raw_sql import LEASE_SECONDS
from bench.raw_worker import READY, URL_VARIABLE

__all__ = ["KINDS", "main"]

KINDS = ("sqlqueue", "sqlqueue-nofloor", "sqlqueue-noprobe", "pgqueuer", "raw")


class _Timings:
    """Appends one line per claim; thread-safe (sqlqueue claims on its database thread)."""

    def __init__(self, sink: TextIO) -> None:
        self._sink = sink
        self._lock = threading.Lock()

    def add(self, started: float, jobs: int, what: str = "claim") -> None:
        ended = time.perf_counter()
        line = f"{time.time()!r} {(ended - started) * 1000.0:.3f} {jobs} {what}\n"
        with self._lock:
            self._sink.write(line)
            self._sink.flush()


def _sqlqueue(timings: _Timings, in_flight: int, poll_interval: float, *, kind: str) -> int:
    from sqlqueue._store import claim as claim_module
    from sqlqueue._store import floor_probe
    from sqlqueue._store.claim_floor import ClaimFloors
    from sqlqueue._worker.floor_probe import FloorProbe
    from sqlqueue.cli import main as cli
    from sqlqueue.dialects.postgresql import PostgresDialect

    if kind == "sqlqueue-nofloor":  # the claim before the floor: every claim from the head
        PostgresDialect.supports_claim_floor = False
    if kind == "sqlqueue-noprobe":  # the floor before the probe: claims look themselves

        async def no_probe(self: Any) -> None:
            return None

        def not_probing(self: Any) -> None:
            return None

        FloorProbe.probe_once = no_probe  # type: ignore[method-assign]
        # No probe is counted either, so a claim runs without its floor every
        # FLOOR_RESET_SECONDS, not every twice that.
        ClaimFloors.probe_started = not_probing  # type: ignore[method-assign]
        ClaimFloors.probe_stopped = not_probing  # type: ignore[method-assign]

    original_probe = floor_probe.probe_floors

    @functools.wraps(original_probe)
    def timed_probe(*args: Any, **kwargs: Any) -> int:
        started = time.perf_counter()
        lowered = original_probe(*args, **kwargs)
        timings.add(started, lowered, "probe")
        return lowered

    floor_probe.probe_floors = timed_probe  # the store calls it through the module

    original: Callable[..., list[Any]] = claim_module.claim

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> list[Any]:
        started = time.perf_counter()
        claimed = original(*args, **kwargs)
        timings.add(started, len(claimed))
        return claimed

    claim_module.claim = timed  # the store calls it through the module
    return cli(
        [
            "--log-level",
            "INFO",
            "worker",
            "bench.app:queue",
            "--concurrency",
            str(in_flight),
            "--poll-interval",
            repr(poll_interval),
        ]
    )


def _pgqueuer(timings: _Timings, in_flight: int, poll_interval: float) -> int:
    from pgqueuer.queries import Queries

    from bench import peer_worker

    original = Queries.dequeue

    @functools.wraps(original)
    async def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        jobs = await original(self, *args, **kwargs)
        timings.add(started, len(jobs))
        return jobs

    Queries.dequeue = timed  # type: ignore[method-assign,unused-ignore]
    argv = ["pgqueuer", "--in-flight", str(in_flight), "--poll-interval", repr(poll_interval)]
    return peer_worker.main(argv)


def _raw(timings: _Timings, layout: Layout, in_flight: int, poll_interval: float) -> int:
    """Claim up to ``in_flight`` jobs, complete them, repeat; poll when nothing is due."""
    import psycopg

    url = os.environ[URL_VARIABLE]
    conn = psycopg.connect(postgres_dsn(url), autocommit=True)
    worker = f"raw:{socket.gethostname()}:{os.getpid()}"
    params: dict[str, Any] = {
        "queue": "default",
        "batch": in_flight,
        "worker": worker,
        "lease": LEASE_SECONDS,
        "slack": FLOOR_SLACK_SECONDS,
    }
    floor: tuple[int, Any, int] | None = None
    reset_at = time.monotonic() + FLOOR_RESET_SECONDS
    print(READY, file=sys.stderr, flush=True)
    try:
        while True:
            if layout.floor_claim is not None and floor is not None and time.monotonic() < reset_at:
                sql = layout.floor_claim
                params.update(priority=floor[0], next_run_at=floor[1], id=floor[2])
            else:
                sql = layout.claim
                reset_at = time.monotonic() + FLOOR_RESET_SECONDS
            started = time.perf_counter()
            rows = conn.execute(sql, params).fetchall()
            timings.add(started, len(rows))
            if not rows:
                time.sleep(poll_interval)
                continue
            if layout.floor_claim is not None:
                # The first job of this claim: every claimable job before it was held by
                # another worker, or is one the next unbounded claim will find.
                floor = min((priority, due, job_id) for job_id, _, priority, due in rows)
            conn.execute(
                layout.complete,
                {
                    "ids": [row[0] for row in rows],
                    "attempts": [row[1] for row in rows],
                    "worker": worker,
                },
            )
    finally:
        conn.close()


def _stop(_signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A claim-timing worker for the mvcc bench.")
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("--timings", type=Path, required=True, help="append claim timings here")
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default="today", help="raw only")
    parser.add_argument("--in-flight", type=int, default=10, help="jobs held at once (10)")
    parser.add_argument("--poll-interval", type=float, default=0.1, help="seconds (0.1)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    with args.timings.open("a", encoding="utf-8") as sink:
        timings = _Timings(sink)
        if args.kind.startswith("sqlqueue"):
            return _sqlqueue(timings, args.in_flight, args.poll_interval, kind=args.kind)
        if args.kind == "pgqueuer":
            return _pgqueuer(timings, args.in_flight, args.poll_interval)
        return _raw(timings, LAYOUTS[args.layout], args.in_flight, args.poll_interval)


if __name__ == "__main__":
    raise SystemExit(main())
