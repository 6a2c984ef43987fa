"""``python -m bench.prune_history``: the partitioned history of PostgreSQL — what moving a big
history out of the hot table costs a worker, and how long the first prune of it then takes.

Fills a fresh database as ``bench.prune`` does (``--rows`` finished jobs, 2 % cancelled, and
``--queued`` due jobs), spreads the history over the last ``--days`` days (7, what a week's
retention keeps: seven partitions; ``--days 0`` keeps the fill's year, 366 partitions), folds
the counts, and starts the same worker process
(claim 10, "run" them ``--work-ms``, complete them in the next claim's transaction). Four
phases, each timed and each with the worker's round trips measured during it:

1. ``alone``: nothing else runs, for ``--baseline`` seconds;
2. ``batched``: the same-run baseline, today's batched prune (``Queue.prune``) of the oldest
   day of the history while it is still in the hot table;
3. ``moving``: the retention duty's mover (``Admin.move_to_history``, ``--move-batch`` jobs a
   transaction) moves every succeeded job into the history: its rate in jobs/s;
4. ``dropping``: ``Admin.drop_history_days(older_than=3600)`` drops every day of the history
   that ended more than an hour ago (each detached concurrently, then all dropped in one
   transaction with their counts): the first prune of the history. ``Queue.prune`` then
   deletes what stayed in the hot table (the cancelled jobs) in batches, timed apart.

Figures depend on the machine and its load: compare the phases of one run.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time

import sqlalchemy as sa

import sqlqueue
from bench.databases import DEFAULT_POSTGRES_URL, Target, fresh_database
from bench.operations import Sizes, fill
from bench.prune import _phase, _show, _work

#: The history's finishing times moved into the last ``days`` days (at least two hours ago).
_SQUEEZE = sa.text(
    "UPDATE sqlqueue_jobs SET finished_at = statement_timestamp() - interval '2 hours' "
    "- (id % :days) * interval '1 day' - (id % 3593) * interval '1 second' "
    "WHERE finished_at IS NOT NULL"
)


def _squeeze(engine: sa.Engine, days: int) -> float:
    """Spread the filled history over the last ``days`` days instead of a year (what a
    retention of about that long keeps); return the seconds it took."""
    started = time.perf_counter()
    with engine.begin() as conn:
        conn.execute(_SQUEEZE, {"days": days})
        conn.execute(sa.text("DELETE FROM sqlqueue_count_marks"))
        conn.execute(sa.text("DELETE FROM sqlqueue_finished_counts"))
        conn.execute(sa.text("DELETE FROM sqlqueue_error_counts"))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE sqlqueue_jobs")
    return time.perf_counter() - started


def measure(target: Target, args: argparse.Namespace) -> None:
    """Fill, then run the worker alone, while the mover moves, and while the days drop."""
    with fresh_database("postgresql", target) as url:
        queue = sqlqueue.Queue(url)
        took = fill(queue.engine, "postgresql", Sizes(args.rows, 0, args.queued))
        if args.days:
            took += _squeeze(queue.engine, args.days)
        queue.admin.fold_all_counts()
        spread = f"over {args.days} days" if args.days else "over a year"
        print(
            f"\n== postgresql: {args.rows:,} finished {spread} + {args.queued:,} queued "
            f"(filled in {took:.0f} s)"
        )
        context = multiprocessing.get_context("spawn")
        results = context.Queue()
        ready, stop = context.Event(), context.Event()
        process = context.Process(
            target=_work, args=(url, args.work_ms, ready, stop, results), daemon=True
        )
        process.start()
        try:
            if not ready.wait(60):
                raise SystemExit("the worker process did not start")
            marks = [time.time()]
            time.sleep(args.baseline)
            marks.append(time.time())
            # The same-run baseline: today's batched prune of the oldest day, in the hot table.
            oldest_day = (max(args.days, 2) - 1) * 86400 + 3600
            started = time.perf_counter()
            batched = queue.prune(older_than=oldest_day, statuses=("succeeded",))
            batched_took = time.perf_counter() - started
            marks.append(time.time())
            time.sleep(args.settle)
            marks.append(time.time())
            moved, started = 0, time.perf_counter()
            while count := queue.admin.move_to_history(after=300, keep=None, limit=args.move_batch):
                moved += count
            move_took = time.perf_counter() - started
            marks.append(time.time())
            time.sleep(args.settle)  # the worker alone again, between the two
            marks.append(time.time())
            started = time.perf_counter()
            dropped = queue.admin.drop_history_days(older_than=3600)
            drop_took = time.perf_counter() - started
            marks.append(time.time())
            started = time.perf_counter()
            rest = queue.prune(older_than=3600, statuses=("succeeded", "cancelled"))
            rest_took = time.perf_counter() - started
        finally:
            stop.set()
        trips = results.get(timeout=120)
        process.join(30)
        alone = _phase(trips, marks[0], marks[1])
        pruning = _phase(trips, marks[1], marks[2])
        moving = _phase(trips, marks[3], marks[4])
        dropping = _phase(trips, marks[5], marks[6])
        print(
            f"baseline, batched prune of the oldest day in the hot table: {batched:,} jobs in "
            f"{batched_took:.2f} s ({batched / max(batched_took, 1e-9):,.0f} jobs/s)"
        )
        print(
            f"move: {moved:,} jobs in {move_took:.1f} s ({moved / move_took:,.0f} jobs/s, "
            f"batches of {args.move_batch:,})"
        )
        print(
            f"drop: {dropped:,} jobs of history in {drop_took:.2f} s "
            f"({dropped / max(drop_took, 1e-9):,.0f} jobs/s)"
        )
        print(f"rest of the prune (hot table, batched): {rest:,} jobs in {rest_took:.2f} s")
        print(_show("worker alone", alone))
        print(_show("batched prune", pruning))
        print(_show("during the move", moving))
        print(_show("during the drop", dropping))
        for name, phase in (("batched", pruning), ("move", moving), ("drop", dropping)):
            print(
                f"ratios {name}/alone: p99 {phase['p99'] / max(alone['p99'], 1e-9):.2f}x, "
                f"throughput {phase['jobs_per_s'] / max(alone['jobs_per_s'], 1e-9):.2f}x"
            )
        queue.engine.dispose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.prune_history", description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000, help="finished jobs (1,000,000)")
    parser.add_argument("--queued", type=int, default=300_000, help="due jobs (300,000)")
    parser.add_argument("--baseline", type=float, default=15.0, help="seconds alone (15)")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds between (3)")
    parser.add_argument("--work-ms", type=float, default=10.0, help="ms per claim's jobs (10)")
    parser.add_argument("--move-batch", type=int, default=1000, help="jobs per move (1,000)")
    parser.add_argument(
        "--days",
        type=int,
        default=7,
        help="spread the history over the last DAYS days, one partition each (7; 0: a year)",
    )
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES_URL)
    args = parser.parse_args(argv)
    measure(Target(postgres_url=args.postgres_url), args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
