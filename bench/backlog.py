"""``python -m bench --only backlog``: a worker's claim behind due jobs of types it does not know.

With ``unknown_jobs="skip"`` (the default) a worker claims only the types it has handlers
for; jobs of other types stay queued for the workers that know them. When none does (a type
whose handler was removed, a typo in a producer, a group of workers still being deployed),
those jobs pile up at the head of the claim index, and every claim walks past them.

Per backend, in one fresh database and one process, timed around ``Store.claim`` as a
worker calls it (limit 10, the worker's claim floors, no probe thread). Queue ``backlog``
holds ``--backlog-jobs`` (20,000) due jobs of an unknown type; queue ``clean`` holds none.
The claims of the two queues alternate (clean, backlog, clean, …), so a busy machine slows
both alike:

1. **idle**: neither queue has a job the worker knows (the claims find nothing);
2. **work**: one job the worker knows is enqueued into each queue before its claim, which
   claims it.

Reported per case: each queue's median and p99 per claim, and the median of the per-pair
ratios backlog/clean (issue 43 asks for at most 2x).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import sqlalchemy as sa

import sqlqueue
from bench.databases import fresh_database
from bench.settings import Settings

__all__ = ["Backlog", "Case", "measure", "run"]

_KNOWN = "bench.backlog.known"
_UNKNOWN = "bench.backlog.unknown"
_CLAIMS = 300
_WARM_UP = 20


@dataclass(frozen=True, kw_only=True)
class Case:
    """One case's claims: each queue's durations in seconds, in the order measured."""

    clean: list[float]
    backlog: list[float]

    def line(self, backend: str, case: str) -> str:
        """The case as a line: each queue's median and p99, and the median pair ratio."""
        ratio = statistics.median(b / c for b, c in zip(self.backlog, self.clean, strict=True))
        return (
            f"backlog [{backend}] {case}: clean {_spread(self.clean)}, "
            f"backlog {_spread(self.backlog)}; backlog/clean {ratio:.2f}x"
        )


@dataclass(frozen=True, kw_only=True)
class Backlog:
    """Per case (``idle``, ``work``), the claims of both queues."""

    backend: str
    cases: dict[str, Case]


def run(settings: Settings, *, backlog_jobs: int) -> int:
    """Both cases on every backend of ``settings``; print the figures; 0 when done."""
    for backend in settings.backends:
        result = measure(backend=backend, settings=settings, backlog_jobs=backlog_jobs)
        for name, case in result.cases.items():
            print(case.line(backend, name), flush=True)
    return 0


def measure(*, backend: str, settings: Settings, backlog_jobs: int) -> Backlog:
    """Both cases on ``backend``, in one fresh database."""
    with fresh_database(backend, settings.target) as url:
        queue = sqlqueue.Queue(url)
        queue.task(_KNOWN)(lambda **_: None)
        try:
            with queue.engine.begin() as conn:
                queue.enqueue_many(
                    conn,
                    [
                        sqlqueue.JobRequest(
                            job_type=_UNKNOWN, queue="backlog", payload={"n": n}, external=True
                        )
                        for n in range(backlog_jobs)
                    ],
                )
            _analyze(queue.engine)
            cases = {
                "idle": _alternating(queue, work=False),
                "work": _alternating(queue, work=True),
            }
        finally:
            queue.engine.dispose()
    return Backlog(backend=backend, cases=cases)


def _alternating(queue: sqlqueue.Queue, *, work: bool) -> Case:
    """``_CLAIMS`` claims of each queue, alternating (after a warm-up); with ``work``, one
    known job enqueued into the queue before each of its claims, which must claim it."""
    timings: dict[str, list[float]] = {"clean": [], "backlog": []}
    for n in range(_WARM_UP + _CLAIMS):
        for name in ("clean", "backlog"):
            if work:
                _enqueue_known(queue, name)
            began = time.perf_counter()
            claimed = queue.store.claim(
                queues=[name],
                job_types=[_KNOWN],
                limit=10,
                worker_id="bench-backlog",
                lease_seconds=30,
            )
            elapsed = time.perf_counter() - began
            assert len(claimed) == int(work), (name, len(claimed), work)
            if n >= _WARM_UP:
                timings[name].append(elapsed)
    return Case(clean=timings["clean"], backlog=timings["backlog"])


def _spread(timings: list[float]) -> str:
    ordered = sorted(timings)
    p99 = ordered[int(len(ordered) * 0.99) - 1]
    return f"p50 {statistics.median(ordered) * 1000:.3f} ms p99 {p99 * 1000:.3f} ms"


def _enqueue_known(queue: sqlqueue.Queue, name: str) -> None:
    with queue.engine.begin() as conn:
        queue.enqueue(conn, _KNOWN, {}, queue=name)


def _analyze(engine: sa.Engine) -> None:
    """Fresh statistics after the bulk insert, as autovacuum would give them soon after."""
    statement = {
        "postgresql": "ANALYZE sqlqueue_jobs",
        "mysql": "ANALYZE TABLE sqlqueue_jobs",
        "sqlite": "ANALYZE",
    }[engine.dialect.name]
    with engine.begin() as conn:
        conn.exec_driver_sql(statement)
