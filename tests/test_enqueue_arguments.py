"""A payload that does not bind to its handler is refused at enqueue, before any SQL, on every
enqueue path; jobs for handlers elsewhere (``external=True``) are not checked."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

import sqlqueue
from tests._support import count_jobs


def _queue(backend):
    queue = backend.queue()

    @queue.task("resize")
    def resize(image_id: int, width: int = 100) -> None:
        pass

    @queue.task("log")
    def log(ctx: sqlqueue.JobContext, event: str, **fields: Any) -> None:
        pass

    return queue, resize, log


@contextmanager
def _no_statements(engine: sa.Engine) -> Iterator[list[str]]:
    """Every SQL statement ``engine`` sends meanwhile (the test expects none)."""
    sent: list[str] = []

    def record(conn, cursor, statement, *rest) -> None:
        sent.append(statement)

    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)


FITS = {"resize": {"image_id": 1}, "log": {"event": "ok"}}

MISFITS = [
    pytest.param(
        "resize",
        {"image_id": 7, "wrong": 1},
        "unexpected keyword argument 'wrong'",
        id="unknown-keyword",
    ),
    pytest.param(
        "resize", {"width": 10}, "missing a required argument: 'image_id'", id="missing-argument"
    ),
    pytest.param(
        "log", {"fields": 1}, "missing a required argument: 'event'", id="missing-with-kwargs"
    ),
    pytest.param(
        "log", {"event": "x", "ctx": 1}, "'ctx' is the handler's JobContext", id="context-as-field"
    ),
]


@pytest.mark.parametrize(("job_type", "payload", "message"), MISFITS)
def test_a_payload_that_does_not_fit_is_refused_before_any_sql(backend, job_type, payload, message):
    queue, resize, _ = _queue(backend)
    task = queue.tasks[job_type]
    with backend.engine.connect() as conn, conn.begin():
        conn.execute(sa.text("SELECT 1"))  # the transaction is open: what follows is enqueue's
        with _no_statements(backend.engine) as sent:
            for enqueue in (
                lambda: task.enqueue(conn, **payload),
                lambda: task.options(priority=3, delay=5).enqueue(conn, **payload),
                lambda: queue.enqueue(conn, job_type, payload),
                lambda: task.enqueue_many(conn, [FITS[job_type], payload]),
                lambda: queue.enqueue_many(
                    conn, [sqlqueue.JobRequest(job_type=job_type, payload=payload)]
                ),
                lambda: queue.enqueue_batch(
                    conn, [sqlqueue.JobRequest(job_type=job_type, payload=payload)]
                ),
                lambda: queue.enqueue_batch(
                    conn,
                    [sqlqueue.JobRequest(job_type="resize", payload={"image_id": 1})],
                    on_complete=sqlqueue.JobRequest(job_type=job_type, payload=payload),
                ),
            ):
                with pytest.raises(sqlqueue.PayloadError, match=message) as raised:
                    enqueue()
                assert isinstance(raised.value, sqlqueue.EnqueueError)
                assert f"does not fit {job_type}(" in str(raised.value)
        assert sent == []
        # Nothing was sent: the same transaction still works and commits.
        good = resize.enqueue(conn, image_id=1)
    assert count_jobs(backend.engine) == 1
    assert queue.get_job(good).payload == {"image_id": 1}


def test_payloads_that_fit_are_written(backend):
    queue, resize, log = _queue(backend)
    with backend.engine.begin() as conn:
        ids = [
            resize.enqueue(conn, image_id=1),
            resize.enqueue(conn, image_id=1, width=5),
            log.enqueue(conn, event="signup", user_id=3, plan="pro"),  # **fields takes any
            queue.enqueue(conn, "log", {"event": "x"}),
        ]
    assert [queue.get_job(i).status for i in ids] == ["queued"] * 4


def test_external_jobs_and_types_without_a_local_task_are_not_checked(backend):
    queue, _, _ = _queue(backend)
    with backend.engine.begin() as conn:
        other = queue.enqueue(conn, "billing.charge", {"anything": 1}, external=True)
        mine_elsewhere = queue.enqueue(conn, "resize", {"v2_field": 1}, external=True)
        many = queue.enqueue_many(
            conn, [sqlqueue.JobRequest(job_type="resize", payload={"x": 1}, external=True)]
        )
    assert queue.get_job(other).payload == {"anything": 1}
    assert queue.get_job(mine_elsewhere).payload == {"v2_field": 1}
    assert queue.get_job(many[0]).payload == {"x": 1}


def test_async_enqueue_checks_the_payload_too(backend):
    queue, resize, _ = _queue(backend)
    async_engine = create_async_engine(queue.dialect.async_url(backend.engine.url))

    async def scene() -> None:
        try:
            async with async_engine.begin() as conn:
                with pytest.raises(sqlqueue.PayloadError, match="unexpected keyword"):
                    await resize.enqueue_async(conn, image_id=1, wrong=2)
                with pytest.raises(sqlqueue.PayloadError, match="missing a required"):
                    await queue.enqueue_many_async(
                        conn, [sqlqueue.JobRequest(job_type="resize", payload={})]
                    )
                with pytest.raises(sqlqueue.PayloadError, match="missing a required"):
                    await queue.enqueue_batch_async(
                        conn, [sqlqueue.JobRequest(job_type="resize", payload={})]
                    )
                await resize.enqueue_async(conn, image_id=2)
        finally:
            await async_engine.dispose()

    asyncio.run(scene())
    assert [job.payload for job in queue.jobs()] == [{"image_id": 2}]
