"""``python -m bench.workflow_list``: the web page's Workflows list and workflow pages on a big
database — do they stay fast, and does the list read no workflow's steps?

Fills a fresh database with ``--rows`` finished plain jobs (as ``bench.operations`` does),
``--workflows`` diamond workflows (charge → receipt, notify → complete; all finished but the
newest ``--held``, which a dead ``notify`` holds up), one ``--big``-step workflow (a root and
every other step after it, running), and then ``--batches`` plain batches, newer than every
workflow (the list must pass over them). Then times, through the ASGI app in Starlette's test
client, the list, its second page, a held-up workflow's page, the big workflow's first and last
page of steps and a step's job page: median and max of 7 calls after a warm-up, in ms.
``--plans`` prints PostgreSQL's EXPLAIN ANALYZE of the list's statements.

Figures depend on the machine and its load: read them beside each other, not as absolutes.
"""

from __future__ import annotations

import argparse
import time
import warnings
from collections.abc import Callable
from datetime import UTC, datetime

import sqlalchemy as sa

import sqlqueue
from bench.databases import BACKENDS, DEFAULT_POSTGRES_URL, Target, fresh_database
from bench.operations import Sizes, explain, fill, timed
from sqlqueue._schema import batches, jobs, workflow_steps
from sqlqueue.web import create_app

with warnings.catch_warnings():  # Starlette would rather have httpx2; httpx still works
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient


def _diamond(order: int) -> sqlqueue.Workflow:
    wf = sqlqueue.Workflow()
    wf.add(
        "charge",
        sqlqueue.JobRequest(job_type="billing.charge", payload={"order": order}, external=True),
    )
    for name in ("receipt", "notify"):
        request = sqlqueue.JobRequest(
            job_type=f"orders.{name}", payload={"order": order}, external=True
        )
        wf.add(name, request, after=["charge"])
    complete = sqlqueue.JobRequest(
        job_type="orders.complete", payload={"order": order}, external=True
    )
    wf.add("complete", complete, after=["receipt", "notify"])
    return wf


def _fan_out(steps: int) -> sqlqueue.Workflow:
    wf = sqlqueue.Workflow()
    wf.add("root", sqlqueue.JobRequest(job_type="orders.root", payload={}, external=True))
    for n in range(1, steps):
        request = sqlqueue.JobRequest(job_type="orders.part", payload={"n": n}, external=True)
        wf.add(f"part-{n}", request, after=["root"])
    return wf


def populate(
    queue: sqlqueue.Queue, *, workflows: int, held: int, big: int, plain: int
) -> dict[str, int]:
    """The workflows and batches; returns ids the pages are timed on."""
    engine = queue.engine
    with engine.begin() as conn:
        ids = [queue.enqueue_workflow(conn, _diamond(n)).id for n in range(workflows)]
    big_handle = queue.enqueue_workflow(engine, _fan_out(big))
    now = datetime.now(UTC)
    finished, stuck = ids[: workflows - held], ids[workflows - held :]
    with engine.begin() as conn:
        for chunk in (finished[i : i + 1000] for i in range(0, len(finished), 1000)):
            conn.execute(
                sa.update(jobs)
                .where(jobs.c.batch_id.in_(chunk))
                .values(status="succeeded", finished_at=now, updated_at=now)
            )
            conn.execute(
                sa.update(batches)
                .where(batches.c.id.in_(chunk))
                .values(succeeded=batches.c.total, finished_at=now)
            )
        for names, status in ((("charge", "receipt"), "succeeded"), (("notify",), "dead")):
            step_jobs = sa.select(workflow_steps.c.job_id).where(
                workflow_steps.c.workflow_id.in_(stuck), workflow_steps.c.name.in_(names)
            )
            conn.execute(
                sa.update(jobs)
                .where(jobs.c.id.in_(step_jobs))
                .values(status=status, finished_at=now, updated_at=now)
            )
        conn.execute(sa.update(batches).where(batches.c.id.in_(stuck)).values(succeeded=2, dead=1))
        rows = [
            {
                "total": 1,
                "succeeded": 1,
                "dead": 0,
                "cancelled": 0,
                "created_at": now,
                "finished_at": now,
            }
            for _ in range(plain)
        ]
        for start in range(0, len(rows), 5000):
            conn.execute(sa.insert(batches), rows[start : start + 5000])
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM ANALYZE")
    else:
        with engine.connect() as conn:
            conn.exec_driver_sql(
                "ANALYZE"
                if engine.dialect.name == "sqlite"
                else "ANALYZE TABLE sqlqueue_jobs, sqlqueue_batches, "
                "sqlqueue_workflow_steps, sqlqueue_workflow_edges"
            )
    return {
        "held": stuck[-1],
        "big": big_handle.id,
        "second_page": stuck[-1] - 49,
        "step_job": big_handle.job_ids["part-5"],
        "big_steps": big,
    }


