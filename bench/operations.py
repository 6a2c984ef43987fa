"""``python -m bench.operations``: the operators' queries on a big table, and what a first prune
or a mass requeue costs the workers.

Fills a fresh database with ``--rows`` finished jobs (succeeded and cancelled, plus 10,000 dead
with a handful of distinct errors) and 10,000 queued due jobs, as a busy year would leave them,
vacuumed and analyzed as autovacuum would. Then, per backend:

- ``stats()`` before the finished counts were ever folded, the first fold (a worker folds
  every minute), then ``stats()``, ``health()``, ``activity()`` and filtered ``jobs()`` pages,
  and the web page's overview, filtered list and third page (``sqlqueue.web`` in Starlette's
  test client: the queries plus rendering): median and max of 7 calls, in ms;
- on PostgreSQL, the plan (``EXPLAIN ANALYZE``) of every statement those calls ran;
- ``requeue_where`` over the 10,000 dead jobs: total, batches, and the longest batch (the
  longest any row stays locked);
- the first ``prune`` of the finished history, while another process claims and releases jobs
  in a loop: claim latency p50/p99/max before and during the prune.

Figures depend on the machine; compare backends and operations within one run.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

import sqlqueue
from bench.databases import BACKENDS, DEFAULT_POSTGRES_URL, Target, fresh_database
from sqlqueue.web import create_app

with warnings.catch_warnings():  # Starlette would rather have httpx2; httpx still works
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

QUEUED = 10_000
DEAD = 10_000
JOB_TYPES = ("send_email", "deliver_webhook", "build_report", "sync_crm", "resize_image")
QUEUES = ("mail", "webhooks", "reports")
ERRORS = (
    "ConnectionError: 503 Service Unavailable from crm.example.com",
    "TimeoutError: smtp.example.com did not answer in 20 s",
    "PermanentError: 410 Gone from hooks.partner.example",
    "ValueError: report 17 has no rows",
)

# One INSERT … SELECT per kind of row, over a generated series of ``n`` numbers (PostgreSQL
# generate_series; SQLite a recursive CTE). Values are spread over the last year by ``i``.
_PG_SERIES = "SELECT i FROM generate_series(1, :n) AS s(i)"
_SQLITE_SERIES = (
    "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < :n) SELECT i FROM s"
)


def _ago(backend: str, seconds: str) -> str:
    """SQL for the time ``seconds`` (an SQL expression) before now."""
    if backend == "postgresql":
        return f"now() - ({seconds}) * interval '1 second'"
    return f"strftime('%Y-%m-%d %H:%M:%f', 'now', '-' || ({seconds}) || ' seconds')"


def _pick(values: tuple[str, ...]) -> str:
    """SQL choosing one of ``values`` by the series number ``i`` (constants, safe to inline)."""
    whens = " ".join(f"WHEN {k} THEN '{value}'" for k, value in enumerate(values))
    return f"CASE i % {len(values)} {whens} END"


def _fill_sql(backend: str, kind: str) -> str:
    """The INSERT … SELECT of ``:n`` rows of ``kind`` on ``backend``: ``history`` (finished
    over the last year, every ``:every``-th one dead with one of a few errors, so dead jobs are
    spread among the others as they would be) or ``queued`` (due within the last minute)."""
    json = "::jsonb" if backend == "postgresql" else ""
    if kind == "history":
        dead = "(i % :every = 0 AND i <= :last_dead)"
        status = (
            f"CASE WHEN {dead} THEN 'dead' WHEN i % 50 = 1 THEN 'cancelled' ELSE 'succeeded' END"
        )
        error = f"CASE WHEN {dead} THEN {_pick(ERRORS)} END"
        attempts = f"CASE WHEN {dead} THEN 8 ELSE 1 END"
        when = _ago(backend, "31536000.0 * (:n - i) / :n")
        finished = when
    else:
        status, error, attempts = "'queued'", "NULL", "0"
        when, finished = _ago(backend, "60.0 * (:n - i) / :n"), "NULL"
    series = _PG_SERIES if backend == "postgresql" else _SQLITE_SERIES
    return f"""
        INSERT INTO sqlqueue_jobs (job_type, queue, priority, payload, status, attempts,
            max_attempts, next_run_at, last_error, errors, started_at, finished_at, created_at,
            updated_at)
        SELECT {_pick(JOB_TYPES)}, {_pick(QUEUES)}, 0, '{{"id": 1}}'{json}, {status},
            {attempts}, 8, {when}, {error}, '[]'{json}, {finished}, {finished}, {when}, {when}
        FROM ({series}) AS series
    """


@dataclass(frozen=True)
class Sizes:
    """How many finished (of which dead) and queued jobs a measurement starts with."""

    finished: int
    dead: int
    queued: int


def fill(engine: sa.Engine, backend: str, sizes: Sizes) -> float:
    """Write the history and the backlog; return the seconds it took (vacuum included)."""
    started = time.perf_counter()
    with engine.begin() as conn:
        history = sizes.finished + sizes.dead
        every = history // max(sizes.dead, 1) if sizes.dead else history + 1
        conn.execute(
            sa.text(_fill_sql(backend, "history")),
            {"n": history, "every": every, "last_dead": every * sizes.dead},
        )
        conn.execute(sa.text(_fill_sql(backend, "queued")), {"n": sizes.queued})
    if backend == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM ANALYZE sqlqueue_jobs")
    else:
        with engine.connect() as conn:
            conn.exec_driver_sql("ANALYZE")
    return time.perf_counter() - started


@contextmanager
def captured(engine: sa.Engine) -> Iterator[list[tuple[str, Any]]]:
    """Every statement (and its parameters) the engine runs inside the block."""
    seen: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        seen.append((statement, parameters))

    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)


def timed(call: Callable[[], object], runs: int = 7) -> tuple[float, float]:
    """Median and max milliseconds of ``runs`` calls (after one warm-up)."""
    call()
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples), max(samples)


def explain(engine: sa.Engine, call: Callable[[], object]) -> list[str]:
    """PostgreSQL's EXPLAIN ANALYZE of each statement ``call`` runs."""
    with captured(engine) as statements:
        call()
    plans = []
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        for statement, parameters in statements:
            if not statement.lstrip().upper().startswith("SELECT"):
                continue
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + statement, parameters)
            plan = "\n".join(row[0] for row in cursor.fetchall())
            plans.append(f"{' '.join(statement.split())[:160]}…\n{plan}")
        raw.rollback()
    finally:
        raw.close()
    return plans


