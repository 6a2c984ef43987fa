"""Where a backend emulates ``RETURNING`` (MariaDB/MySQL), the paths MySQL 8 takes too.

MariaDB has ``INSERT … RETURNING`` and ``DELETE … RETURNING``, MySQL 8 neither: with
SQLAlchemy told the server lacks them (as it is for MySQL), the same server runs the
row-by-row inserts read back by id and the read-then-delete, and every caller still gets what
``RETURNING`` would have given it.
"""

from __future__ import annotations

import pytest

import sqlqueue
from sqlqueue.dialects import dialect_for
from tests._support import drain
from tests.conftest import Backend


@pytest.fixture
def without_native_returning(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> Backend:
    """``backend`` with SQLAlchemy believing the server has no INSERT or DELETE RETURNING."""
    if not dialect_for(backend.engine).emulates_returning:
        pytest.skip(f"{backend.name} runs RETURNING natively")
    monkeypatch.setattr(backend.engine.dialect, "insert_returning", False)
    monkeypatch.setattr(backend.engine.dialect, "delete_returning", False)
    return backend


def test_enqueue_without_insert_returning_gives_each_row_its_id(
    without_native_returning: Backend,
) -> None:
    backend = without_native_returning
    queue = backend.queue()
    queue.task("noop")(lambda n=0: None)
    requests = [
        sqlqueue.JobRequest(job_type="noop", payload={"n": n}, idempotency_key=key)
        for n, key in enumerate([None, "a", None, "b", "a"])
    ]
    with backend.engine.begin() as conn:
        first = queue.enqueue(conn, "noop", {"n": -1}, idempotency_key="b")
        ids = queue.enqueue_many(conn, requests)
        again = queue.enqueue(conn, "noop", {"n": -2}, idempotency_key="a")
    assert ids[3] == first, "a known key returns the existing job"
    assert ids[4] == ids[1] == again, "a key repeated in the batch gets its first row's id"
    assert len(set(ids)) == 4
    for request, job_id in zip(requests[:4], ids[:4], strict=True):
        job = queue.get_job(job_id)
        assert job is not None
        if request.idempotency_key != "b":
            assert job.payload == request.payload


def test_requeue_and_prune_without_insert_or_delete_returning(
    without_native_returning: Backend,
) -> None:
    backend = without_native_returning
    queue = backend.queue()

    @queue.task("boom", max_attempts=1)
    def boom(n: int = 0) -> None:
        raise ConnectionError("boom")

    with backend.engine.begin() as conn:
        requests = [sqlqueue.JobRequest(job_type="boom", payload={"n": n}) for n in range(3)]
        dead = queue.enqueue_many(conn, requests)
    drain(queue)
    new = queue.requeue_where(job_type="boom", by="ops", reason="retry")
    assert len(new) == 3
    for dead_id in dead:
        job = queue.get_job(dead_id)
        assert job is not None
        assert job.requeued_as in new
        assert queue.get_job(job.requeued_as).requeued_from == dead_id  # type: ignore[union-attr]
    assert queue.prune(older_than=0, statuses=["dead"]) == 3
    assert all(queue.get_job(job_id) is None for job_id in dead)
    assert queue.stats().by_status["dead"] == 0
