"""``python -m bench.web``: the web page on a big table — does each page answer in under 200 ms
with 1,000,000 finished jobs?

Fills a fresh database as ``bench.operations`` does (``--rows`` finished jobs over the last
year, 10,000 of them dead with a few distinct errors, 10,000 queued; one INSERT … SELECT over a
generated series per kind, then VACUUM ANALYZE / ANALYZE), folds the finished counts once (as
every worker does at start), then times each page through the ASGI app in Starlette's test
client — queries and rendering, the same work uvicorn would do minus the socket: median and
max of 7 calls after a warm-up, in ms, against the 200 ms budget. The pages: the overview, the
job list filtered several ways (and its third page), a job's page, the Workers, Periodic and
Batches pages, and a bulk action's confirmation (which counts the jobs it would change).
``--plans`` prints PostgreSQL's plan of every statement of the overview and of any page over
budget. ``--before`` first times the overview as it read its top errors before migration 0017
(grouping every unhandled failure's row) against the rollup it reads now, call by call
interleaved on the same data, so a run shows before and after whatever the load.

Figures depend on the machine and its load; the budget is the issue's, not a ratio.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

import sqlqueue
from bench.databases import BACKENDS, DEFAULT_POSTGRES_URL, Target, fresh_database
from bench.operations import DEAD, QUEUED, Sizes, explain, fill, timed
from sqlqueue._schema import ERROR_GROUP, jobs
from sqlqueue._store import readmodel
from sqlqueue.web import create_app

with warnings.catch_warnings():  # Starlette would rather have httpx2; httpx still works
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

#: The issue's budget for the overview and a filtered list, per page, in ms.
BUDGET_MS = 200.0
OVERVIEW = "GET / (overview)"
_TOKEN = re.compile(r'name="csrf_token" value="([^"]+)"')


def pages(queue: sqlqueue.Queue) -> dict[str, Callable[[], object]]:
    """Each page as a call that fetches it and checks it answered 200."""
    client = TestClient(
        create_app(queue), base_url="http://localhost", headers={"Origin": "http://localhost"}
    )

    def get(path: str) -> Callable[[], object]:
        def call() -> object:
            answer = client.get(path)
            assert answer.status_code == 200, answer.text[:500]
            return answer

        return call

    token_match = _TOKEN.search(client.get("/jobs").text)
    assert token_match is not None
    token = token_match.group(1)

    def confirm() -> object:
        form = {"csrf_token": token, "action": "requeue", "scope": "matching", "error": "crm"}
        answer = client.post("/jobs/bulk", data=form)
        assert answer.status_code == 200, answer.text[:500]
        return answer

    third = queue.jobs(status="succeeded", limit=100)[-1].id
    some_job = queue.jobs(status="dead", limit=1)[0].id
    return {
        OVERVIEW: get("/"),
        "GET /jobs (no filter, newest)": get("/jobs"),
        "GET /jobs?status=dead&type=…&error=crm": get(
            "/jobs?status=dead&type=deliver_webhook&error=crm"
        ),
        "GET /jobs?type=build_report": get("/jobs?type=build_report"),
        "GET /jobs?queue=mail&status=queued": get("/jobs?queue=mail&status=queued"),
        "GET /jobs?status=succeeded, 3rd page": get(f"/jobs?status=succeeded&before_id={third}"),
        "GET /jobs?error=410 (any status)": get("/jobs?error=410"),
        "GET /jobs?status=dead&unhandled=1&since=1h": get("/jobs?status=dead&unhandled=1&since=1h"),
        "GET /jobs/{id} (a dead job)": get(f"/jobs/{some_job}"),
        "GET /workers": get("/workers"),
        "GET /periodic": get("/periodic"),
        "GET /batches": get("/batches"),
        "POST /jobs/bulk (confirm: count dead ~ crm)": confirm,
    }


def _top_errors_before(conn: sa.Connection, dialect: Any, *, limit: int) -> list[tuple[str, int]]:
    """The top errors as the overview read them before migration 0017: every unhandled failed
    or dead job's row, grouped by its first 200 characters."""
    error = ERROR_GROUP.label("error")
    count = sa.func.count().label("n")
    rows = conn.execute(
        sa.select(error, count)
        .select_from(jobs)
        .where(
            jobs.c.status.in_(("failed", "dead")),
            jobs.c.last_error.is_not(None),
            jobs.c.requeued_as.is_(None),
            jobs.c.discarded_at.is_(None),
        )
        .group_by(ERROR_GROUP)
        .order_by(count.desc(), error)
        .limit(limit)
    ).all()
    return [(str(row.error), int(row.n)) for row in rows]


