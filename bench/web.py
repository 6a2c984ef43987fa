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
``--plans`` prints PostgreSQL's plan of every statement of a page over budget. ``--before``
first times the pages without the indexes of migration 0013 (dropped, then made again), so a
run shows before and after on the same data.

Figures depend on the machine and its load; the budget is the issue's, not a ratio.
"""

from __future__ import annotations

import argparse
import re
import time
import warnings
from collections.abc import Callable

import sqlalchemy as sa

import sqlqueue
from bench.databases import BACKENDS, DEFAULT_POSTGRES_URL, Target, fresh_database
from bench.operations import DEAD, QUEUED, Sizes, explain, fill, timed
from sqlqueue._schema import jobs
from sqlqueue.web import create_app

with warnings.catch_warnings():  # Starlette would rather have httpx2; httpx still works
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

#: The issue's budget for the overview and a filtered list, per page, in ms.
BUDGET_MS = 200.0
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
        "GET / (overview)": get("/"),
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


#: The indexes migration 0013 adds for the web page (those that exist on a backend).
WEB_SPEED_INDEXES = ("ix_sqlqueue_jobs_unhandled_errors",)


def _web_speed_indexes(engine: sa.Engine) -> list[sa.Index]:
    if engine.dialect.name == "sqlite":  # SQLAlchemy does not reflect expression indexes there
        with engine.connect() as conn:
            found = conn.exec_driver_sql("SELECT name FROM sqlite_master WHERE type = 'index'")
            names = {str(name) for (name,) in found}
    else:
        names = {str(index["name"]) for index in sa.inspect(engine).get_indexes("sqlqueue_jobs")}
    return [
        index for index in jobs.indexes if index.name in WEB_SPEED_INDEXES and index.name in names
    ]


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
    first without migration 0013's indexes."""
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
            dropped = _web_speed_indexes(queue.engine)
            with queue.engine.begin() as conn:
                for index in dropped:
                    index.drop(conn)
            names = ", ".join(index.name or "" for index in dropped) or "none on this backend"
            print(f"-- before: without migration 0013's indexes ({names})")
            _time_pages(calls, "before ")
            with queue.engine.begin() as conn:
                for index in dropped:
                    index.create(conn)
                if backend == "sqlite":
                    conn.exec_driver_sql("ANALYZE")
            print("-- after: with them")
        over = _time_pages(calls, "after  " if before else "")
        if show_plans and backend == "postgresql":
            for name in over:
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
        "--before", action="store_true", help="first time the pages without 0013's indexes"
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
