"""How long a workflow step more urgent than a worker's claim floor waits after that worker
completed its last upstream (PostgreSQL: the backend with claim floors).

Each sample is one workflow, ``gate`` (priority 5) then ``urgent`` (priority 0), run by one
in-process worker: ``gate``'s claim sets the worker's floor at priority 5, and ``urgent`` is
released below it. The wait is from the end of ``gate``'s handler to the start of
``urgent``'s, on this process's monotonic clock. Run it as a file (so that the ``sqlqueue``
imported is the one installed in the interpreter's environment, for A/B runs)::

    python bench/released_step_wait.py --samples 12
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import threading
import time

import sqlalchemy as sa

import sqlqueue

DEFAULT_URL = os.environ.get(
    "SQLQUEUE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def measure(engine: sa.Engine, samples: int) -> list[float]:
    """The waits of ``samples`` released steps, in seconds."""
    queue = sqlqueue.Queue(engine)
    ended: dict[int, float] = {}
    started: dict[int, float] = {}

    @queue.task("gate")
    def gate(n: int) -> None:
        ended[n] = time.monotonic()

    @queue.task("urgent")
    def urgent(n: int) -> None:
        started[n] = time.monotonic()

    worker = queue.worker(concurrency=1, poll_interval=1.0)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        for n in range(samples):
            wf = sqlqueue.Workflow()
            wf.add("gate", sqlqueue.JobRequest(job_type="gate", payload={"n": n}, priority=5))
            wf.add(
                "urgent",
                sqlqueue.JobRequest(job_type="urgent", payload={"n": n}, priority=0),
                after=["gate"],
            )
            with engine.begin() as conn:
                queue.enqueue_workflow(conn, wf)
            deadline = time.monotonic() + 60
            while n not in started:  # a measurement, not a test: polling is the point
                if time.monotonic() > deadline:
                    raise RuntimeError(f"sample {n}: the urgent step did not run in 60 s")
                time.sleep(0.005)
    finally:
        worker.stop()
        thread.join(30)
    return [started[n] - ended[n] for n in range(samples)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--postgres-url", default=DEFAULT_URL)
    parser.add_argument("--samples", type=int, default=12)
    args = parser.parse_args()
    url = sa.make_url(args.postgres_url)
    name = f"sqlqueue_release_wait_{secrets.token_hex(4)}"
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    engine = sa.create_engine(url.set(database=name))
    try:
        sqlqueue.migrate(engine)
        waits = measure(engine, args.samples)
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()
    ms = sorted(wait * 1000 for wait in waits)
    print(
        f"samples {len(ms)}: median {statistics.median(ms):.1f} ms, "
        f"max {ms[-1]:.1f} ms, min {ms[0]:.1f} ms"
    )
    print("each (ms):", ", ".join(f"{value:.0f}" for value in ms))


if __name__ == "__main__":
    main()
