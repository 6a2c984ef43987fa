"""Small helpers shared by the conformance tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime

import sqlalchemy as sa

import sqlqueue
from sqlqueue._schema import jobs
from sqlqueue.dialects import dialect_for


def drain(queue: sqlqueue.Queue, **options: object) -> None:
    """Run a burst worker with a fast poll until no job is due and none runs."""
    options.setdefault("poll_interval", 0.02)
    queue.worker(**options).run(burst=True)  # type: ignore[arg-type]


def db_now(engine: sa.Engine) -> datetime:
    """The database clock, the same expression sqlqueue uses."""
    with engine.connect() as conn:
        value = conn.execute(sa.select(dialect_for(engine).clock())).scalar_one()
    assert isinstance(value, datetime)
    return value


def count_jobs(engine: sa.Engine, **where: object) -> int:
    """How many job rows match ``column=value`` filters."""
    query = sa.select(sa.func.count()).select_from(jobs)
    for column, value in where.items():
        query = query.where(jobs.c[column] == value)
    with engine.connect() as conn:
        return int(conn.execute(query).scalar_one())


def wait_until(condition: Callable[[], bool], timeout: float = 10.0, step: float = 0.02) -> None:
    """Poll ``condition`` until it holds, failing the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(step)


class WorkerThread:
    """A worker serving in a background thread; ``stop()`` shuts it down gracefully."""

    def __init__(self, worker: sqlqueue.Worker) -> None:
        self.worker = worker
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.worker.run()
        except BaseException as error:
            self.error = error

    def __enter__(self) -> WorkerThread:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self, timeout: float = 30.0) -> None:
        self.worker.stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "worker did not stop"
        if self.error is not None:
            raise self.error
