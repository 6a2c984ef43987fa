"""Enqueue-side input a database cannot store is refused before the first statement, with a typed
error, and the caller's transaction stays usable (issue 44, item 4).

Before: a workflow step name with a lone surrogate sent four statements and then raised a bare
``UnicodeEncodeError`` (a caller who caught it and committed committed a batch, two jobs and a
step: the second job waited for ever); an integer of over 4,300 digits raised a bare
``ValueError``; ``Unique.by`` values nested 100,000 deep a ``RecursionError``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

import sqlqueue
from tests._support import count_jobs
from tests._support.statements import statements
from tests.conftest import Backend


def _deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels):
        value = {"x": value}
    return value


DEEP = _deep(100_000)
HUGE = 10**5000


def _queue(backend: Backend) -> sqlqueue.Queue:
    queue = backend.queue()
    queue.task("plain")(lambda **payload: None)
    queue.task("unique_deep", unique=sqlqueue.Unique(by=lambda payload: DEEP))(lambda: None)
    queue.task("unique_huge", unique=sqlqueue.Unique(by=lambda payload: HUGE))(lambda: None)
    return queue


def _workflow_with_a_surrogate(queue: sqlqueue.Queue, conn: sa.Connection) -> Any:
    workflow = sqlqueue.Workflow()
    first = workflow.add("first", sqlqueue.JobRequest(job_type="plain"))
    workflow.add("then\ud800", sqlqueue.JobRequest(job_type="plain"), after=[first])
    return queue.enqueue_workflow(conn, workflow)


REFUSED: dict[str, tuple[Callable[[sqlqueue.Queue, sa.Connection], Any], type, str]] = {
    "a huge integer in the payload": (
        lambda queue, conn: queue.enqueue(conn, "plain", {"n": HUGE}),
        sqlqueue.PayloadError,
        "payload['n'] is an integer of over 4,300 digits",
    ),
    "a huge integer deep in a list": (
        lambda queue, conn: queue.enqueue(conn, "plain", {"n": [1, {"m": -HUGE}]}),
        sqlqueue.PayloadError,
        "payload['n'][1]['m'] is an integer of over 4,300 digits",
    ),
    "Unique.by values nested 100,000 deep": (
        lambda queue, conn: queue.enqueue(conn, "unique_deep"),
        sqlqueue.PayloadError,
        "they are nested more than 32 levels deep",
    ),
    "a huge integer in Unique.by values": (
        lambda queue, conn: queue.enqueue(conn, "unique_huge"),
        sqlqueue.PayloadError,
        "the unique key values of 'unique_huge' must be JSON (str, numbers, lists, dicts): "
        "an integer has over 4,300 digits",
    ),
    "a job type with a lone surrogate": (
        lambda queue, conn: queue.enqueue(conn, "plain\ud800", {}),
        sqlqueue.EnqueueError,
        "job_type is not valid Unicode: a lone surrogate",
    ),
    "a tag with a lone surrogate": (
        lambda queue, conn: queue.enqueue(conn, "plain", {}, tags=["ok", "t\ud800"]),
        sqlqueue.EnqueueError,
        "tags[1] is not valid Unicode: a lone surrogate",
    ),
    "a NUL character in a payload string": (
        lambda queue, conn: queue.enqueue(conn, "plain", {"x": "a\x00b"}),
        sqlqueue.PayloadError,
        "payload['x'] contains a NUL character",
    ),
    "an infinite delay": (
        lambda queue, conn: queue.enqueue(conn, "plain", {}, delay=float("inf")),
        sqlqueue.EnqueueError,
        "delay must be a finite number of seconds",
    ),
    "a priority beyond its column": (
        lambda queue, conn: queue.enqueue(conn, "plain", {}, priority=2**70),
        sqlqueue.EnqueueError,
        "priority must be between",
    ),
    "the second request of an enqueue_many": (
        lambda queue, conn: queue.enqueue_many(
            conn,
            [
                sqlqueue.JobRequest(job_type="plain"),
                sqlqueue.JobRequest(job_type="plain", payload={"x": "a\ud800"}),
            ],
        ),
        sqlqueue.PayloadError,
        "is not valid Unicode text",
    ),
    "a workflow step named with a lone surrogate": (
        _workflow_with_a_surrogate,
        sqlqueue.WorkflowError,
        "is not valid Unicode: a lone surrogate at position 4",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_before_any_statement_and_the_transaction_stays_usable(
    backend: Backend, case: str
) -> None:
    enqueue, error, says = REFUSED[case]
    queue = _queue(backend)
    with backend.engine.connect() as conn:
        conn.begin()
        conn.execute(sa.text("SELECT 1"))  # the caller's transaction is open
        with statements(backend.engine) as sent, pytest.raises(error) as raised:
            enqueue(queue, conn)
        assert says in str(raised.value)
        assert sent.sql == []
        # What the caller does next in the same transaction works, and commits nothing of ours.
        queue.enqueue(conn, "plain", {"n": 1})
        conn.commit()
    assert count_jobs(backend.engine) == 1