def pages(queue: sqlqueue.Queue, ids: dict[str, int]) -> dict[str, Callable[[], object]]:
    """Each page as a call that fetches it and checks it answered 200."""
    client = TestClient(create_app(queue), base_url="http://localhost")

    def get(path: str) -> Callable[[], object]:
        def call() -> object:
            answer = client.get(path)
            assert answer.status_code == 200, answer.text[:500]
            return answer

        return call

    last = (ids["big_steps"] - 1) // 200 * 200
    return {
        "GET /workflows": get("/workflows"),
        "GET /workflows?before_id=… (2nd page)": get(f"/workflows?before_id={ids['second_page']}"),
        "GET /workflows/{held} (4 steps, drawn)": get(f"/workflows/{ids['held']}"),
        f"GET /workflows/{{big}} ({ids['big_steps']:,} steps)": get(f"/workflows/{ids['big']}"),
        "GET /workflows/{big}?start=… (last page)": get(f"/workflows/{ids['big']}?start={last}"),
        "GET /jobs/{id} (a step of the big one)": get(f"/jobs/{ids['step_job']}"),
    }


def _with_and_without_the_index(queue: sqlqueue.Queue, ids: dict[str, int]) -> None:
    """The list's two pages without migration 0017's index and with it, three times in turn
    (A B A B A B) on the same data: medians in ms."""
    index = next(i for i in batches.indexes if i.name == "ix_sqlqueue_batches_workflows")
    calls = pages(queue, ids)
    wanted = ["GET /workflows", "GET /workflows?before_id=… (2nd page)"]
    figures: dict[str, list[float]] = {}
    for _ in range(3):
        for label, present in (("without 0017's index", False), ("with it", True)):
            with queue.engine.begin() as conn:
                if present:
                    index.create(conn)
                else:
                    index.drop(conn)
            for name in wanted:
                figures.setdefault(f"{name}, {label}", []).append(timed(calls[name])[0])
    for name, medians in figures.items():
        shown = " ".join(f"{median:6.1f}" for median in medians)
        print(f"  {name:64} medians {shown} ms")


def measure(backend: str, target: Target, args: argparse.Namespace) -> None:
    with fresh_database(backend, target) as url:
        queue = sqlqueue.Queue(url)
        started = time.perf_counter()
        if args.rows:
            fill(
                queue.engine, backend, Sizes(finished=args.rows, dead=args.rows // 100, queued=1000)
            )
        ids = populate(
            queue, workflows=args.workflows, held=args.held, big=args.big, plain=args.batches
        )
        print(
            f"\n== {backend}: {args.rows:,} plain jobs, {args.workflows:,} workflows "
            f"({args.held} held up), one of {args.big:,} steps, {args.batches:,} newer plain "
            f"batches (filled in {time.perf_counter() - started:.0f} s)"
        )
        for name, call in pages(queue, ids).items():
            median, worst = timed(call)
            print(f"  {name:48} median {median:7.1f} ms   max {worst:7.1f} ms")
        if backend != "mysql":
            _with_and_without_the_index(queue, ids)
        if args.plans and backend == "postgresql":
            for plan in explain(queue.engine, lambda: queue.workflows()):
                print("\n" + plan)
        queue.engine.dispose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.workflow_list", description=__doc__)
    parser.add_argument("--backends", default="postgresql")
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES_URL)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--workflows", type=int, default=3_000)
    parser.add_argument("--held", type=int, default=100)
    parser.add_argument("--big", type=int, default=10_000)
    parser.add_argument("--batches", type=int, default=20_000)
    parser.add_argument("--plans", action="store_true")
    args = parser.parse_args(argv)
    backends = [name for name in args.backends.split(",") if name]
    unknown = [name for name in backends if name not in BACKENDS]
    if unknown:
        parser.error(f"unknown backend(s) {unknown}; choose from {', '.join(BACKENDS)}")
    if args.held > args.workflows or args.held < 50:
        parser.error("--held must be between 50 and --workflows")
    target = Target(postgres_url=args.postgres_url)
    for backend in backends:
        measure(backend, target, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
