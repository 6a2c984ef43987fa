"""A worker process with healthy jobs beside every kind of poison outcome, on each backend:
every healthy job succeeds, each poisoned job ends ``dead`` with an error a person can read,
none is left ``running``, and a job enqueued afterwards still runs.

The poisons are the values a handler can hand back that no database stores as given
(``tests/apps/poison_app.py``), plus an outcome the database itself refuses (a constraint:
``tests/_support/refusals.py``). Before, one of them made the worker retry its outcome write
for ever, and every other job it held stayed ``running``.
"""

from __future__ import annotations

from collections import Counter

import pytest
import sqlalchemy as sa

import sqlqueue
from sqlqueue._schema import jobs
from tests._support.refusals import refusing_outcomes
from tests.apps.poisons import POISONS
from tests.apps.processes import Workers, wait_until
from tests.conftest import Backend

pytestmark = pytest.mark.timeout(240)

APP = "tests.apps.poison_app:queue"
HEALTHY = 40

#: What each poisoned job's ``last_error`` starts with.
SAYS = {
    "poison.retry_inf": "ConfigurationError: Retry.delay must be a finite number of seconds",
    "poison.retry_nan": "ConfigurationError: Retry.delay must be >= 0 seconds, got nan",
    "poison.retry_past_9999": "ConfigurationError: Retry.delay=1e+20 seconds puts the job after",
    "poison.snooze_past_9999": "ConfigurationError: Snooze.delay=1000000000000000.0 seconds",
    "poison.nul_in_error": "ValueError: a NUL \\x00 in the message",
    "poison.unprintable_error": "Unprintable: <unprintable Unprintable>",
    "poison.nul_in_result": "ResultError: the handler's return value cannot be stored: result",
    "poison.huge_result": "ResultError: the handler's return value cannot be stored: the result",
    "poison.refused_failure": "the outcome could not be stored (a failure: ValueError): ",
    "poison.refused_success": "the handler succeeded, but its outcome could not be stored: ",
}


def _producer(backend: Backend) -> sqlqueue.Queue:
    """The app's tasks in this process, to enqueue them."""
    queue = backend.queue()
    queue.task("healthy")(lambda n: None)
    for name in POISONS:  # one attempt, as the worker's app declares (stored at enqueue)
        queue.task(name, max_attempts=1)(lambda: None)
    return queue


def _rows(engine: sa.Engine) -> dict[int, sa.RowMapping]:
    with engine.connect() as conn:
        query = sa.select(jobs.c.id, jobs.c.job_type, jobs.c.status, jobs.c.last_error)
        return {row["id"]: row for row in conn.execute(query).mappings()}


def test_poison_outcomes_end_dead_with_a_readable_error_and_the_worker_goes_on(
    backend: Backend, workers: Workers
) -> None:
    assert set(SAYS) == set(POISONS)
    producer = _producer(backend)
    with refusing_outcomes(backend.engine):
        with backend.engine.begin() as conn:
            poisoned = {producer.enqueue(conn, name): name for name in POISONS}
            healthy = [producer.enqueue(conn, "healthy", {"n": n}) for n in range(HEALTHY)]
        worker = workers.start("--concurrency", "4", "--poll-interval", "0.1", app=APP)
        worker.wait_ready()

        def settled() -> bool:
            rows = _rows(backend.engine)
            return all(rows[job_id]["status"] in ("succeeded", "dead") for job_id in rows)

        wait_until(settled, timeout=120, what="every job to end", explain=worker.describe)
        rows = _rows(backend.engine)
        assert Counter(rows[job_id]["status"] for job_id in healthy) == {"succeeded": HEALTHY}
        ends = {name: (rows[job_id]["status"], rows[job_id]["last_error"]) for job_id, name
                in poisoned.items()}  # fmt: skip
        wrong = {
            name: end
            for name, end in ends.items()
            if end[0] != "dead" or not (end[1] or "").startswith(SAYS[name])
        }
        assert wrong == {}, worker.describe()

        # The worker goes on: a job enqueued now runs.
        with backend.engine.begin() as conn:
            later = producer.enqueue(conn, "healthy", {"n": HEALTHY})
        wait_until(
            lambda: _rows(backend.engine)[later]["status"] == "succeeded",
            timeout=60,
            what="a job enqueued afterwards",
            explain=worker.describe,
        )
        assert worker.stop() == 0, worker.describe()