def _claim_until(url: str, ready: Any, stop: Any, results: Any) -> None:
    """Claim up to 10 jobs, hold them 10 ms and give them back, again and again until ``stop``;
    report each claim's milliseconds (what another worker sees meanwhile)."""
    queue = sqlqueue.Queue(url)
    latencies = []
    while not stop.is_set():
        started = time.perf_counter()
        claimed = queue.store.claim(
            queues=QUEUES, job_types=None, limit=10, worker_id="bench", lease_seconds=30
        )
        latencies.append((time.perf_counter() - started) * 1000)
        ready.set()
        time.sleep(0.01)  # the jobs "run": a worker is not in a write transaction all the time
        queue.store.release(worker_id="bench", fences=[job.fence for job in claimed])
    results.put(latencies)


def _percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return (
        f"p50 {at(0.5):.1f} ms, p99 {at(0.99):.1f} ms, max {ordered[-1]:.1f} ms "
        f"({len(ordered):,} claims)"
    )


def claims_while(url: str, action: Callable[[], object]) -> tuple[str, float]:
    """Claim latency in another process while ``action`` runs; and the action's seconds."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    ready, stop = context.Event(), context.Event()
    process = context.Process(target=_claim_until, args=(url, ready, stop, results))
    process.start()
    if not ready.wait(60):
        raise SystemExit("the claiming process did not start")
    time.sleep(1.0)  # a second of claims before the action, for the "before" figures
    started = time.perf_counter()
    action()
    took = time.perf_counter() - started
    stop.set()
    latencies = results.get(timeout=120)
    process.join(30)
    return _percentiles(latencies), took


def web_pages(queue: sqlqueue.Queue) -> dict[str, Callable[[], object]]:
    """GETs of the web page (queries and rendering), each checked to answer 200."""
    client = TestClient(create_app(queue), base_url="http://localhost")  # a host it answers

    def get(path: str) -> Callable[[], object]:
        def call() -> object:
            answer = client.get(path)
            assert answer.status_code == 200, answer.text[:500]
            return answer

        return call

    third = queue.jobs(status="succeeded", limit=100)[-1].id
    return {
        "web GET / (overview: health, activity, rendering)": get("/"),
        "web GET /jobs?status=dead&type=…&error=crm": get(
            "/jobs?status=dead&type=deliver_webhook&error=crm"
        ),
        "web GET /jobs?status=succeeded, 3rd page": get(
            f"/jobs?status=succeeded&before_id={third}"
        ),
    }


def measure(backend: str, target: Target, sizes: Sizes, show_plans: bool) -> None:
    with fresh_database(backend, target) as url:
        queue = sqlqueue.Queue(url)
        engine = queue.engine
        took = fill(engine, backend, sizes)
        rows = sizes.finished
        print(
            f"\n== {backend}: {rows:,} finished + {sizes.dead:,} dead + {sizes.queued:,} queued "
            f"(filled and analyzed in {took:.0f} s)"
        )
        calls: dict[str, Callable[[], object]] = {
            "stats()": queue.stats,
            "health()": queue.health,
            "jobs(status='dead', job_type=…, error_contains='crm')": lambda: queue.jobs(
                status="dead", job_type="deliver_webhook", error_contains="crm"
            ),
            "jobs(job_type='build_report')": lambda: queue.jobs(job_type="build_report"),
            "jobs(status='queued', queue='mail')": lambda: queue.jobs(
                status="queued", queue="mail"
            ),
            "jobs(status='succeeded'), 3rd page": lambda: queue.jobs(
                status="succeeded", before_id=queue.jobs(status="succeeded", limit=100)[-1].id
            ),
            "activity() (the last hour per minute)": queue.activity,
            **web_pages(queue),
        }
        median, worst = timed(queue.stats, runs=3)
        print(
            f"{'stats(), no fold yet (all finished jobs counted live)':58} median "
            f"{median:7.1f} ms   max {worst:7.1f} ms"
        )
        started = time.perf_counter()
        folded = queue.admin.fold_all_counts()  # what a worker does (at start, then each minute)
        print(
            f"{'first fold of the finished counts (once, in day windows)':58} {folded:,} jobs in "
            f"{(time.perf_counter() - started) * 1000:.0f} ms"
        )
        for name, call in calls.items():
            median, worst = timed(call)
            print(f"{name:58} median {median:7.1f} ms   max {worst:7.1f} ms")
        if show_plans and backend == "postgresql":
            for name in ("stats()", "jobs(status='dead', job_type=…, error_contains='crm')"):
                print(f"\n-- plans of {name}")
                for plan in explain(engine, calls[name]):
                    print(plan, end="\n\n")

        batches: list[float] = []
        started = time.perf_counter()
        total = 0
        while True:
            batch_started = time.perf_counter()
            done = queue.requeue_where(by="bench", reason="bench", limit=500, batch_size=500)
            batches.append((time.perf_counter() - batch_started) * 1000)
            total += len(done)
            if len(done) < 500:
                break
        print(
            f"\nrequeue_where over {sizes.dead:,} dead jobs: {total:,} requeued in "
            f"{time.perf_counter() - started:.2f} s, {len(batches)} batches of 500, "
            f"longest batch {max(batches):.0f} ms"
        )

        before, _ = claims_while(url, lambda: time.sleep(3.0))
        during, prune_took = claims_while(
            url, lambda: queue.prune(older_than=0, statuses=("succeeded", "cancelled"))
        )
        print(f"claim latency, idle table:        {before}")
        print(f"claim latency, during the prune:  {during}")
        print(f"first prune of {rows:,} finished jobs took {prune_took:.1f} s (batches of 1,000)")
        engine.dispose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.operations", description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000, help="finished jobs (1,000,000)")
    parser.add_argument("--dead", type=int, default=DEAD, help=f"dead jobs among them ({DEAD:,})")
    parser.add_argument("--queued", type=int, default=QUEUED, help=f"queued due jobs ({QUEUED:,})")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES_URL)
    parser.add_argument("--plans", action="store_true", help="print PostgreSQL's query plans")
    args = parser.parse_args(argv)
    target = Target(postgres_url=args.postgres_url)
    for backend in args.backends.split(","):
        measure(backend.strip(), target, Sizes(args.rows, args.dead, args.queued), args.plans)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