#: What the stats read the top errors with (swapped for the old read by ``--before``).
_SWAPPED = "read_top_errors"


def _before_and_after(call: Callable[[], object], runs: int = 7) -> None:
    """Time the overview with the old top-errors read and with the rollup, interleaved (A B A B
    …, after a warm-up of each), and print the medians and their ratio."""
    after = getattr(readmodel, _SWAPPED)
    samples: dict[str, list[float]] = {"before": [], "after": []}
    try:
        for round_ in range(runs + 1):
            for label, read in (("before", _top_errors_before), ("after", after)):
                setattr(readmodel, _SWAPPED, read)
                started = time.perf_counter()
                call()
                if round_:  # the first round warms up
                    samples[label].append((time.perf_counter() - started) * 1000)
    finally:
        setattr(readmodel, _SWAPPED, after)
    medians = {label: statistics.median(values) for label, values in samples.items()}
    for label, values in samples.items():
        worst = max(values)
        print(f"{label:7}{OVERVIEW}  median {medians[label]:7.1f} ms   max {worst:7.1f} ms")
    print(f"        after/before: {medians['after'] / medians['before']:.2f}")


def _time_pages(calls: dict[str, Callable[[], object]], label: str) -> list[str]:
    """Time each page; print a line each; return the names over budget."""
    over = []
    for name, call in calls.items():
        median, worst = timed(call)
        verdict = "ok" if median < BUDGET_MS else "OVER"
        if median >= BUDGET_MS:
            over.append(name)
        print(f"{label}{name:48} median {median:7.1f} ms   max {worst:7.1f} ms   {verdict}")
    return over


def measure(
    backend: str, target: Target, sizes: Sizes, show_plans: bool, before: bool = False
) -> list[str]:
    """Fill a database, time every page; return the names of pages over budget. ``before``:
    first the overview's top errors read as before migration 0017, and as now, interleaved."""
    over: list[str] = []
    with fresh_database(backend, target) as url:
        queue = sqlqueue.Queue(url)

        @queue.periodic("*/5 * * * *", "build_report")
        def report() -> None:
            return None

        took = fill(queue.engine, backend, sizes)
        queue.admin.fold_all_counts()  # what each worker does at start, then every minute
        print(
            f"\n== {backend}: {sizes.finished:,} finished + {sizes.dead:,} dead + "
            f"{sizes.queued:,} queued (filled and analyzed in {took:.0f} s)"
        )
        calls = pages(queue)
        if before:
            print("-- the overview, before (every unhandled failure read) and after (the rollup)")
            _before_and_after(calls[OVERVIEW])
            print("-- every page, after")
        over = _time_pages(calls, "")
        if show_plans and backend == "postgresql":
            for name in dict.fromkeys([OVERVIEW, *over]):
                print(f"\n-- plans of {name}")
                for plan in explain(queue.engine, calls[name]):
                    print(plan, end="\n\n")
        queue.engine.dispose()
    return over


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.web", description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000, help="finished jobs (1,000,000)")
    parser.add_argument("--dead", type=int, default=DEAD, help=f"dead jobs among them ({DEAD:,})")
    parser.add_argument("--queued", type=int, default=QUEUED, help=f"queued due jobs ({QUEUED:,})")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES_URL)
    parser.add_argument("--plans", action="store_true", help="print plans of pages over budget")
    parser.add_argument(
        "--before",
        action="store_true",
        help="first time the overview with the top errors read as before 0017, interleaved",
    )
    args = parser.parse_args(argv)
    target = Target(postgres_url=args.postgres_url)
    started = time.perf_counter()
    over: list[str] = []
    for backend in args.backends.split(","):
        sizes = Sizes(args.rows, args.dead, args.queued)
        over += [
            f"{backend}: {name}"
            for name in measure(backend.strip(), target, sizes, args.plans, args.before)
        ]
    print(f"\n{len(over)} page(s) over {BUDGET_MS:.0f} ms ({time.perf_counter() - started:.0f} s)")
    for name in over:
        print(f"  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
