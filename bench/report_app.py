"""The application the report benchmark's workers serve: the activity report of
``examples/activity_report.py`` (no cron schedule: the benchmark starts each run) plus a
**single-job version of the same report**, the baseline the chunked one is measured against.

Workers load it with ``python -m sqlqueue worker bench.report_app:queue``; the database comes
from ``SQLQUEUE_DATABASE_URL``, the CSV directory from ``ACTIVITY_REPORTS_DIR``.
"""

from __future__ import annotations

import os
from typing import Any

import sqlqueue
from bench.activity_example import SINGLE, load_example

__all__ = ["example", "queue"]

_url = os.environ.get("SQLQUEUE_DATABASE_URL")
if not _url:
    raise SystemExit("bench.report_app needs SQLQUEUE_DATABASE_URL (the benchmark sets it)")

example = load_example()
queue: sqlqueue.Queue = example.build_queue(_url, schedule=False)


@queue.task(SINGLE, queue=example.REPORTS_QUEUE, priority=example.REPORTS_PRIORITY)
def single(ctx: sqlqueue.JobContext, stream: bool = True) -> dict[str, Any]:
    """The same report as one job: every event read by this job (``PARTITION_ROWS`` at a time,
    or with ``stream=False`` all at once), the totals kept per user, the CSV written from them."""
    with ctx.engine.begin() as conn:  # committed now, so the run shows as processing 0/1
        run_id, _ = example.start_run(conn, ctx.now(), 1)
    with ctx.engine.connect() as reader:
        first, last, until = example.run_bounds(reader, run_id)
        totals = example.aggregate(reader, first, last, until, ctx, stream=stream)
    path = example.report_path(run_id)
    rows = example.write_csv(
        path,
        (
            (user_id, entry.events, entry.purchases, entry.revenue_cents)
            for user_id, entry in sorted(totals.items())
        ),
    )
    counted = sum(entry.events for entry in totals.values())
    with ctx.transaction() as conn:
        example.finish_run(
            conn,
            run_id,
            ctx.now(),
            status="ready",
            rows=rows,
            events=counted,
            path=str(path),
            chunks_done=1,
        )
    return {"run_id": run_id, "rows": rows}
