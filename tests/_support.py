"""Small helpers shared by the conformance tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

import sqlalchemy as sa

import sqlqueue
from sqlqueue._schema import jobs
from sqlqueue.dialects import dialect_for

T = TypeVar("T")


#: How long :func:`drain` and :func:`bounded` let a call run: far beyond what the few jobs of a
#: test need on a loaded machine, far below pytest's 300 s timeout, so a build that never stops
#: finding work (a callback that enqueues itself again, a bulk action that takes the same rows
#: again) fails with a message saying what was left, instead of hanging until the timeout.
DEADLINE_SECONDS = 60.0


def drain(queue: sqlqueue.Queue, *, deadline: float = DEADLINE_SECONDS, **options: object) -> None:
    """Run a burst worker with a fast poll, in the calling thread, until no job is due and none
    runs; if it still finds work after ``deadline`` seconds, stop it and fail the test, naming
    the jobs still waiting."""
    options.setdefault("poll_interval", 0.02)
    worker = queue.worker(**options)  # type: ignore[arg-type]
    late = threading.Event()

    def stop() -> None:
        late.set()
        worker.stop()

    watchdog = threading.Timer(deadline, stop)
    watchdog.daemon = True
    watchdog.start()
    try:
        worker.run(burst=True)
    finally:
        watchdog.cancel()
    if late.is_set():
        raise AssertionError(
            f"a burst worker draining the queue still found work after {deadline:.0f} s; "
            f"jobs not finished: {_unfinished(queue)}"
        )


class DeadlineExceeded(AssertionError):
    """A call that :func:`bounded` ran was still running at its deadline."""


def bounded(what: str, call: Callable[[], T], deadline: float = DEADLINE_SECONDS) -> T:
    """``call()``'s result, run in a thread; fail the test (``DeadlineExceeded``, naming
    ``what``) if it has not returned after ``deadline`` seconds, instead of hanging."""
    outcome: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as error:
            outcome.append((False, error))

    thread = threading.Thread(target=run, name=f"bounded: {what}", daemon=True)
    thread.start()
    thread.join(deadline)
    if not outcome:
        raise DeadlineExceeded(f"{what} was still running after {deadline:.0f} s")
    ok, value = outcome[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


def _unfinished(queue: sqlqueue.Queue) -> str:
    """The jobs still queued, running or failed, briefly (for a deadline's message)."""
    waiting = [
        job
        for status in ("queued", "running", "failed")
        for job in queue.jobs(status=status, limit=20)
    ]
    shown = ", ".join(f"{job.id} {job.job_type} ({job.status})" for job in waiting[:20])
    return f"{len(waiting)}{'+' if len(waiting) >= 20 else ''}: {shown or 'none'}"


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
